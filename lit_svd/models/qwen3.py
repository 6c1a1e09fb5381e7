"""Qwen3 view (``Qwen3ForCausalLM``, ``model_type`` ``qwen3``): the Llama layout (no biases unless
``attention_bias``) plus a per-head RMSNorm on each query and key (``q_norm`` / ``k_norm``), after the
projection and before RoPE, as Gemma-3 but with Qwen's convention: the norm's weight is the gain as it is
(not ``1 + w``), and the norm acts on ``[batch, pos, heads, d_head]`` (before the heads are moved to axis 1:
``head_norm_heads_dim = 2``).

The gains are folded into ``W_Q, b_Q`` / ``W_K, b_K`` (``qk``, ``q_map``, ``k_map`` carry them); the score is
``f_q(i) f_k(j) [1, x_i] qk(layer, j - i) [1, x_j]^T`` with the per-token factors ``qk_factors(layer, x)``
(the maths is ``ModelView``'s, shared with Gemma-3).
"""

from __future__ import annotations

from lit_svd.models.llama import LlamaView


class Qwen3View(LlamaView):
    model_type = "qwen3"
    head_norm_names = ("q_norm", "k_norm")
    head_norm_heads_dim = 2
