"""A frozen pretrained causal LM as a LightningModule: the base of every real-model analysis."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from lit_svd.models.loading import DType, load_causal_lm, torch_dtype


class PretrainedLMModule(pl.LightningModule):
    """Loads ``model`` (alias, hub name, local path or GGUF) frozen in eval mode, with its view.

    Subclasses implement ``test_step`` / ``training_step`` and read weights through ``self.view``.

    Args:
        model: offline alias (``smollm2-135m``), hub name, local folder or ``.gguf`` file.
        gguf_file: the GGUF file inside ``model`` when ``model`` is a folder.
        revision: hub revision (e.g. a Pythia training checkpoint such as ``step1000``).
        fold_norms: fold the norms' weights into the views' matrices.
        dtype: what the frozen model runs in ("float32", "bfloat16", "float16"; "float64" for exact checks). The
            analysis maths (weights read through the view, SVDs, sums, nulls, statistics, trained masks) stays in
            float32 (float64 for a float64 model): the view returns float32 weights of a bf16 / fp16 model.
        device_map: place the model with accelerate (``{module name: device, "cpu" or "disk"}`` or "auto");
            modules mapped to "disk" are offloaded to ``offload_folder`` and loaded layer by layer in each
            forward (``lit_svd.models.loading.layer_offload_map`` writes such a map). Lightning does not move a
            placed model.
        offload_folder: where disk-offloaded weights are written.
    """

    def __init__(
        self,
        model: str = "smollm2-135m",
        gguf_file: str | None = None,
        revision: str | None = None,
        fold_norms: bool = True,
        dtype: DType = "float32",
        device_map: str | dict[str, int | str] | None = None,
        offload_folder: str | None = None,
    ):
        super().__init__()
        self.model_name = model
        self.model_dtype = torch_dtype(dtype, "model.dtype")
        lm, self.tokenizer = load_causal_lm(
            model,
            gguf_file=gguf_file,
            revision=revision,
            dtype=self.model_dtype,
            device_map=device_map,
            offload_folder=offload_folder,
        )
        for p in lm.parameters():
            p.requires_grad_(False)
        self.lm = lm
        self.fold_norms = fold_norms
        self._view = None

    @property
    def analysis_dtype(self) -> torch.dtype:
        """float32 for a bf16 / fp16 / float32 model, float64 for a float64 one."""
        from lit_svd.models.base import analysis_dtype

        return analysis_dtype(self.model_dtype)

    @property
    def placed(self) -> bool:
        """True when accelerate placed the model with a device map (Lightning then leaves it where it is)."""
        return bool(getattr(self.lm, "hf_device_map", None))

    def _apply(self, fn, recurse: bool = True):
        """Lightning's ``.to(device)`` / ``.double()`` leave a device-mapped model where accelerate put it (its
        offloaded weights are ``meta`` tensors that cannot move)."""
        if not self.placed:
            return super()._apply(fn, recurse)
        lm = self._modules.pop("lm")
        try:
            return super()._apply(fn, recurse)
        finally:
            self._modules["lm"] = lm

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
