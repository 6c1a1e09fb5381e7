"""A frozen pretrained causal LM as a LightningModule: the base of every real-model analysis."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from lit_svd.models.loaded import OPTION_HELP, ModelOptions, obtain
from lit_svd.models.loading import DType, torch_dtype


class PretrainedLMModule(pl.LightningModule):
    # the docstring is built below from the options' one description (models.loaded.OPTION_HELP)

    shares_model = True  # frozen weights: takes the model object in use under the same options (models.loaded)

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
        self.options = ModelOptions(model, gguf_file, revision, dtype, device_map, offload_folder, fold_norms).check()
        self.loaded = obtain(self.options, share=self.shares_model)
        self.model_name = model
        self.model_dtype = torch_dtype(dtype, "model.dtype")
        self.tokenizer = self.loaded.tokenizer
        self.lm = self.loaded.lm
        self.fold_norms = fold_norms

    @property
    def analysis_dtype(self) -> torch.dtype:
        """float32 for a bf16 / fp16 / float32 model, float64 for a float64 one."""
        from lit_svd.models.base import analysis_dtype

        return analysis_dtype(self.model_dtype)

    def _is_zero(self) -> bool:
        """True on the process that shows progress bars: global rank 0, or no trainer attached."""
        return self._trainer is None or self.trainer.is_global_zero

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
        """The architecture view of the frozen model (the model object's: its SVDs are computed once)."""
        return self.loaded.view(self.fold_norms)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The frozen model is rebuilt from ``model`` at construction: checkpoints hold only what trains."""
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("lm.")}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"].update({f"lm.{k}": v for k, v in self.lm.state_dict().items()})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm(input_ids=input_ids, attention_mask=attention_mask).logits


def run_loading(run_hparams: dict, loading: dict) -> dict:
    """The loading options of a module that reads a finished run (``run_hparams``: the run's module options): its
    ``gguf_file`` and ``revision`` where not given, and its ``fold_norms`` (the run's directions are those of its
    view, so another value fails in one line)."""
    out = dict(loading)
    for key in ("gguf_file", "revision"):
        if out.get(key) is None and run_hparams.get(key) is not None:
            out[key] = run_hparams[key]
    fold = run_hparams.get("fold_norms", True)
    if out.setdefault("fold_norms", fold) != fold:
        raise ValueError(
            f"model.fold_norms={out['fold_norms']}: the run's directions are those of a view with fold_norms={fold};"
            f" give --model.init_args.fold_norms {str(fold).lower()}"
        )
    return out


PretrainedLMModule.__doc__ = """A frozen pretrained causal LM (alias, hub name, local path or GGUF) in eval mode, with
its view: the base of every real-model analysis. Its seven loading options are every such module's (a subclass
takes them as ``**loading`` and passes them on); the model object is built in one place
(``lit_svd.models.loaded.obtain``).

Subclasses implement ``test_step`` / ``training_step`` and read weights through ``self.view``.

Args:
""" + "\n".join(f"    {name}: {text}" for name, text in OPTION_HELP.items())
