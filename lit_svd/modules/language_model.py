"""A small GPT-2 or GPT-NeoX-style causal LM trained from scratch (random init, no pretrained weights).

``python -m lit_svd fit --config configs/sad/train_tiny_lm.yaml`` trains one on WikiText-2 with the
``SADCallback`` tracking every head's SAD sparsity against its rotated control as it learns. The model
is a plain Hugging Face causal LM, so ``self.view`` (``lit_svd.models.view``) reads its weights live.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat
from torch import Tensor

from lit_svd.analysis.language_model_options import (
    Arch,
    Part,
    check_fine_tune_options,
    check_language_model_options,
)
from lit_svd.choices import SITES
from lit_svd.modules.pretrained import PretrainedLMModule
from lit_svd.option_checks import check_indices


def top_k_id_map(loader, full_vocab: int, k: int) -> Tensor:
    """``[full_vocab]`` map: the ``k`` most frequent ids of ``loader``'s real tokens to ``0..k-1`` (by
    frequency, ties by id), every other id (rarer or unseen) to one bucket, the id after them."""
    counts = torch.zeros(full_vocab, dtype=torch.long)
    for batch in loader:
        ids = batch if isinstance(batch, Tensor) else batch["input_ids"]
        mask = torch.ones_like(ids) if isinstance(batch, Tensor) else batch.get("attention_mask", torch.ones_like(ids))
        counts += torch.bincount(ids[mask.bool()], minlength=full_vocab)
    seen = int((counts > 0).sum())
    order = torch.sort(counts, descending=True, stable=True).indices[: min(k, seen)]
    id_map = torch.full((full_vocab,), len(order), dtype=torch.long)
    id_map[order] = torch.arange(len(order))
    return id_map


class LanguageModelModule(pl.LightningModule):
    """Train a small causal LM from a config.

    Args:
        arch: "gpt2" (learned positions, LayerNorm) or "gpt_neox" (rotary on ``rotary_pct`` of each head).
        n_layers: transformer blocks.
        d_model: residual width (divisible by ``n_heads``).
        n_heads: attention heads per layer.
        d_mlp: MLP width (null: 4 * d_model).
        max_positions: the longest sequence the model accepts.
        rotary_pct: gpt_neox only: the fraction of each head's dimensions that is rotated.
        vocab_size: give it to use token ids as they are; null (default): built from the datamodule, see
            ``vocab_top_k``.
        vocab_top_k: with ``vocab_size`` null, the model's vocabulary is the ``vocab_top_k`` most frequent
            training tokens plus one bucket for all others (ids are mapped by ``map_ids``; the output layer
            over SmolLM2's 49,152 ids would cost ~7x the rest of a 2-layer model's step); null: all of
            ``len(datamodule.tokenizer)``.
        lr: AdamW learning rate (after a linear warm-up, constant).
        weight_decay: AdamW weight decay.
        warmup_steps: steps of the linear warm-up.
        seed: initialisation seed.
    """

    # the options judged before anything is built (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.language_model_options:check_language_model_options"

    def __init__(
        self,
        arch: Arch = "gpt2",
        n_layers: int = 2,
        d_model: int = 128,
        n_heads: int = 4,
        d_mlp: int | None = None,
        max_positions: int = 256,
        vocab_size: int | None = None,
        vocab_top_k: int | None = 4096,
        rotary_pct: float = 0.25,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.01,
        warmup_steps: int = 100,
        seed: int = 0,
    ):
        super().__init__()
        check_language_model_options(
            arch,
            n_layers,
            d_model,
            n_heads,
            max_positions,
            vocab_size,
            vocab_top_k,
            rotary_pct,
            lr,
            weight_decay,
            warmup_steps,
        )
        self.save_hyperparameters()
        self.lm = None
        self._view = None
        self.id_map: Tensor | None = None  # full token id -> model id, when the vocabulary is compacted
        if vocab_size is not None:
            self._build(vocab_size)

    def _build(self, vocab_size: int) -> None:
        from lit_svd.models.tiny import scratch_causal_lm, scratch_config

        hp = self.hparams
        d_mlp = hp.d_mlp or 4 * hp.d_model
        config = scratch_config(hp.arch, vocab_size, hp.n_layers, hp.d_model, hp.n_heads, d_mlp, hp.max_positions,
                                hp.rotary_pct)  # fmt: skip
        self.lm = scratch_causal_lm(config, hp.seed)

    def configure_model(self) -> None:
        if self.lm is not None:
            return
        dm = getattr(self.trainer, "datamodule", None)
        tok = getattr(dm, "tokenizer", None)
        if tok is None:
            raise ValueError("model.vocab_size=null needs a datamodule with a tokenizer; set model.vocab_size")
        if self.hparams.vocab_top_k is None:
            self._build(len(tok))
            return
        self.id_map = top_k_id_map(dm.train_dataloader(), len(tok), self.hparams.vocab_top_k)
        self._build(int(self.id_map.max()) + 1)

    def map_ids(self, ids: Tensor) -> Tensor:
        """Token ids as the model reads them (identity unless the vocabulary was compacted)."""
        return ids if self.id_map is None else self.id_map.to(ids.device)[ids]

    @property
    def view(self):
        """The weight view of the model being trained (reads the live parameters)."""
        from lit_svd.models import view

        if self._view is None:
            self._view = view(self.lm)
        return self._view

    def unpack(self, batch) -> tuple[Tensor, Tensor]:
        ids = batch if isinstance(batch, Tensor) else batch["input_ids"]
        mask = torch.ones_like(ids) if isinstance(batch, Tensor) else batch.get("attention_mask", torch.ones_like(ids))
        return self.map_ids(ids), mask

    def loss(self, batch) -> Tensor:
        ids, mask = self.unpack(batch)
        if ids.shape[1] > self.hparams.max_positions:
            raise ValueError(
                f"sequences of {ids.shape[1]} tokens exceed model.max_positions={self.hparams.max_positions}"
            )
        labels = ids.masked_fill(mask == 0, -100)
        loss = self.lm(input_ids=ids, attention_mask=mask, labels=labels).loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {self.global_step}; lower model.lr")
        return loss

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.lm(input_ids=input_ids, attention_mask=attention_mask).logits

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        self.log("val/loss", self.loss(batch), prog_bar=True, on_epoch=True, sync_dist=True)

    def configure_optimizers(self):
        hp = self.hparams
        decay = [p for n, p in self.lm.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in self.lm.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": rest, "weight_decay": 0.0}], lr=hp.lr
        )
        return with_warmup(opt, hp.warmup_steps)


def with_warmup(opt: torch.optim.Optimizer, warmup_steps: int) -> dict:
    """``opt`` with a linear warm-up over ``warmup_steps`` steps, then a constant rate (stepped per step)."""
    warm = max(warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warm))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


PART_SITES: dict[Part, tuple[str, ...]] = {
    "all": SITES,
    "attention": ("q", "k", "v", "o"),
    "mlp": ("gate", "up", "down"),
}


class FineTuneLMModule(PretrainedLMModule):
    """Fine-tune a pretrained causal LM (``load_causal_lm(model)``) on text or on task prompts.

    Text batches (``input_ids``, ``attention_mask``: ``TextDataModule``) train on the next-token loss of
    every real token; task batches (``clean_ids``, ``answer_pos``, ``correct_id``: ``TaskDataModule``) on
    the next-token loss of the answer alone, and log the logit difference correct - wrong
    (``val/logit_diff``). Only the linear sites of ``trainable`` in ``layers`` learn; everything else
    (embeddings, norms, other layers, the unembedding) stays frozen, so that it fits a CPU. The model's loading
    options are ``PretrainedLMModule``'s; it is loaded afresh (never a model object in use: it changes the weights).

    Args:
        trainable: which linear maps learn: "attention" (q, k, v, o), "mlp" (gate, up, down) or "all".
        layers: the layers whose maps learn (null: every layer).
        lr: AdamW learning rate (after a linear warm-up, constant).
        weight_decay: AdamW weight decay.
        warmup_steps: steps of the linear warm-up.
    """

    shares_model = False  # trains: its weights are its own
    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.language_model_options:check_fine_tune_options"

    def __init__(
        self,
        trainable: Part = "attention",
        layers: list[int] | None = None,
        lr: PositiveFloat = 1e-4,
        weight_decay: NonNegativeFloat = 0.0,
        warmup_steps: int = 10,
        **loading,
    ):
        check_fine_tune_options(trainable, layers, lr, weight_decay, warmup_steps)
        super().__init__(**loading)
        self.save_hyperparameters()
        v = self.view
        check_indices("model.layers", "layer", layers or (), v.n_layers)
        self.train_layers = list(range(v.n_layers)) if layers is None else [int(l) for l in layers]
        sites = [s for s in PART_SITES[trainable] if s != "gate" or v.gated_mlp]
        for l in self.train_layers:
            for s in sites:
                for p in v.site_module(l, s).parameters():
                    p.requires_grad_(True)
        self.trainable_names = {n for n, p in self.lm.named_parameters() if p.requires_grad}

    def loss_and_diff(self, batch) -> tuple[Tensor, Tensor | None]:
        """Mean next-token loss, and the mean logit difference on task batches (None on text)."""
        from lit_svd.metrics import forward_answer_logits, logit_diff

        if "clean_ids" not in batch:
            ids = batch["input_ids"]
            mask = batch.get("attention_mask", torch.ones_like(ids))
            return self.lm(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss, None
        logits = forward_answer_logits(self.lm, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])
        loss = torch.nn.functional.cross_entropy(logits.float(), batch["correct_id"])
        diff = logit_diff(logits, batch["correct_id"], batch["wrong_id"]).mean() if "wrong_id" in batch else None
        return loss, diff

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss, diff = self.loss_and_diff(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {self.global_step}; lower model.lr")
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        if diff is not None:
            self.log("train/logit_diff", diff, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        loss, diff = self.loss_and_diff(batch)
        n = (batch["clean_ids"] if "clean_ids" in batch else batch["input_ids"]).shape[0]
        self.log("val/loss", loss, prog_bar=True, on_epoch=True, sync_dist=True, batch_size=n)
        if diff is not None:
            self.log("val/logit_diff", diff, prog_bar=True, on_epoch=True, sync_dist=True, batch_size=n)

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.lm.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay)
        return with_warmup(opt, hp.warmup_steps)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Checkpoints hold the trained maps only; the frozen rest is rebuilt from ``model``."""
        keep = {f"lm.{n}" for n in self.trainable_names}
        checkpoint["state_dict"] = {
            k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("lm.") or k in keep
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["state_dict"]
        state.update({f"lm.{k}": v for k, v in self.lm.state_dict().items() if f"lm.{k}" not in state})
