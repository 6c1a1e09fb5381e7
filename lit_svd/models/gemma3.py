"""Gemma-3 text view (``Gemma3ForCausalLM``, ``model_type`` ``gemma3_text``): Gemma-2's layout plus

* ``q_norm`` / ``k_norm``: an RMSNorm (``(1 + w)`` gain) on each head's query and key, after the
  projection and before RoPE (``head_norm_names``; the maths is ``ModelView``'s, shared with Qwen3). The
  gains are folded into ``W_Q, b_Q`` / ``W_K, b_K`` (so ``qk``, ``q_map``, ``k_map`` carry them); the
  per-token factors ``1 / rms`` of the raw query and key are not weights: ``qk_factors(layer, x)`` gives
  them from the attention input, ``head_norm_maps`` the raw maps they are computed from, and the model's
  score is ``f_q(i) f_k(j) [1, x_i] qk(layer, j - i) [1, x_j]^T``;
* two rotary bases: ``rope_local_base_freq`` on sliding-window layers, ``rope_theta`` on full ones
  (``rotate`` / ``qk`` take the layer); ``window(layer)`` is 512 on the sliding layers;
* no soft-caps (``attn_logit_softcapping`` / ``final_logit_softcapping`` are None); tied unembedding,
  embeddings scaled by ``sqrt(d_model)``, sandwich norms (``post_norm``) as Gemma-2.
"""

from __future__ import annotations

from lit_svd.models.gemma2 import Gemma2View


class Gemma3View(Gemma2View):
    model_type = "gemma3_text"
    head_norm_names = ("q_norm", "k_norm")  # applied to [batch, heads, pos, d_head] (head_norm_heads_dim 1)

    def _cos_sin(self, rotary, x, position_ids, layer):
        if layer is None:
            raise ValueError(
                "layer=None: gemma3_text uses a different rotary base on sliding and full layers; pass the layer"
            )
        return rotary(x, position_ids, self.config.layer_types[self.check_layer(layer)])
