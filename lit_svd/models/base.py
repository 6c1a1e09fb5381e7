"""The architecture-independent view of a causal LM's weights: the contract every layer above uses.

Nothing above ``lit_svd.models`` touches Hugging Face module names; it asks a view. One subclass per
architecture family (``gpt2.py``, ``gpt_neox.py``, ``llama.py``, ``gemma2.py``, ``gemma3.py``, ``qwen2.py``,
``qwen3.py``) says where the weights live and how they are laid out; everything else (norm folding, bias
augmentation, rotary matrices, per-head query / key norms, factored QK / OV products) is done once, here.
Shapes follow TransformerLens: ``W_Q, W_K, W_V: [n_heads, d_model, d_head]``, ``W_O: [n_heads, d_head,
d_model]``; grouped-query K/V heads are expanded per query head (query head ``h`` reads K/V head
``h // (n_heads // n_kv_heads)``, as HF's ``repeat_kv``).

With ``fold_norms=True`` (default) the norm scales (Gemma: ``1 + w``) and LayerNorm biases are folded
into the weights that read from them, so every weight acts on the *normalised* residual as returned by
``normalized(...)`` (centred for LayerNorm, divided by ``sqrt(mean square + eps)``, no affine part).
With ``fold_norms=False`` weights are the model's own and act on the norm's output.

Augmented matrices act on ``[1, x]`` (the leading 1 carries the biases):

* ``qk(layer, delta)``: ``[n_heads, d_model+1, d_model+1]``, ``[1, x_i] M [1, x_j]^T`` is the
  pre-softmax score (``scale`` included) of query position ``i`` and key position ``j = i + delta``.
  Rotary models: ``M(delta) = s [b_Q; W_Q] R_i R_j^T [b_K; W_K]^T`` in the model's own convention
  (HF ``rotate_half`` on the first ``rotary_dim`` features of each head). Gemma-2 scores are *pre*
  soft-cap: the model then applies ``attn_softcap * tanh(score / attn_softcap)``.
  Gemma-3 and Qwen3 (``q_norm`` / ``k_norm``, an RMSNorm on each head's query and key): the norms' gains are
  folded into ``M``, and the model's score is ``f_q(i) f_k(j) [1, x_i] M [1, x_j]^T`` with the per-token,
  per-head positive factors ``(f_q, f_k) = qk_factors(layer, x)`` (1 / RMS of the head's raw query and
  key); ``qk`` leaves them out because they depend on the token, not on the weights.
* ``ov(layer)``: ``[n_heads, d_model+1, d_model]``, ``M = [b_V; W_V] W_O``. The output bias ``b_O`` is
  shared by all heads and is **not** in any head's matrix: a layer's attention output is
  ``sum_h sum_j A_h[i, j] [1, x_j] M_h + b_O``. (Gemma-2 then applies its post-attention norm.)
* ``mlp_in / mlp_gate``: ``[d_model+1, d_mlp]`` augmented input maps; ``mlp_out``: ``[d_mlp+1, d_model]``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lit_svd.choices import SITES, Site, check_choice, choices
from lit_svd.linalg import FactoredABt
from lit_svd.models.points import (  # noqa: F401  (NormPoint, PostNormPoint, HFModule: re-exported)
    ActivationCache,
    HFModule,
    NormPoint,
    Point,
    PostNormPoint,
    run_with_cache,
)

NORM_POINTS: tuple[NormPoint, ...] = choices(NormPoint)
HeadNormSite = Literal["q", "k"]
# Where each site sits: its module and the part of that module's output that is the site (``_sites``).
Sites = dict[str, tuple[HFModule, slice | tuple[int, int] | None]]


@dataclass
class AttnWeights:
    """One layer's attention, per query head (GQA expanded). Biases are zeros where the model has none."""

    W_Q: Float[Tensor, "n_heads d_model d_head"]
    b_Q: Float[Tensor, "n_heads d_head"]
    W_K: Float[Tensor, "n_heads d_model d_head"]
    b_K: Float[Tensor, "n_heads d_head"]
    W_V: Float[Tensor, "n_heads d_model d_head"]
    b_V: Float[Tensor, "n_heads d_head"]
    W_O: Float[Tensor, "n_heads d_head d_model"]
    b_O: Float[Tensor, " d_model"]
    scale: float  # pre-softmax scores are (q . k) * scale

    @classmethod
    def fused(
        cls,
        W: Float[Tensor, "3 n_heads d_model d_head"],
        b: Float[Tensor, "3 n_heads d_head"],
        W_O: Float[Tensor, "n_heads d_head d_model"],
        b_O: Float[Tensor, " d_model"],
        scale: float,
    ) -> AttnWeights:
        """From ``[q, k, v]`` stacked weights and biases (a fused ``qkv`` projection: GPT-2, GPT-NeoX)."""
        return cls(W_Q=W[0], b_Q=b[0], W_K=W[1], b_K=b[1], W_V=W[2], b_V=b[2], W_O=W_O, b_O=b_O, scale=scale)


def bias_of(module: HFModule, shape: tuple[int, ...]) -> Tensor:
    """A projection's bias as ``shape``, zeros (of its weight's dtype and device) where it has none."""
    if module.bias is not None:
        return module.bias.reshape(shape)
    return torch.zeros(shape, dtype=module.weight.dtype, device=module.weight.device)


@dataclass
class MLPWeights:
    """One layer's MLP: ``out = act(x W_gate + b_gate) * (x W_in + b_in) W_out + b_out`` when gated,
    ``act(x W_in + b_in) W_out + b_out`` otherwise. Biases are zeros where the model has none."""

    W_in: Float[Tensor, "d_model d_mlp"]
    b_in: Float[Tensor, " d_mlp"]
    W_out: Float[Tensor, "d_mlp d_model"]
    b_out: Float[Tensor, " d_model"]
    act: Callable[[Tensor], Tensor]
    W_gate: Float[Tensor, "d_model d_mlp"] | None = None
    b_gate: Float[Tensor, " d_mlp"] | None = None

    def __call__(self, x: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """The MLP applied to ``x: [..., d_model]`` (the input these weights read)."""
        pre = x @ self.W_in + self.b_in
        if self.W_gate is None or self.b_gate is None:  # the views set both or neither
            return self.act(pre) @ self.W_out + self.b_out
        hidden = self.act(x @ self.W_gate + self.b_gate) * pre
        return hidden @ self.W_out + self.b_out


@dataclass
class NormAffine:
    """A norm's effective elementwise affine part: ``out = normalised * scale + bias``."""

    scale: Float[Tensor, " d_model"]  # Gemma's (1 + w) already applied
    bias: Float[Tensor, " d_model"] | None  # LayerNorm's; None for RMSNorm
    eps: float


def augment(
    W: Float[Tensor, "*batch d_in d_out"], b: Float[Tensor, "*batch d_out"]
) -> Float[Tensor, "*batch d_in+1 d_out"]:
    """``[b; W]``: prepend the bias as row 0.

    ``W: [..., d_in, d_out]``, ``b: [..., d_out]`` -> ``[..., d_in+1, d_out]``."""
    return torch.cat([b.unsqueeze(-2), W], dim=-2)


def split_heads_out(weight: Float[Tensor, "out d_in"], n: int) -> Float[Tensor, "n d_in d_head"]:
    """An ``nn.Linear`` weight ``[n * d_head, d_in]`` -> per head ``[n, d_in, d_head]``."""
    out, d_in = weight.shape
    return weight.reshape(n, out // n, d_in).transpose(1, 2)


def augment_inputs(x: Float[Tensor, "*batch d"]) -> Float[Tensor, "*batch d+1"]:
    """``[..., d] -> [1, x]``: ``[..., 1 + d]`` with a leading constant 1 (the bias coordinate)."""
    return torch.cat([torch.ones_like(x[..., :1]), x], dim=-1)


def inverse_rms(
    xa: Float[Tensor, "*batch T D"], maps: Float[Tensor, "h D c"], eps: float
) -> Float[Tensor, "*batch h T"]:
    """``1 / RMS`` of each head's map of ``xa: [..., T, D]`` through ``maps: [h, D, c]`` -> ``[..., h, T]``
    (the per-token factor of a per-head query / key RMSNorm)."""
    return torch.rsqrt(torch.einsum("...tD,hDc->...htc", xa, maps.to(xa.dtype)).pow(2).mean(-1) + eps)


def analysis_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the analysis maths runs in for a model held in ``dtype``: float64 stays float64, everything
    narrower (bfloat16, float16) computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _upcast(x: Tensor) -> Tensor:
    """Norm statistics in at least float32 (float64 stays float64)."""
    return x if x.dtype == torch.float64 else x.float()


def rotate_half(x: Float[Tensor, "*batch d"]) -> Float[Tensor, "*batch d"]:
    """HF's rotary pairing: features ``(i, i + d/2)`` rotate together."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ModelView(ABC):
    """Per-layer, per-head weights of one HF causal LM, and the hook points to run it modified.

    Subclasses say where the blocks and norms live (``layers_path``, ``norm_paths``), extend ``read_sizes``
    where the config names differ, and implement the ``_``-prefixed weight accessors and ``_sites``; everything
    public is derived here.
    """

    model_type: str = ""
    attn_softcap: float | None = None  # Gemma-2: scores pass through cap * tanh(score / cap)
    final_softcap: float | None = None  # Gemma-2: logits pass through cap * tanh(logit / cap)
    parallel_residual: bool = False  # GPT-NeoX: the MLP reads the block input, not input + attention
    # per-head query / key RMSNorms (Gemma-3, Qwen3): their module names in the attention module, and the
    # axis of the heads in their output (1: [batch, heads, pos, d_head], Gemma-3; 2: [batch, pos, heads, d_head], Qwen3)
    head_norm_names: tuple[str, str] | None = None
    head_norm_heads_dim: Literal[1, 2] = 1

    model: HFModule
    config: Any  # the model's PretrainedConfig: its keys differ per architecture

    def __init__(self, model: nn.Module, fold_norms: bool = True):
        self.model = model
        self.config = model.config
        self.fold_norms = fold_norms
        self.read_sizes()

    # --- where the modules live (dotted paths, as ``nn.Module.get_submodule`` takes them) -----------
    layers_path: str = ""  # the decoder blocks, from the model ("model.layers")
    norm_paths: tuple[str, str, str] = ("", "", "")  # attention and MLP norms (in a block), final norm (from the model)
    attention_path: str = "self_attn"  # the attention module, in a block (its output is (out, pattern) under eager)
    mlp_path: str = "mlp"  # the MLP module, in a block (input: the MLP's normalised input; output: the down site's)
    d_mlp_key: str = "intermediate_size"  # the config's MLP width (unset: 4 * d_model, as GPT-2's n_inner)

    # --- sizes -------------------------------------------------------------------------------
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int
    gated_mlp: bool
    rotary_dim: int  # 0 for learned absolute positions (GPT-2)
    norm_kind: Literal["layernorm", "rmsnorm"]

    def read_sizes(self) -> None:
        """Set the size attributes from the HF config's common names (``num_hidden_layers``,
        ``num_attention_heads``, ``num_key_value_heads`` or n_heads, ``hidden_size``, ``head_dim`` or
        d_model / n_heads, ``d_mlp_key``, ``vocab_size``); subclasses add what is theirs (``rotary_dim``)."""
        cfg = self.config
        self.n_layers = cfg.num_hidden_layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.d_model = cfg.hidden_size
        self.d_head = getattr(cfg, "head_dim", None) or self.d_model // self.n_heads
        self.d_mlp = getattr(cfg, self.d_mlp_key, None) or 4 * self.d_model
        self.vocab_size = cfg.vocab_size

    def sizes(self) -> dict[str, int | bool | str]:
        """All size attributes as one dict (for logs and results.json)."""
        keys = (
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_model",
            "d_head",
            "d_mlp",
            "vocab_size",
            "gated_mlp",
            "rotary_dim",
            "norm_kind",
        )
        return {"model_type": self.model_type, **{k: getattr(self, k) for k in keys}}

    def check_layer(self, layer: int) -> int:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range: {self.model_type} has layers 0..{self.n_layers - 1}")
        return layer

    def check_head(self, head: int) -> int:
        if not 0 <= head < self.n_heads:
            raise IndexError(f"head {head} out of range: {self.model_type} has heads 0..{self.n_heads - 1}")
        return head

    def check_site(self, site: str) -> Site:
        allowed = SITES if self.gated_mlp else tuple(s for s in SITES if s != "gate")
        return check_choice("site", site, allowed, where=f" for {self.model_type}")

    def _check_point(self, point: str, layer: int | None) -> None:
        check_choice("point", point, NormPoint)
        if point != "final":
            if layer is None:
                raise ValueError(f"norm point {point!r} needs a layer (got None)")
            self.check_layer(layer)

    # --- what each architecture supplies ------------------------------------------------------
    @abstractmethod
    def _raw_attn(self, layer: int) -> AttnWeights:
        """The model's own attention weights per head (GQA expanded), acting on the norm's output."""

    @abstractmethod
    def _raw_mlp(self, layer: int) -> MLPWeights:
        """The model's own MLP weights, acting on the norm's output."""

    def _raw_unembed(self) -> tuple[Tensor, Tensor]:
        """``(W_U [d_model, vocab], b_U [vocab])`` acting on the final norm's output: the output embedding's."""
        head = self.model.get_output_embeddings()
        return head.weight.T, bias_of(head, (self.vocab_size,))

    @property
    def _layers(self) -> HFModule:  # the nn.ModuleList of decoder blocks
        return self.model.get_submodule(self.layers_path)

    @contextlib.contextmanager
    def materialized(self, layer: int | None) -> Iterator[None]:
        """Block ``layer``'s weights (None: those outside the blocks: embeddings, final norm, unembedding) on
        their execution device for the duration, where an accelerate device map offloaded them (CPU or disk
        offload leaves ``meta`` tensors until a forward loads them); nothing for a model held in memory."""
        with contextlib.ExitStack() as stack:
            for mod in self._offloaded(layer):
                from accelerate.utils import align_module_device

                stack.enter_context(align_module_device(mod))
            yield

    def _offloaded(self, layer: int | None) -> list[nn.Module]:
        """The modules under block ``layer`` (None: outside every block) whose accelerate hook offloads their
        weights and whose weights are not loaded now (a forward in progress has loaded them already)."""
        if not getattr(self.model, "hf_device_map", None):
            return []
        if layer is not None:
            roots = [self._layers[layer]]
        else:
            blocks = self._layers
            roots = [m for m in self.model.modules() if m is not blocks and not any(m is b for b in blocks)]
            roots = [m for m in roots if not any(m is c for b in blocks for c in b.modules())]
        out, seen = [], set()
        for root in roots:
            for mod in root.modules() if layer is not None else [root]:
                hook = getattr(mod, "_hf_hook", None)
                if id(mod) in seen or hook is None or not getattr(hook, "offload", False):
                    continue
                seen.add(id(mod))
                if any(p.device.type == "meta" for p in mod.parameters()):
                    out.append(mod)
        return out

    def norm_module(self, point: NormPoint, layer: int | None) -> nn.Module:
        """The norm module read by the attention (``"attn"``), the MLP (``"mlp"``) or the unembedding."""
        self._check_point(point, layer)
        attn, mlp, final = self.norm_paths
        if point == "final":
            return self.model.get_submodule(final)
        return self._layers[layer].get_submodule(attn if point == "attn" else mlp)

    @abstractmethod
    def _rotary_module(self) -> nn.Module | None:
        """HF's rotary embedding module (``forward(x, position_ids) -> (cos, sin)``), None if no rotary."""

    @abstractmethod
    def embed(self, input_ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering layer 0 for ``input_ids: [batch, pos]`` (token embeddings, scaled
        by ``sqrt(d_model)`` for Gemma, plus learned positions for GPT-2)."""

    # --- norms ---------------------------------------------------------------------------------
    def norm_affine(self, point: NormPoint, layer: int | None = None) -> NormAffine:
        """The effective affine part of a norm (Gemma's ``1 + w`` included)."""
        self._check_point(point, layer)
        with self.materialized(None if point == "final" else layer):
            return self._affine_of(self.norm_module(point, layer))

    def _affine_of(self, mod: HFModule) -> NormAffine:
        eps = getattr(mod, "eps", None)
        if eps is None:
            eps = mod.variance_epsilon
        weight = getattr(mod, "weight", None)
        if weight is None:  # a norm without an affine part
            weight = torch.ones(self.d_model, device=self._device, dtype=self._dtype)
        bias = getattr(mod, "bias", None)
        return NormAffine(
            self._norm_scale(weight.to(self._dtype)), None if bias is None else bias.to(self._dtype), float(eps)
        )

    def _norm_scale(self, weight: Tensor) -> Tensor:
        return weight

    def normalized(
        self, point: NormPoint, layer: int | None, resid: Float[Tensor, "*batch d_model"]
    ) -> Float[Tensor, "*batch d_model"]:
        """The input the view's weights read: the norm at ``point`` applied to ``resid`` without its
        affine part when ``fold_norms`` (exactly the model's norm output otherwise)."""
        self._check_point(point, layer)
        if not self.fold_norms:
            return self.norm_module(point, layer)(resid)
        x = _upcast(resid)
        if self.norm_kind == "layernorm":
            x = x - x.mean(-1, keepdim=True)
        return x * self._factor(x, self.norm_affine(point, layer).eps)  # float32 for a bf16 / fp16 residual

    @staticmethod
    def _factor(centred: Tensor, eps: float) -> Tensor:
        return torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)

    def norm_factor(
        self, point: NormPoint, layer: int | None, resid: Float[Tensor, "*batch d_model"]
    ) -> Float[Tensor, "*batch 1"]:
        """``[..., 1]``: the per-token factor ``1 / sqrt(mean square + eps)`` (of the centred residual for
        LayerNorm) by which the norm at ``point`` divides; ``normalized = centred(resid) * norm_factor``. The
        one non-linear step between the residual and a reader: frozen at its clean value, the read is linear."""
        self._check_point(point, layer)
        x = _upcast(resid)
        if self.norm_kind == "layernorm":
            x = x - x.mean(-1, keepdim=True)
        return self._factor(x, self.norm_affine(point, layer).eps)

    def final_norm(self, resid: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch d_model"]:
        """The model's own final norm, exactly as its forward applies it (Gemma: ``* (1 + w)``)."""
        return self.norm_module("final", None)(resid)

    def post_norm(
        self, point: PostNormPoint, layer: int, out: Float[Tensor, "*batch d_model"]
    ) -> Float[Tensor, "*batch d_model"]:
        """What the block adds to the residual from a sub-layer's output: identity except Gemma-2 / Gemma-3,
        which normalise attention and MLP outputs (``post_attention`` / ``post_feedforward`` norms)."""
        mod = self.post_norm_module(point, layer)
        return out if mod is None else mod(out)

    def post_norm_module(self, point: PostNormPoint, layer: int) -> nn.Module | None:
        """The RMSNorm a sub-layer's output passes before the residual add (Gemma's sandwich norms), None
        where the output is added as it is."""
        check_choice("point", point, PostNormPoint)
        return None

    def post_norm_affine(self, point: PostNormPoint, layer: int) -> NormAffine | None:
        """The post norm's gain (``1 + w``) and eps; None without post norms."""
        mod = self.post_norm_module(point, self.check_layer(layer))
        if mod is None:
            return None
        with self.materialized(layer):
            return self._affine_of(mod)

    def post_norm_factor(
        self, point: PostNormPoint, layer: int, out: Float[Tensor, "*batch d_model"]
    ) -> Float[Tensor, "*batch 1"] | None:
        """``[..., 1]``: the post norm's per-token factor ``1 / rms(out)``, so that ``post_norm(out) =
        out * post_norm_factor * gain``: linear in ``out`` once the factor is frozen. None without post norms."""
        aff = self.post_norm_affine(point, layer)
        return None if aff is None else self._factor(_upcast(out), aff.eps)

    def attention_module(self, layer: int) -> nn.Module:
        """The attention module of ``layer``: output ``(attn_out, pattern)``, the pattern only under eager."""
        return self._layers[self.check_layer(layer)].get_submodule(self.attention_path)

    def mlp_module(self, layer: int) -> nn.Module:
        """The MLP module of ``layer``: input the normalised residual (the up / gate sites' input), output the
        ``down`` site's output (before any post-MLP norm)."""
        return self._layers[self.check_layer(layer)].get_submodule(self.mlp_path)

    def unfolded(self) -> ModelView:
        """The same model's view with ``fold_norms=False`` (weights as the model holds them)."""
        return self if not self.fold_norms else type(self)(self.model, fold_norms=False)

    def run_with_cache(
        self, points: Iterable[str | tuple[str, int] | Point], input_ids: Tensor, attention_mask: Tensor | None = None
    ) -> ActivationCache:
        """One forward of the model; the named activation points (``lit_svd.models.points``) as an
        ``ActivationCache``. ``points``: names (every layer) or ``(name, layer)`` pairs."""
        return run_with_cache(self, points, input_ids, attention_mask)

    def _fold(self, point: NormPoint, layer: int | None, W: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """Fold the norm's affine into ``W: [..., d_model, d_out]``, ``b: [..., d_out]``."""
        if not self.fold_norms:
            return W, b
        aff = self.norm_affine(point, layer)
        b = b if aff.bias is None else b + torch.einsum("d,...do->...o", aff.bias, W)
        return aff.scale[:, None] * W, b

    # --- weights -----------------------------------------------------------------------------
    @torch.no_grad()
    def attn(self, layer: int) -> AttnWeights:
        """Per-head attention weights (norm folded into W_Q, W_K, W_V and their biases)."""
        with self.materialized(self.check_layer(layer)):
            raw = self._cast(self._raw_attn(layer))
            gains = None  # the head norms' gains act on each head's features
            if self.head_norm_names is not None:
                gains = [self._affine_of(self.head_norm_module(layer, s)).scale for s in ("q", "k")]
        W_Q, b_Q = self._fold("attn", layer, raw.W_Q, raw.b_Q)
        W_K, b_K = self._fold("attn", layer, raw.W_K, raw.b_K)
        if gains is not None:
            g_q, g_k = gains
            W_Q, b_Q, W_K, b_K = W_Q * g_q, b_Q * g_q, W_K * g_k, b_K * g_k
        W_V, b_V = self._fold("attn", layer, raw.W_V, raw.b_V)
        return AttnWeights(W_Q, b_Q, W_K, b_K, W_V, b_V, raw.W_O, raw.b_O, raw.scale)

    @torch.no_grad()
    def mlp(self, layer: int) -> MLPWeights:
        """The MLP's weights (norm folded into W_in, W_gate and their biases)."""
        with self.materialized(self.check_layer(layer)):
            raw = self._cast(self._raw_mlp(layer))
        W_in, b_in = self._fold("mlp", layer, raw.W_in, raw.b_in)
        W_gate, b_gate = raw.W_gate, raw.b_gate
        if W_gate is not None and b_gate is not None:  # the views set both or neither
            W_gate, b_gate = self._fold("mlp", layer, W_gate, b_gate)
        return MLPWeights(W_in, b_in, raw.W_out, raw.b_out, raw.act, W_gate, b_gate)

    @torch.no_grad()
    def unembed(self) -> tuple[Float[Tensor, "d_model vocab"], Float[Tensor, " vocab"]]:
        """``(W_U [d_model, vocab], b_U [vocab])`` acting on ``normalized("final", None, resid)``;
        the logits before Gemma-2's final soft-cap."""
        with self.materialized(None):
            W_U, b_U = self._raw_unembed()
        return self._fold("final", None, W_U.to(self._dtype), b_U.to(self._dtype))

    @property
    def W_E(self) -> Float[Tensor, "vocab d_model"]:
        """Token embedding matrix ``[vocab, d_model]`` as the residual receives it (Gemma: scaled)."""
        emb = self.model.get_input_embeddings()
        with self.materialized(None):
            weight = emb.weight.to(self._dtype)
        return weight * getattr(emb, "embed_scale", torch.tensor(1.0)).to(weight.dtype)

    def _cast(self, weights):
        """An ``AttnWeights`` / ``MLPWeights`` with every tensor in the analysis dtype (a bf16 / fp16 model's
        weights are read in float32)."""
        for name, value in vars(weights).items():
            if isinstance(value, Tensor):
                setattr(weights, name, value.to(self._dtype))
        return weights

    @property
    def _device(self) -> torch.device:
        """Where the analysis runs: the device of the first parameter held in memory (an offloaded model's
        ``meta`` parameters are skipped; all offloaded: the CPU)."""
        for p in self.model.parameters():
            if p.device.type != "meta":
                return p.device
        return torch.device("cpu")

    # --- rotary ------------------------------------------------------------------------------
    def rotate(
        self, x: Float[Tensor, "*batch pos d_head"], positions: Int[Tensor, " pos"], layer: int | None = None
    ) -> Float[Tensor, "*batch pos d_head"]:
        """Apply the architecture's rotary embedding to queries or keys ``x: [..., pos, d_head]``
        at integer ``positions: [pos]`` (identity when ``rotary_dim == 0``). ``layer`` matters where
        layers differ in their rotary base (Gemma-3: local on sliding-window layers, global on full ones)."""
        rotary = self._rotary_module()
        if rotary is None:
            return x
        cos, sin = self._cos_sin(rotary, x, positions.reshape(1, -1).to(x.device), layer)  # [1, pos, rotary_dim]
        cos, sin = cos[0].to(x.dtype), sin[0].to(x.dtype)
        r = cos.shape[-1]
        x_rot, x_pass = x[..., :r], x[..., r:]
        return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)

    def _cos_sin(self, rotary: nn.Module, x: Tensor, position_ids: Tensor, layer: int | None) -> tuple[Tensor, Tensor]:
        """HF's rotary module called as the model calls it (one base for every layer by default)."""
        return rotary(x, position_ids)

    def rotary_matrix(self, position: int, layer: int | None = None) -> Float[Tensor, "d_head d_head"]:
        """``R_p: [d_head, d_head]`` with ``rotate(x, [p], layer) = x @ R_p`` (identity without rotary)."""
        return self.rotary_matrices(torch.tensor([position]), layer)[0]

    def rotary_matrices(
        self, positions: Int[Tensor, " P"], layer: int | None = None
    ) -> Float[Tensor, "P d_head d_head"]:
        """``[len(positions), d_head, d_head]``: ``R_p`` for each position."""
        eye = torch.eye(self.d_head, device=self._device, dtype=self._dtype)
        rows = self.rotate(eye[:, None, :].expand(-1, len(positions), -1), positions, layer)  # [d_head, P, d_head]
        return rows.transpose(0, 1)

    # --- which keys a query sees, and the per-head query / key norms ---------------------------
    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (a query at ``i`` sees keys ``j`` with ``i - window < j <= i``),
        None for full causal attention (Gemma-2 / Gemma-3 alternate or interleave sliding layers)."""
        types = getattr(self.config, "layer_types", None)
        if types is not None and types[self.check_layer(layer)] == "sliding_attention":
            return int(self.config.sliding_window)
        return None

    def visible_keys(self, layer: int, position: int) -> range:
        """The key positions that query ``position`` of ``layer`` attends to (without padding)."""
        window = self.window(layer)
        return range(0 if window is None else max(0, position - window + 1), position + 1)

    def head_norm_maps(
        self, layer: int
    ) -> tuple[Float[Tensor, "n_heads d_model+1 d_head"], Float[Tensor, "n_heads d_model+1 d_head"], float] | None:
        """Models with an RMSNorm on each head's query and key (Gemma-3, Qwen3 ``q_norm`` / ``k_norm``): the
        augmented raw query and key maps ``[n_heads, d_model+1, d_head]`` (input norm folded like
        ``attn``, *without* the head norms' gains) whose per-token RMS divides the query / key, and the
        norms' eps. None for every other model."""
        if self.head_norm_names is None:
            return None
        with self.materialized(self.check_layer(layer)):
            plain = self._cast(self._raw_attn(layer))
            eps = self._affine_of(self.head_norm_module(layer, "q")).eps
        W_Q, b_Q = self._fold("attn", layer, plain.W_Q, plain.b_Q)
        W_K, b_K = self._fold("attn", layer, plain.W_K, plain.b_K)
        return augment(W_Q, b_Q).detach(), augment(W_K, b_K).detach(), eps

    def head_norm_module(self, layer: int, site: HeadNormSite) -> nn.Module | None:
        """The module applying the per-head query (``q``) or key (``k``) norm (K/V heads not expanded; its
        output's head axis is ``head_norm_heads_dim``); None for models without one."""
        check_choice("site", site, HeadNormSite)
        if self.head_norm_names is None:
            return None
        return self.attention_module(layer).get_submodule(self.head_norm_names[0 if site == "q" else 1])

    def head_norm_output(self, out: Tensor) -> Tensor:
        """A head norm module's output as the site's own output ``[batch, pos, heads * d_head]``."""
        return (out.transpose(1, 2) if self.head_norm_heads_dim == 1 else out).flatten(-2)

    def with_head_norm_output(self, out: Tensor, value: Tensor) -> Tensor:
        """``value: [batch, pos, heads * d_head]`` laid out as the head norm module's output ``out``."""
        if self.head_norm_heads_dim == 1:
            return value.reshape(*value.shape[:-1], out.shape[1], -1).transpose(1, 2)
        return value.reshape(out.shape)

    @torch.no_grad()
    def qk_factors(
        self, layer: int, x: Float[Tensor, "*batch pos d_model"]
    ) -> tuple[Float[Tensor, "*batch n_heads pos"], Float[Tensor, "*batch n_heads pos"]] | None:
        """The per-token, per-head positive factors ``(f_q, f_k)``, each ``[..., n_heads, pos]``, of inputs
        ``x: [..., pos, d_model]`` (``normalized("attn", layer, resid)``): the score of heads with query /
        key norms is ``f_q(i) f_k(j) [1, x_i] qk(layer, j - i) [1, x_j]^T``. None without head norms."""
        maps = self.head_norm_maps(self.check_layer(layer))
        if maps is None:
            return None
        Q, K, eps = maps
        xa = augment_inputs(x)
        return inverse_rms(xa, Q, eps), inverse_rms(xa, K, eps)

    @property
    def model_dtype(self) -> torch.dtype:
        """The dtype the model runs in (its parameters')."""
        return next(self.model.parameters()).dtype

    @property
    def _dtype(self) -> torch.dtype:
        """The dtype every weight the view returns is in: ``analysis_dtype(model_dtype)`` (float32 for a bf16 /
        fp16 model, the model's own otherwise)."""
        return analysis_dtype(self.model_dtype)

    # --- factored, bias-augmented matrices ---------------------------------------------------
    @torch.no_grad()
    def qk(self, layer: int, delta: int | Sequence[int] | Tensor | None = None) -> FactoredABt:
        """Per head ``[n_heads, d_model+1, d_model+1]``: ``[1, x_q] M [1, x_k]^T`` is the pre-softmax
        score (scale included; Gemma-2: before the soft-cap; Gemma-3: times ``qk_factors``) of a query at
        position i and a key at ``j = i + delta`` (``delta <= 0`` for causal models; ignored for non-rotary
        models, required for rotary ones). Computed at ``i = max(0, -delta)``; RoPE depends only on ``j - i``.
        A sequence of offsets gives ``[len(delta), n_heads, d_model+1, d_model+1]`` in one pass."""
        fm = self.qk_unrotated(layer)
        if not self.rotary_dim:
            return fm
        A, B = fm.A, fm.B
        if delta is None:
            raise ValueError(
                f"delta=None: {self.model_type} uses rotary positions, qk needs the key offset"
                " delta = key position - query position (an int, <= 0 for causal attention)"
            )
        deltas = torch.as_tensor(delta, dtype=torch.long).reshape(-1)
        q_pos = (-deltas).clamp_min(0)
        R_q, R_k = self.rotary_matrices(q_pos, layer), self.rotary_matrices(q_pos + deltas, layer)  # [n, dh, dh]
        A = A.unsqueeze(0) @ R_q.unsqueeze(1)  # [n, h, d+1, d_head]
        B = B.unsqueeze(0) @ R_k.unsqueeze(1)
        if isinstance(delta, int) or (isinstance(delta, Tensor) and delta.dim() == 0):
            A, B = A[0], B[0]
        return FactoredABt(A, B)

    @torch.no_grad()
    def qk_unrotated(self, layer: int) -> FactoredABt:
        """``A = [b_Q; W_Q] * scale`` and ``B = [b_K; W_K]`` per head, ``[n_heads, d_model+1, d_head]``,
        before any rotary rotation: ``qk(layer)`` itself without rotary, ``qk(layer, 0)`` with it; a rotary
        score is ``rotate([1, x_q] A, i) . rotate([1, x_k] B, j)``."""
        w = self.attn(layer)
        return FactoredABt(augment(w.W_Q, w.b_Q) * w.scale, augment(w.W_K, w.b_K))

    @torch.no_grad()
    def ov(self, layer: int) -> FactoredABt:
        """Per head ``[n_heads, d_model+1, d_model]``: ``M = [b_V; W_V] W_O``. ``b_O`` is shared by
        all heads and is *not* included; it is added once per layer."""
        w = self.attn(layer)
        return FactoredABt(augment(w.W_V, w.b_V), w.W_O.mT)

    @torch.no_grad()
    def q_map(self, layer: int) -> Float[Tensor, "n_heads d_model+1 d_head"]:
        """Per head augmented query map ``[n_heads, d_model+1, d_head]``: ``[1, x] @ it`` = the query
        before rotary and scale (the map to mask where a rotary QK product cannot be; Gemma-3: the
        normalised query up to the per-token factor ``f_q``, the ``q_norm`` gain folded)."""
        w = self.attn(layer)
        return augment(w.W_Q, w.b_Q)

    @torch.no_grad()
    def k_map(self, layer: int) -> Float[Tensor, "n_heads d_model+1 d_head"]:
        """Per head augmented key map ``[n_heads, d_model+1, d_head]`` (GQA expanded), before rotary."""
        w = self.attn(layer)
        return augment(w.W_K, w.b_K)

    @torch.no_grad()
    def mlp_in(self, layer: int) -> Float[Tensor, "d_model+1 d_mlp"]:
        """Augmented MLP input map ``[d_model+1, d_mlp]`` (``up`` for gated MLPs): ``[1, x] @ it``."""
        w = self.mlp(layer)
        return augment(w.W_in, w.b_in)

    @torch.no_grad()
    def mlp_gate(self, layer: int) -> Float[Tensor, "d_model+1 d_mlp"]:
        """Augmented gate map ``[d_model+1, d_mlp]`` of a gated MLP."""
        if not self.gated_mlp:
            raise ValueError(f"mlp_gate: {self.model_type} has no gated MLP; use mlp_in")
        w = self.mlp(layer)
        assert w.W_gate is not None and w.b_gate is not None  # gated_mlp: the view sets both
        return augment(w.W_gate, w.b_gate)

    @torch.no_grad()
    def mlp_out(self, layer: int) -> Float[Tensor, "d_mlp+1 d_model"]:
        """Augmented MLP output map ``[d_mlp+1, d_model]``: ``[1, hidden] @ it`` is the MLP output."""
        w = self.mlp(layer)
        return augment(w.W_out, w.b_out)

    # --- hook points (the only place HF module names live) ------------------------------------
    @abstractmethod
    def _sites(self, layer: int) -> Sites:
        """Per site: the module that computes it and where its output sits in that module's output
        (None: the whole output; a slice of the last dim; ``(k, 3)``: part k of a per-head
        interleaved fused qkv, GPT-NeoX)."""

    def block(self, layer: int) -> nn.Module:
        """The decoder block: its input is the residual stream before layer ``layer``."""
        return self._layers[self.check_layer(layer)]

    def site_module(self, layer: int, site: str) -> nn.Module:
        """The module that computes linear site ``site`` (q, k, v, o, gate, up, down) of ``layer``
        (fused qkv models: the same module for q, k and v; slice with ``site_output``)."""
        return self._sites(self.check_layer(layer))[self.check_site(site)][0]

    def _site_index(self, output: Tensor, part: slice | tuple[int, int] | None) -> Tensor:
        if part is None:
            return output
        if isinstance(part, slice):
            return output[..., part]
        k, n = part
        per_head = output.reshape(*output.shape[:-1], self.n_heads, n, -1)
        return per_head[..., k, :].flatten(-2)

    def site_is_whole_output(self, layer: int, site: str) -> bool:
        """Whether ``site_module(layer, site)`` computes ``site`` alone (its whole output; not a fused qkv)."""
        return self._sites(self.check_layer(layer))[self.check_site(site)][1] is None

    def site_output(
        self, layer: int, site: str, output: Float[Tensor, "*batch d_module"]
    ) -> Float[Tensor, "*batch d_out"]:
        """Slice ``site``'s own output ``[..., d_out]`` out of ``site_module(...)``'s output (q / k / v
        heads concatenated head-major, K/V *not* GQA-expanded: exactly the model's projection)."""
        return self._site_index(output, self._sites(self.check_layer(layer))[self.check_site(site)][1])

    def with_site_output(
        self, layer: int, site: str, output: Float[Tensor, "*batch d_module"], value: Float[Tensor, "*batch d_out"]
    ) -> Float[Tensor, "*batch d_module"]:
        """``output`` of ``site_module(...)`` with ``site``'s part replaced by ``value`` (not in place,
        differentiable): what a forward hook returns to modify one site of a fused projection."""
        part = self._sites(self.check_layer(layer))[self.check_site(site)][1]
        if part is None:
            return value
        if isinstance(part, slice):
            start, stop, _ = part.indices(output.shape[-1])
            return torch.cat([output[..., :start], value, output[..., stop:]], dim=-1)
        k, n = part
        per_head = list(output.reshape(*output.shape[:-1], self.n_heads, n, -1).unbind(-2))
        per_head[k] = value.reshape(*value.shape[:-1], self.n_heads, -1)
        return torch.stack(per_head, dim=-2).flatten(-3)

    @torch.no_grad()
    def site_weight(self, layer: int, site: str) -> tuple[Float[Tensor, "d_in d_out"], Float[Tensor, " d_out"] | None]:
        """``(W [d_in, d_out], b [d_out] or None)`` with ``site_output = input @ W + b`` for the input
        the site module receives (the model's own, unfolded weights; K/V not GQA-expanded)."""
        mod: HFModule = self.site_module(layer, site)
        with self.materialized(layer):
            W = mod.weight if type(mod).__name__ == "Conv1D" else mod.weight.T  # GPT-2 Conv1D is [in, out]
            W = W.to(self._dtype)
            b = None if getattr(mod, "bias", None) is None else self.site_output(layer, site, mod.bias.to(self._dtype))
        return self.site_output(layer, site, W), b
