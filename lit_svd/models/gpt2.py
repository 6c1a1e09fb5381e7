"""GPT-2 view: LayerNorm, learned absolute positions, fused ``c_attn`` (columns ``[q | k | v]``, each
head-major), GELU MLP. HF stores ``Conv1D`` weights as ``[in, out]``.

HF layout: ``transformer.h[l].{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}``,
``transformer.ln_f``, ``lm_head`` (tied to ``wte``). The attention scale is the module's own
``scaling`` (``1/sqrt(d_head)``, divided by ``layer + 1`` under ``scale_attn_by_inverse_layer_idx``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_svd.models.base import AttnWeights, MLPWeights, ModelView, Sites


class GPT2View(ModelView):
    model_type = "gpt2"
    norm_kind = "layernorm"
    gated_mlp = False
    rotary_dim = 0
    layers_path = "transformer.h"
    attention_path = "attn"
    norm_paths = ("ln_1", "ln_2", "transformer.ln_f")
    d_mlp_key = "n_inner"

    def _rotary_module(self):
        return None

    def embed(self, input_ids: Tensor) -> Tensor:
        tr = self.model.transformer
        positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        return tr.wte(input_ids) + tr.wpe(positions)

    def _raw_attn(self, layer: int) -> AttnWeights:
        at = self._layers[layer].attn
        h, dh, d = self.n_heads, self.d_head, self.d_model
        W = at.c_attn.weight.reshape(d, 3, h, dh).permute(1, 2, 0, 3)  # [3, h, d, dh]
        b = at.c_attn.bias.reshape(3, h, dh)
        return AttnWeights.fused(W, b, at.c_proj.weight.reshape(h, dh, d), at.c_proj.bias, float(at.scaling))

    def _raw_mlp(self, layer: int) -> MLPWeights:
        m = self._layers[layer].mlp
        return MLPWeights(W_in=m.c_fc.weight, b_in=m.c_fc.bias, W_out=m.c_proj.weight, b_out=m.c_proj.bias, act=m.act)

    def _sites(self, layer: int) -> Sites:
        blk = self._layers[layer]
        d = self.d_model
        return {
            "q": (blk.attn.c_attn, slice(0, d)),
            "k": (blk.attn.c_attn, slice(d, 2 * d)),
            "v": (blk.attn.c_attn, slice(2 * d, 3 * d)),
            "o": (blk.attn.c_proj, None),
            "up": (blk.mlp.c_fc, None),
            "down": (blk.mlp.c_proj, None),
        }
