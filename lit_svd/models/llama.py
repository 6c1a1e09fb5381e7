"""Llama-family view (SmolLM2, Llama, Mistral-style): RMSNorm, RoPE (``rotate_half``), GQA, SwiGLU.

HF layout: ``model.layers[l].self_attn.{q,k,v,o}_proj`` (``nn.Linear``, weight ``[out, in]``,
biases only with ``attention_bias``), ``mlp.{gate,up,down}_proj``, norms ``input_layernorm`` (attention)
and ``post_attention_layernorm`` (MLP), final ``model.norm``, ``lm_head`` (often tied to the embedding).
"""

from __future__ import annotations

from torch import Tensor

from lit_svd.models.base import AttnWeights, MLPWeights, ModelView, Sites, bias_of, split_heads_out


class LlamaView(ModelView):
    model_type = "llama"
    norm_kind = "rmsnorm"
    gated_mlp = True
    layers_path = "model.layers"
    norm_paths = ("input_layernorm", "post_attention_layernorm", "model.norm")

    def read_sizes(self) -> None:
        super().read_sizes()
        self.rotary_dim = self.d_head  # RoPE on every feature of a head

    def _rotary_module(self):
        return self.model.model.rotary_emb

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.model.model.embed_tokens(input_ids)

    def _raw_attn(self, layer: int) -> AttnWeights:
        at = self._layers[layer].self_attn
        h, kv, dh = self.n_heads, self.n_kv_heads, self.d_head
        rep = h // kv

        def expand(t: Tensor) -> Tensor:  # KV heads -> one per query head, as HF repeat_kv
            return t.repeat_interleave(rep, dim=0)

        return AttnWeights(
            W_Q=split_heads_out(at.q_proj.weight, h),
            b_Q=bias_of(at.q_proj, (h, dh)),
            W_K=expand(split_heads_out(at.k_proj.weight, kv)),
            b_K=expand(bias_of(at.k_proj, (kv, dh))),
            W_V=expand(split_heads_out(at.v_proj.weight, kv)),
            b_V=expand(bias_of(at.v_proj, (kv, dh))),
            W_O=at.o_proj.weight.T.reshape(h, dh, self.d_model),
            b_O=bias_of(at.o_proj, (self.d_model,)),
            scale=float(at.scaling),
        )

    def _raw_mlp(self, layer: int) -> MLPWeights:
        m = self._layers[layer].mlp
        return MLPWeights(
            W_in=m.up_proj.weight.T,
            b_in=bias_of(m.up_proj, (self.d_mlp,)),
            W_out=m.down_proj.weight.T,
            b_out=bias_of(m.down_proj, (self.d_model,)),
            act=m.act_fn,
            W_gate=m.gate_proj.weight.T,
            b_gate=bias_of(m.gate_proj, (self.d_mlp,)),
        )

    def _sites(self, layer: int) -> Sites:
        blk = self._layers[layer]
        at, m = blk.self_attn, blk.mlp
        return {
            "q": (at.q_proj, None),
            "k": (at.k_proj, None),
            "v": (at.v_proj, None),
            "o": (at.o_proj, None),
            "gate": (m.gate_proj, None),
            "up": (m.up_proj, None),
            "down": (m.down_proj, None),
        }
