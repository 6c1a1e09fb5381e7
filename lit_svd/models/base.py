"""The architecture-independent view of a causal LM's weights: the contract every layer above uses.

Nothing above ``lit_svd.models`` touches Hugging Face module names; it asks a view. One subclass per
architecture family (``gpt2.py``, ``gpt_neox.py``, ``llama.py``, ``gemma2.py``) fills in the abstract
methods. Shapes follow TransformerLens: ``W_Q, W_K, W_V: [n_heads, d_model, d_head]``,
``W_O: [n_heads, d_head, d_model]``; grouped-query K/V heads are expanded per query head.
With ``fold_norms=True`` (default) the norm scales (and LayerNorm biases) are folded into the weights
that read from them, so every weight acts on the *normalised* residual as returned by
``normalized(...)`` (centred and scaled to unit RMS, no affine part).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import Tensor, nn

from lit_svd.linalg import FactoredMatrix

Site = Literal["q", "k", "v", "o", "gate", "up", "down"]
SITES: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
NormPoint = Literal["attn", "mlp", "final"]


@dataclass
class AttnWeights:
    """One layer's attention, per query head (GQA expanded). Biases are zeros where the model has none."""

    W_Q: Tensor  # [n_heads, d_model, d_head]
    b_Q: Tensor  # [n_heads, d_head]
    W_K: Tensor  # [n_heads, d_model, d_head]
    b_K: Tensor  # [n_heads, d_head]
    W_V: Tensor  # [n_heads, d_model, d_head]
    b_V: Tensor  # [n_heads, d_head]
    W_O: Tensor  # [n_heads, d_head, d_model]
    b_O: Tensor  # [d_model]
    scale: float  # pre-softmax scores are (q . k) * scale


@dataclass
class MLPWeights:
    """One layer's MLP: ``out = act(x W_gate + b_gate) * (x W_in + b_in) W_out + b_out`` when gated,
    ``act(x W_in + b_in) W_out + b_out`` otherwise."""

    W_in: Tensor  # [d_model, d_mlp]
    b_in: Tensor  # [d_mlp]
    W_out: Tensor  # [d_mlp, d_model]
    b_out: Tensor  # [d_model]
    act: Callable[[Tensor], Tensor]
    W_gate: Tensor | None = None  # [d_model, d_mlp]
    b_gate: Tensor | None = None  # [d_mlp]


class ModelView(ABC):
    """Per-layer, per-head weights of one HF causal LM, and the hook points to run it modified."""

    model_type: str = ""

    def __init__(self, model: nn.Module, fold_norms: bool = True):
        self.model = model
        self.config = model.config
        self.fold_norms = fold_norms

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

    def check_layer(self, layer: int) -> int:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range: {self.model_type} has layers 0..{self.n_layers - 1}")
        return layer

    def check_head(self, head: int) -> int:
        if not 0 <= head < self.n_heads:
            raise IndexError(f"head {head} out of range: {self.model_type} has heads 0..{self.n_heads - 1}")
        return head

    # --- weights -----------------------------------------------------------------------------
    @abstractmethod
    def attn(self, layer: int) -> AttnWeights: ...

    @abstractmethod
    def mlp(self, layer: int) -> MLPWeights: ...

    @abstractmethod
    def unembed(self) -> tuple[Tensor, Tensor]:
        """``(W_U [d_model, vocab], b_U [vocab])`` acting on ``normalized("final", resid)``."""

    @abstractmethod
    def normalized(self, point: NormPoint, layer: int | None, resid: Tensor) -> Tensor:
        """The input the folded weights read: the norm at ``point`` applied to ``resid`` without its
        scale when ``fold_norms`` (exactly the model's norm output otherwise)."""

    @abstractmethod
    def final_norm(self, resid: Tensor) -> Tensor:
        """The model's own final norm, exactly as its forward applies it (Gemma: ``* (1 + w)``)."""

    # --- rotary ------------------------------------------------------------------------------
    @abstractmethod
    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Apply the architecture's rotary embedding to queries or keys ``x: [..., pos, d_head]``
        at integer ``positions: [pos]`` (identity when ``rotary_dim == 0``)."""

    # --- factored, bias-augmented matrices ---------------------------------------------------
    @abstractmethod
    def qk(self, layer: int, delta: int | None = None) -> FactoredMatrix:
        """Per head ``[n_heads, d_model+1, d_model+1]``: ``[1, x_q] M [1, x_k]^T`` is the pre-softmax
        score (scale included) of a query at position i and key at ``i + delta`` (``delta <= 0``
        for causal models; ignored for non-rotary models)."""

    @abstractmethod
    def ov(self, layer: int) -> FactoredMatrix:
        """Per head ``[n_heads, d_model+1, d_model]``: ``M = [b_V; W_V] W_O``. ``b_O`` is shared by
        all heads and is *not* included; it is added once per layer."""

    # --- hook points (the only place HF module names live) ------------------------------------
    @abstractmethod
    def site_module(self, layer: int, site: str) -> nn.Module:
        """The module that computes linear site ``site`` (q, k, v, o, gate, up, down) of ``layer``."""

    @abstractmethod
    def site_output(self, layer: int, site: str, output: Tensor) -> Tensor:
        """Slice ``site``'s own output out of ``site_module(...)``'s output (fused qkv layouts)."""

    @abstractmethod
    def block(self, layer: int) -> nn.Module:
        """The decoder block: its input is the residual stream before layer ``layer``."""
