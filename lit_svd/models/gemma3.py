"""Gemma-3 text view (``Gemma3ForCausalLM``, ``model_type`` ``gemma3_text``): Gemma-2's layout plus

* ``q_norm`` / ``k_norm``: an RMSNorm (``(1 + w)`` gain) on each head's query and key, after the
  projection and before RoPE. The gains are folded into ``W_Q, b_Q`` / ``W_K, b_K`` (so ``qk``, ``q_map``,
  ``k_map`` carry them); the per-token factors ``1 / rms`` of the raw query and key are not weights:
  ``qk_factors(layer, x)`` gives them from the attention input, ``head_norm_maps`` the raw maps they
  are computed from, and the model's score is ``f_q(i) f_k(j) [1, x_i] qk(layer, j - i) [1, x_j]^T``;
* two rotary bases: ``rope_local_base_freq`` on sliding-window layers, ``rope_theta`` on full ones
  (``rotate`` / ``qk`` take the layer); ``window(layer)`` is 512 on the sliding layers;
* no soft-caps (``attn_logit_softcapping`` / ``final_logit_softcapping`` are None); tied unembedding,
  embeddings scaled by ``sqrt(d_model)``, sandwich norms (``post_norm``) as Gemma-2.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from lit_svd.models.base import AttnWeights, augment
from lit_svd.models.gemma2 import Gemma2View


class Gemma3View(Gemma2View):
    model_type = "gemma3_text"

    def _head_gains(self, layer: int) -> tuple[Tensor, Tensor]:
        at = self._layers[layer].self_attn
        return self._norm_scale(at.q_norm.weight.to(self._dtype)), self._norm_scale(at.k_norm.weight.to(self._dtype))

    def _raw_attn(self, layer: int) -> AttnWeights:
        w = self._cast(super()._raw_attn(layer))
        g_q, g_k = self._head_gains(layer)
        w.W_Q, w.b_Q = w.W_Q * g_q, w.b_Q * g_q
        w.W_K, w.b_K = w.W_K * g_k, w.b_K * g_k
        return w

    def head_norm_maps(self, layer: int) -> tuple[Tensor, Tensor, float]:
        with self.materialized(self.check_layer(layer)):
            plain = self._cast(super()._raw_attn(layer))
        W_Q, b_Q = self._fold("attn", layer, plain.W_Q, plain.b_Q)
        W_K, b_K = self._fold("attn", layer, plain.W_K, plain.b_K)
        eps = float(self._layers[layer].self_attn.q_norm.eps)
        return augment(W_Q, b_Q).detach(), augment(W_K, b_K).detach(), eps

    def head_norm_module(self, layer: int, site: Literal["q", "k"]) -> nn.Module:
        at = self._layers[self.check_layer(layer)].self_attn
        if site not in ("q", "k"):
            raise ValueError(f"head norm site {site!r} unknown; allowed: q, k")
        return at.q_norm if site == "q" else at.k_norm

    def _cos_sin(self, rotary, x, position_ids, layer):
        if layer is None:
            raise ValueError(
                "layer=None: gemma3_text uses a different rotary base on sliding and full layers; pass the layer"
            )
        return rotary(x, position_ids, self.config.layer_types[self.check_layer(layer)])
