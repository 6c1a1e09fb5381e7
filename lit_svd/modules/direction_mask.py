"""DirectionMaskModule: learn a mask over the singular directions of a frozen model's components.

Only the mask logits are trained (the model is frozen); the loss is KL(p_full || p_masked) at the
answer position plus ``alpha * sum(lambda)``. Under DDP the gradients of the masks are averaged over
ranks, so two processes with half the batch each follow one process with the whole batch.

Defaults follow the paper where it fits this machine (AdamW, eps 1e-7, gradient clip 1.0,
threshold 1e-3, lambda initialised near 1); ``lr`` and ``init`` are configurable because the number
of optimiser steps affordable on two CPU cores is far below the paper's 480 (see docs/masks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lit_svd.addresses import Address
from lit_svd.analysis.blocks import component_blocks, mask_units
from lit_svd.analysis.mask_options import Ablation, MaskLoss, MaskUnit, Positions, check_mask_options
from lit_svd.analysis.masks import (
    alpha_at,
    hard_masks,
    initial_logits,
    kept_report,
    l1,
    mask_loss,
    metric_distance,
    most_effective_direction,
)
from lit_svd.linalg import REL_GAP
from lit_svd.metrics import TaskScorer, task_scorer
from lit_svd.models.intervene import Intervention, build_components
from lit_svd.modules import mask_measures
from lit_svd.modules.pretrained import PretrainedLMModule
from lit_svd.option_checks import check_indices

SCORES = ("metric", "correct", "agree", "kl")


class DirectionMaskModule(PretrainedLMModule):
    """Learn a mask over the singular directions of a frozen model's components (KL + alpha * L1). The model's
    loading options (model, dtype, device_map, ...) are ``PretrainedLMModule``'s.

    Args:
        components: component types (``qk``, ``ov``, ``mlp`` or explicit ``q``, ``k``, ``mlp_in``,
            ``mlp_gate``, ``mlp_out``; see ``lit_svd.models.intervene``).
        layers: layers to mask (default all).
        alpha: L1 weight on sum(lambda) (>= 0).
        lr: AdamW learning rate.
        eps: AdamW epsilon.
        weight_decay: AdamW weight decay.
        grad_clip: gradient-norm clipping (0: none).
        lr_min: None keeps ``lr`` constant; a number decays it to ``lr_min`` over the trainer's
            ``max_steps`` (cosine), so that the hard masks settle instead of flipping directions in and
            out around the threshold at the end of the run.
        init: initial lambda (sigmoid of the initial logit), in (0, 1).
        ablation: ``zero`` or ``patch`` (toward the matched corrupted prompt) for every mask but a joint ``qk``
            one (GPT-2's ``qk`` alias), which always zero-ablates at all positions.
        positions: ``answer`` (masks act at the answer position only) or ``all`` (every position). With
            ``components [q, k, ov, mlp]``, ``ablation patch``, ``positions all`` and ``drop_null`` the masked
            forward is the faithfulness curve's circuit (``analysis.faithfulness``; configs ``*_faithful.yaml``).
        threshold: lambda at or above which a direction counts as kept (hard mask).
        steps_per_batch: optimiser steps on each batch (the paper: 15); the full model's logits and
            the corrupted reference are computed once per batch.
        straight_through: train the hard model directly: the forward uses the hard masks
            (lambda >= threshold), the gradient flows through lambda (straight-through estimator), so
            the trained circuit is the one that is evaluated (soft training leaves many lambdas between
            the threshold and 1, which the hard mask then restores to 1; docs/masks.md).
        soft_steps: with ``straight_through``, train the soft masks for this many optimiser steps first
            (a warm-up: at the full model the straight-through KL gradient is zero, so without it every
            lambda falls at the same rate until one step cuts them all at once).
        alpha_final: None keeps ``alpha``; a number raises (or lowers) the L1 weight geometrically from ``alpha``
            to ``alpha_final`` over the trainer's ``max_steps``, so that one run passes through many sparsities;
            every direction's last step in the hard mask is recorded (``masks.pt`` ``last_kept``) and ranks it.
        loss: ``kl`` (KL(p_full || p_masked) at the answer position, the paper's) or ``metric`` (the task metric's
            squared distance to the full model's, per prompt, in units of the batch's clean - corrupted gap:
            ``analysis.masks.metric_distance``).
        drop_null: leave the null directions (singular value <= ``linalg.NULL_RTOL`` of the map's largest) out of
            the masked components, as the faithfulness universe does (``models.intervene.build_component``).
        mask_unit: ``direction`` (one mask value per singular direction) or ``block`` (one per block of
            near-equal singular values, ``rel_gap``: the block's whole subspace is kept or dropped together;
            the L1 term still counts every direction, so a block of m costs m times its lambda).
        rel_gap: relative gap below which neighbouring singular values share a block (blocks in the
            reports, and the units of ``mask_unit=block``); default ``lit_svd.linalg.REL_GAP``.
    """

    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.mask_options:check_mask_options"

    def __init__(
        self,
        components: Sequence[str] = ("qk", "ov", "mlp"),
        layers: Sequence[int] | None = None,
        alpha: float = 2e-4,
        lr: PositiveFloat = 2e-2,
        eps: PositiveFloat = 1e-7,
        weight_decay: NonNegativeFloat = 0.0,
        grad_clip: float = 1.0,
        lr_min: float | None = None,
        init: float = 0.99,
        ablation: Ablation = "zero",
        positions: Positions = "answer",
        threshold: float = 1e-3,
        steps_per_batch: int = 1,
        straight_through: bool = False,
        soft_steps: int = 0,
        mask_unit: MaskUnit = "direction",
        rel_gap: float = REL_GAP,
        alpha_final: float | None = None,
        loss: MaskLoss = "kl",
        drop_null: bool = False,
        **loading,
    ):
        check_mask_options(
            layers, alpha, lr, lr_min, init, ablation, positions, threshold, steps_per_batch, soft_steps, mask_unit,
            rel_gap, alpha_final, loss,
        )  # fmt: skip
        super().__init__(**loading)
        check_indices("layers", "layer", layers or (), self.view.n_layers)  # the fast check's line, here too
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.alpha, self.threshold, self.ablation, self.positions = alpha, threshold, ablation, positions
        self.mask_unit, self.rel_gap = mask_unit, rel_gap
        self.alpha_final, self.loss_kind = alpha_final, loss
        self.components = build_components(  # a float64 model's checks run the masks' maths in float64
            self.view, components, layers, progress=True, drop_null=drop_null, dtype=self.analysis_dtype
        )
        self.intervention = Intervention(self.view, self.components)
        self.units = mask_units(self.components, mask_unit, rel_gap)  # None: one logit per direction
        logits = initial_logits(self.components, init)
        if self.units is not None:  # one logit per block: theta[units] spreads it over the block's directions
            logits = {n: t.flatten()[: int(self.units[n].max()) + 1].clone() for n, t in logits.items()}
        self.theta = nn.ParameterDict({_key(n): nn.Parameter(t) for n, t in logits.items()})
        self.n_directions = sum(c.n_directions for c in self.components)
        # the last optimiser step at which each direction was in the hard mask (flat, component order): the ranking
        self.register_buffer("last_kept", torch.zeros(self.n_directions, dtype=torch.long))
        self.eval_metrics = nn.ModuleDict({f"{s}_{m}": MeanMetric() for s in ("full", "soft", "hard") for m in SCORES})
        self.last_eval: dict[str, float] = {}
        self.task: str | None = None  # "ioi" / "gp" / "gt": set from the data (``setup``, ``evaluate``)
        # what the report holds (set by callbacks.masks.DirectionMaskReport) and what was measured for it
        self.report_plan: mask_measures.MaskReportPlan | None = None
        self.report_rows: dict | None = None

    # --- masks -----------------------------------------------------------------------------------
    def lambdas(self) -> dict[str, Tensor]:
        """``lambda = sigmoid(theta)`` per direction ``[G, K]`` (``mask_unit=block``: each block's value on
        every one of its directions)."""
        if self.units is None:
            return {c.name: self.theta[_key(c.name)].sigmoid() for c in self.components}
        return {c.name: self.theta[_key(c.name)].sigmoid()[self.units[c.name]] for c in self.components}

    def blocks(self) -> dict:
        """``lit_svd.linalg.DirectionBlocks`` of every component at this run's ``rel_gap``."""
        return {c.name: component_blocks(c, self.rel_gap) for c in self.components}

    def hard(self) -> dict[str, Tensor]:
        return hard_masks({n: lam.detach() for n, lam in self.lambdas().items()}, self.threshold)

    def masks_state(self) -> dict:
        """Everything needed to reload the masks: per component its lambdas and SVD shape."""
        return {
            "lambdas": {n: lam.detach().cpu() for n, lam in self.lambdas().items()},
            "threshold": self.threshold,
            "mask_unit": self.mask_unit,
            "rel_gap": self.rel_gap,
            "model": self.model_name,
            "hparams": dict(self.hparams),
            "logits": {c.name: self.direction_logits(c.name).detach().cpu() for c in self.components},
            "last_kept": self.split_flat(self.last_kept.cpu()),
        }

    def direction_logits(self, name: str) -> Tensor:
        """``theta`` of component ``name`` per direction ``[G, K]`` (``mask_unit=block``: the block's)."""
        theta = self.theta[_key(name)]
        return theta if self.units is None else theta[self.units[name]]

    def split_flat(self, flat: Tensor) -> dict[str, Tensor]:
        """A flat ``[n_directions]`` tensor in component order -> ``{name: [G, K]}``."""
        parts = flat.split([c.n_directions for c in self.components])
        return {c.name: p.reshape(c.shape) for c, p in zip(self.components, parts, strict=True)}

    @torch.no_grad()
    def record_kept(self, lambdas: dict[str, Tensor]) -> None:
        """Stamp the current optimiser step on every direction that ``lambdas`` keep (``lambda >= threshold``)."""
        keep = torch.cat([(lambdas[c.name] >= self.threshold).flatten() for c in self.components])
        self.last_kept[keep] = self.global_step

    def setup(self, stage: str) -> None:
        task = getattr(getattr(self.trainer, "datamodule", None), "task", None)
        self.task = getattr(task, "name", self.task)

    @property
    def scorer(self) -> TaskScorer:
        """This run's task scorer (one-line error when no task data set the task)."""
        if self.task is None:
            raise ValueError(
                "direction masks need the task of the prompts (ioi, gp or gt); use"
                " lit_svd.datamodules.tasks.TaskDataModule"
            )
        return task_scorer(self.task)

    def scores(self, logits: Tensor, full: Tensor, batch: dict) -> dict[str, Tensor]:
        """``TaskScorer.scores`` of this run's task."""
        return self.scorer.scores(logits, full, batch)

    def on_fit_start(self) -> None:
        self.components_to_device()

    def on_validation_start(self) -> None:
        self.components_to_device()

    def on_test_start(self) -> None:
        self.components_to_device()

    def components_to_device(self) -> None:
        """Move the component SVDs (plain tensors, not buffers) to the module's device."""
        for c in self.components:
            c.to_(device=self.device)
        if self.units is not None:
            self.units = {n: u.to(self.device) for n, u in self.units.items()}

    # --- forward passes ------------------------------------------------------------------------
    def answer_logits(
        self, ids: Tensor, batch: dict, scales: dict[str, Tensor] | None = None, reference: dict | None = None
    ) -> Tensor:
        """Logits ``[B, V]`` at the answer position, with ``scales`` applied (None: the plain model), in the
        analysis dtype (a bf16 / fp16 model's logits in float32: the KL, the metric and the loss in float32)."""
        pos = batch["answer_pos"]
        kwargs = dict(input_ids=ids, attention_mask=batch["attention_mask"], logits_to_keep=pos[:, None])
        if scales is None:
            return self.lm(**kwargs).logits[:, 0].to(self.analysis_dtype)
        at = pos if self.positions == "answer" else None
        with self.intervention.apply(scales, positions=at, reference=reference):
            return self.lm(**kwargs).logits[:, 0].to(self.analysis_dtype)

    @torch.no_grad()
    def reference(self, batch: dict) -> dict | None:
        """Patch mode: the coefficients of every component on the corrupted prompt."""
        if self.ablation != "patch":
            return None
        at = batch["answer_pos"] if self.positions == "answer" else None
        with self.intervention.record(positions=at) as store:
            self.lm(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"], logits_to_keep=1)
        return dict(store)

    # --- training -------------------------------------------------------------------------------
    def current_alpha(self) -> float:
        """The L1 weight of the current optimiser step (``alpha_final``: the geometric schedule)."""
        return alpha_at(self.alpha, self.alpha_final, self.global_step, self.trainer.max_steps)

    def training_loss(
        self, masked: Tensor, full: Tensor, corrupt: Tensor | None, lambdas: dict[str, Tensor], batch: dict
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(loss, distance, l1)`` of one step: ``loss`` = the distance (``kl`` or ``metric``) + alpha * l1."""
        alpha = self.current_alpha()
        if self.loss_kind == "kl":
            return mask_loss(masked, full, lambdas, alpha)
        assert corrupt is not None
        metric = self.scorer.metric
        distance = metric_distance(metric(masked, batch), metric(full, batch), metric(corrupt, batch))
        total = l1(lambdas)
        return distance + alpha * total, distance, total

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        opt = self.optimizers()
        with torch.no_grad():
            full = self.answer_logits(batch["clean_ids"], batch)
            corrupt = self.answer_logits(batch["corrupt_ids"], batch) if self.loss_kind == "metric" else None
        reference = self.reference(batch)
        for _ in range(self.hparams.steps_per_batch):
            lambdas = self.lambdas()
            scales = lambdas
            if self.hparams.straight_through and self.global_step >= self.hparams.soft_steps:
                scales = {n: (lam >= self.threshold).to(lam.dtype) + lam - lam.detach() for n, lam in lambdas.items()}
            masked = self.answer_logits(batch["clean_ids"], batch, scales, reference)
            loss, kl, total = self.training_loss(masked, full, corrupt, lambdas, batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"direction mask loss is {loss.item()} at step {self.global_step}; lower lr")
            opt.zero_grad()
            self.manual_backward(loss)
            if self.hparams.grad_clip:
                self.clip_gradients(opt, gradient_clip_val=self.hparams.grad_clip, gradient_clip_algorithm="norm")
            opt.step()
            if self.hparams.lr_min is not None:
                self.lr_schedulers().step()
            self.record_kept(self.lambdas())
        kept = sum(int((lam.detach() >= self.threshold).sum()) for lam in lambdas.values())
        self.log_dict(
            {
                "train/loss": loss.detach(),
                "train/kl" if self.loss_kind == "kl" else "train/distance": kl.detach(),
                "train/l1": total.detach(),
                "train/alpha": self.current_alpha(),
                "train/kept_fraction": kept / self.n_directions,
            },
            prog_bar=True,
            on_step=True,
        )
        self.trajectory_step()
        return loss.detach()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(
            self.theta.parameters(), lr=self.hparams.lr, eps=self.hparams.eps, weight_decay=self.hparams.weight_decay
        )
        if self.hparams.lr_min is None:
            return opt
        if self.trainer.max_steps < 1:
            raise ValueError("lr_min needs trainer.max_steps (the length of the cosine decay)")
        return [opt], [
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.max_steps, eta_min=self.hparams.lr_min)
        ]

    # --- evaluation (soft and hard masks) --------------------------------------------------------
    @torch.no_grad()
    def batch_scores(self, batch: dict, thresholds: Sequence[float]) -> dict:
        """Per-example scores (``SCORES``) of one batch: ``"full"``, ``"soft"`` and, per threshold ``t``, the
        hard masks cut at ``t`` (key ``t``). The full model, the corrupted reference and the soft masks run
        once, whatever the number of thresholds."""
        ids = batch["clean_ids"]
        full = self.answer_logits(ids, batch)
        reference = self.reference(batch)
        lambdas = {n: l.detach() for n, l in self.lambdas().items()}
        out = {
            "full": self.scores(full, full, batch),
            "soft": self.scores(self.answer_logits(ids, batch, lambdas, reference), full, batch),
        }
        for t in thresholds:
            out[t] = self.scores(self.answer_logits(ids, batch, hard_masks(lambdas, t), reference), full, batch)
        return out

    @torch.no_grad()
    def evaluate_batch(self, batch: dict) -> None:
        """Update the full / soft / hard metric states with one batch."""
        scores = self.batch_scores(batch, [self.threshold])
        for setting, key in (("full", "full"), ("soft", "soft"), ("hard", self.threshold)):
            for name, values in scores[key].items():
                self.eval_metrics[f"{setting}_{name}"].update(values)

    @torch.no_grad()
    def evaluate(self, loader, progress: bool = False) -> dict[str, float]:
        """Full / soft / hard scores over every batch of ``loader`` (synced means, see ``compute_eval``);
        ``progress``: a progress bar over the batches."""
        from tqdm.auto import tqdm

        self.task = getattr(loader.dataset, "task", self.task)
        self.components_to_device()
        for batch in tqdm(loader, desc="final evaluation", disable=not progress):
            self.evaluate_batch({k: v.to(self.device) for k, v in batch.items()})
        return self.compute_eval()

    def compute_eval(self) -> dict[str, float]:
        """Synced (DDP) means of the evaluation states, then reset."""
        out = {name: float(metric.compute()) for name, metric in self.eval_metrics.items()}
        for metric in self.eval_metrics.values():
            metric.reset()
        return out

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate_batch(batch)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            for metric in self.eval_metrics.values():
                metric.reset()
            return
        self.last_eval = self.compute_eval()
        self.log_dict({f"val/{k}": v for k, v in self.last_eval.items()}, sync_dist=False)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluate_batch(batch)

    def on_test_epoch_end(self) -> None:
        self.last_eval = self.compute_eval()
        self.log_dict({f"test/{k}": v for k, v in self.last_eval.items()}, sync_dist=False)
        if self.report_plan is not None:
            self.report_rows = mask_measures.final_measures(self, self.report_plan, {"test": self.last_eval})

    # --- what the report holds (mask_measures; only with a report_plan) --------------------------------
    def trajectory_step(self) -> None:
        """At the end of a training step (its optimiser steps done, so before any checkpoint of this step):
        every ``trajectory_every`` steps, the report's trajectory point."""
        plan = self.report_plan
        if plan is not None and plan.trajectory_every and self.trainer.global_step % plan.trajectory_every == 0:
            plan.trajectory.append(mask_measures.trajectory_point(self, plan))
            self.log_dict({"trajectory/kl_hard": plan.trajectory[-1]["kl_hard"]}, on_step=True)

    def on_train_end(self) -> None:
        if self.report_plan is not None:
            show = self.trainer.is_global_zero and self.trainer.progress_bar_callback is not None
            evals = mask_measures.evaluate_splits(self, progress=show)
            self.report_rows = mask_measures.final_measures(self, self.report_plan, evals)

    def kept(self) -> dict:
        return kept_report(self.components, self.lambdas(), self.threshold)

    def most_effective_ov_direction(self, batch: dict) -> Address | None:
        """The kept OV direction whose hard-mask scale moves the task metric most (first order)."""
        reference = self.reference(batch)

        def metric_of(scales):
            logits = self.answer_logits(batch["clean_ids"], batch, scales, reference)
            return self.scores(logits, logits.detach(), batch)["metric"].mean()

        return most_effective_direction(metric_of, self.hard(), [c.name for c in self.components if c.kind == "ov"])


def _key(name: str) -> str:
    """ParameterDict keys cannot hold dots."""
    return name.replace(".", "_")
