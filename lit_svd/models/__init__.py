"""Loading Hugging Face causal LMs and one weight view per architecture family."""

from __future__ import annotations

from torch import nn

from lit_svd.models.base import SITES, AttnWeights, MLPWeights, ModelView, NormAffine, augment
from lit_svd.models.loading import ModelUnavailableError, load_causal_lm, load_tokenizer


def _registry() -> dict[str, type[ModelView]]:
    from lit_svd.models.gemma2 import Gemma2View
    from lit_svd.models.gemma3 import Gemma3View
    from lit_svd.models.gpt2 import GPT2View
    from lit_svd.models.gpt_neox import GPTNeoXView
    from lit_svd.models.llama import LlamaView
    from lit_svd.models.qwen2 import Qwen2View
    from lit_svd.models.qwen3 import Qwen3View

    return {
        "gpt2": GPT2View,
        "gpt_neox": GPTNeoXView,
        "llama": LlamaView,
        "gemma2": Gemma2View,
        "gemma3_text": Gemma3View,
        "qwen2": Qwen2View,
        "qwen3": Qwen3View,
    }


def view(model: nn.Module, fold_norms: bool = True) -> ModelView:
    """The weight view of an HF causal LM, chosen by ``model.config.model_type``."""
    registry = _registry()
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in registry:
        raise ValueError(f"model_type {model_type!r} has no view; supported: {', '.join(registry)}")
    return registry[model_type](model, fold_norms=fold_norms)


__all__ = [
    "SITES",
    "AttnWeights",
    "MLPWeights",
    "ModelUnavailableError",
    "ModelView",
    "NormAffine",
    "augment",
    "load_causal_lm",
    "load_tokenizer",
    "view",
]
