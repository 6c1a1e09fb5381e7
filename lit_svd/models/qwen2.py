"""Qwen2 / Qwen2.5 view (``Qwen2ForCausalLM``, ``model_type`` ``qwen2``): the Llama layout (RMSNorm with the
weight as gain, RoPE ``rotate_half`` on every head feature, GQA, SwiGLU) with biases on the q, k and v
projections (none on o or the MLP).

The biases are row 0 of the augmented maps: ``q_map = [b_Q; W_Q]``, ``k_map = [b_K; W_K]``, and they are
added *before* RoPE, so in ``qk(layer, delta) = s [b_Q; W_Q] R_i R_j^T [b_K; W_K]^T`` the bias rows rotate
with the position like the token rows: entry ``[0, 0]`` is ``s (b_Q R_i) . (b_K R_j)``, which depends on
``delta = j - i`` (``s b_Q . b_K`` at ``delta = 0``). ``b_V`` is row 0 of ``ov``. Sliding-window layers
(``use_sliding_window``: layers from ``max_window_layers`` on) come from ``config.layer_types``
(``window``); the unembedding is tied for the small models (Qwen2.5-0.5B), untied for larger ones.
"""

from __future__ import annotations

from lit_svd.models.llama import LlamaView


class Qwen2View(LlamaView):
    model_type = "qwen2"
