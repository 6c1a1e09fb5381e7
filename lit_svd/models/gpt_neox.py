"""GPT-NeoX view (Pythia): LayerNorm, partial rotary (first ``rotary_pct * d_head`` features of each
head, ``rotate_half`` pairing within them), fused ``query_key_value`` laid out per head as
``(head, [q, k, v], d_head)``, GELU MLP, optional parallel residual (``parallel_residual``: attention
and MLP both read the block input, through ``input_layernorm`` and ``post_attention_layernorm``).

HF layout: ``gpt_neox.layers[l].{input_layernorm, attention.query_key_value, attention.dense,
post_attention_layernorm, mlp.dense_h_to_4h, mlp.dense_4h_to_h}``, ``gpt_neox.final_layer_norm``,
``embed_out`` / ``lm_head`` (untied).
"""

from __future__ import annotations

from torch import Tensor

from lit_svd.models.base import AttnWeights, MLPWeights, ModelView, Sites, bias_of


class GPTNeoXView(ModelView):
    model_type = "gpt_neox"
    norm_kind = "layernorm"
    gated_mlp = False
    layers_path = "gpt_neox.layers"
    attention_path = "attention"
    norm_paths = ("input_layernorm", "post_attention_layernorm", "gpt_neox.final_layer_norm")

    def read_sizes(self) -> None:
        super().read_sizes()
        self.rotary_dim = self._layers[0].attention.rotary_ndims
        self.parallel_residual = bool(self.config.use_parallel_residual)

    def _rotary_module(self):
        return self.model.gpt_neox.rotary_emb

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.gpt_neox.embed_in(input_ids)

    def _raw_attn(self, layer: int) -> AttnWeights:
        at = self._layers[layer].attention
        h, dh, d = self.n_heads, self.d_head, self.d_model
        W = at.query_key_value.weight.reshape(h, 3, dh, d).permute(1, 0, 3, 2)  # [3, h, d, dh]
        b = bias_of(at.query_key_value, (h, 3, dh)).transpose(0, 1)
        W_O = at.dense.weight.T.reshape(h, dh, d)
        return AttnWeights.fused(W, b, W_O, bias_of(at.dense, (d,)), float(at.scaling))

    def _raw_mlp(self, layer: int) -> MLPWeights:
        m = self._layers[layer].mlp
        return MLPWeights(
            W_in=m.dense_h_to_4h.weight.T,
            b_in=m.dense_h_to_4h.bias,
            W_out=m.dense_4h_to_h.weight.T,
            b_out=m.dense_4h_to_h.bias,
            act=m.act,
        )

    def _sites(self, layer: int) -> Sites:
        blk = self._layers[layer]
        qkv = blk.attention.query_key_value
        return {
            "q": (qkv, (0, 3)),
            "k": (qkv, (1, 3)),
            "v": (qkv, (2, 3)),
            "o": (blk.attention.dense, None),
            "up": (blk.mlp.dense_h_to_4h, None),
            "down": (blk.mlp.dense_4h_to_h, None),
        }
