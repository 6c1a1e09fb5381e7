"""Gemma-2 view: the Llama layout with Gemma's conventions.

* RMSNorm multiplies by ``(1 + w)`` (folded as such);
* embeddings are scaled by ``sqrt(d_model)`` inside the embedding module (``embed`` and ``W_E`` include it);
* scores use ``query_pre_attn_scalar ** -0.5`` and then a logit soft-cap ``c * tanh(s / c)``
  (``attn_softcap``); ``qk`` gives the score *before* the cap;
* sandwich norms: attention reads ``input_layernorm``, the MLP reads ``pre_feedforward_layernorm``, and
  each sub-layer's output passes through ``post_attention_layernorm`` / ``post_feedforward_layernorm``
  before the residual add (``post_norm``, ``post_norm_module``); ``ov`` and ``mlp`` give the output *before* that norm;
* final logits are soft-capped too (``final_softcap``); ``unembed`` gives them before the cap;
* alternate layers use a sliding-window mask (``config.sliding_window``): the QK score is the same,
  the mask hides keys further back than the window.
"""

from __future__ import annotations

from torch import Tensor, nn

from lit_svd.models.llama import LlamaView


class Gemma2View(LlamaView):
    model_type = "gemma2"
    norm_paths = ("input_layernorm", "pre_feedforward_layernorm", "model.norm")

    def __init__(self, model: nn.Module, fold_norms: bool = True):
        super().__init__(model, fold_norms)
        self.attn_softcap = getattr(self.config, "attn_logit_softcapping", None)
        self.final_softcap = getattr(self.config, "final_logit_softcapping", None)

    def _norm_scale(self, weight: Tensor) -> Tensor:
        return 1.0 + weight

    def post_norm_module(self, point, layer):
        super().post_norm_module(point, layer)  # checks the point
        blk = self.block(layer)
        return blk.post_attention_layernorm if point == "attn" else blk.post_feedforward_layernorm
