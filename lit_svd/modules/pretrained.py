"""A frozen pretrained causal LM as a LightningModule: the base of every real-model analysis."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from lit_svd.models.loading import load_causal_lm


class PretrainedLMModule(pl.LightningModule):
    """Loads ``model`` (alias, hub name, local path or GGUF) frozen in eval mode, with its view.

    Subclasses implement ``test_step`` / ``training_step`` and read weights through ``self.view``.

    Args:
        model: offline alias (``smollm2-135m``), hub name, local folder or ``.gguf`` file.
        gguf_file: the GGUF file inside ``model`` when ``model`` is a folder.
        revision: hub revision (e.g. a Pythia training checkpoint such as ``step1000``).
        fold_norms: fold the norms' weights into the views' matrices.
    """

    def __init__(
        self,
        model: str = "smollm2-135m",
        gguf_file: str | None = None,
        revision: str | None = None,
        fold_norms: bool = True,
    ):
        super().__init__()
        self.model_name = model
        lm, self.tokenizer = load_causal_lm(model, gguf_file=gguf_file, revision=revision)
        for p in lm.parameters():
            p.requires_grad_(False)
        self.lm = lm
        self.fold_norms = fold_norms
        self._view = None

    @property
    def view(self):
        """The architecture view of the frozen model (built on first use, on the module's device)."""
        from lit_svd.models import view

        if self._view is None:
            self._view = view(self.lm, fold_norms=self.fold_norms)
        return self._view

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The frozen model is rebuilt from ``model`` at construction: checkpoints hold only what trains."""
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("lm.")}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"].update({f"lm.{k}": v for k, v in self.lm.state_dict().items()})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm(input_ids=input_ids, attention_mask=attention_mask).logits
