"""The SVD of each map of a model, computed once per view: ``view_svd(view, layer, kind)``.

Every method that reads singular directions of a model's weights (the mask and direction-check components, the
faithfulness universe, SAD's QK bases, ...) calls ``view_svd``, and the view's ``SVDCache`` (``cache_of(view)``,
made on first use, gone with the view) computes each (layer, kind) once: in float64 from the view's folded
weights, signs fixed (``linalg.sign_fixed``: the largest entry of each left vector positive, so that no result
depends on the LAPACK build's choice of signs), kept in the view's analysis dtype (float32; float64 for a float64
model).

=============  ==============================================  ==========================================
kind           matrix (view method)                            groups
=============  ==============================================  ==========================================
``qk``         ``[b_Q; W_Q] scale [b_K; W_K]^T``                heads (``qk_unrotated``: Omega(0) with RoPE)
``ov``         ``[b_V; W_V] W_O`` (``ov``)                      heads
``q``, ``k``   ``[b_Q; W_Q]``, ``[b_K; W_K]`` (``q_map``,       heads; one map per KV head
               ``k_map``)
``mlp_*``      ``[b_in; W_in]``, ``mlp_gate``, ``mlp_out``      the layer (a batch of one)
=============  ==============================================  ==========================================

An entry is reused while the weights it was computed from are unchanged: the cache keeps, with each entry, the
version counters and devices of its block's parameters (an optimiser step, or any in-place edit, bumps a version),
and computes afresh when they differ. ``max_bytes`` bounds what is kept (least recently used entries go
first); ``computed`` counts the SVDs computed per (layer, kind).
"""

from __future__ import annotations

import weakref
from collections import Counter, OrderedDict

import torch

from lit_svd.addresses import DIRECTION_KINDS
from lit_svd.linalg import SVD, sign_fixed, svd_dense, svd_factored
from lit_svd.models.base import ModelView

MAX_BYTES = 4 * 2**30  # SmolLM2-135M: every kind of every layer is 0.7 GB in float32


@torch.no_grad()
def map_svd(view: ModelView, layer: int, kind: str) -> SVD:
    """The sign-fixed float64 SVD of map ``kind`` of ``layer`` (the table above), batched over its groups."""
    view.check_layer(layer)
    if kind in ("qk", "ov"):
        fm = view.qk_unrotated(layer) if kind == "qk" else view.ov(layer)
        return sign_fixed(svd_factored(fm.A.double(), fm.B.double()))
    if kind == "q":
        M = view.q_map(layer)
    elif kind == "k":
        M = view.k_map(layer)[:: view.n_heads // view.n_kv_heads]  # one map per KV head
    elif kind == "mlp_in":
        M = view.mlp_in(layer)[None]
    elif kind == "mlp_gate":
        M = view.mlp_gate(layer)[None]
    elif kind == "mlp_out":
        M = view.mlp_out(layer)[None]
    else:
        raise ValueError(f"kind={kind!r} is not a map with singular directions; allowed: {', '.join(DIRECTION_KINDS)}")
    return sign_fixed(svd_dense(M.double()))


def _bytes(svd: SVD) -> int:
    return sum(t.numel() * t.element_size() for t in (svd.U, svd.S, svd.V))


def stamp(view: ModelView, layer: int) -> tuple:
    """What an entry of ``layer`` depends on: its block's parameters' versions and devices (an optimiser step or
    any in-place edit of a weight bumps its version; a move to another device changes the device)."""
    return tuple((_version(p), p.device) for p in view.block(layer).parameters())


def _version(t: torch.Tensor) -> int | tuple[str, int]:
    """A tensor's version counter; an inference tensor (made under ``torch.inference_mode``, e.g. a weight an
    accelerate hook loaded during a test loop) has none: its storage stands for it."""
    try:
        return t._version
    except RuntimeError:
        return ("storage", t.data_ptr())


class SVDCache:
    """``cache.get(view, layer, kind)``: ``map_svd``, computed once while the block's weights are unchanged."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, str], tuple[tuple, SVD]] = OrderedDict()
        self.computed: Counter[tuple[int, str]] = Counter()

    def get(self, view: ModelView, layer: int, kind: str) -> SVD:
        key = (view.check_layer(layer), kind)
        now = stamp(view, layer)
        found = self.entries.get(key)
        if found is not None and found[0] == now:
            self.entries.move_to_end(key)
            return found[1]
        with torch.inference_mode(False):  # an entry made in a test loop serves a training run too
            svd = map_svd(view, layer, kind).to(view._dtype)
        self.computed[key] += 1
        self.entries[key] = (now, svd)
        self.entries.move_to_end(key)
        self._trim()
        return svd

    def _trim(self) -> None:
        while len(self.entries) > 1 and self.nbytes > self.max_bytes:
            self.entries.popitem(last=False)

    @property
    def nbytes(self) -> int:
        return sum(_bytes(svd) for _, svd in self.entries.values())

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"SVDCache({len(self)} maps, {self.nbytes / 2**20:.1f} MiB, {sum(self.computed.values())} computed)"


_CACHES: weakref.WeakKeyDictionary[ModelView, SVDCache] = weakref.WeakKeyDictionary()


def cache_of(view: ModelView) -> SVDCache:
    """The SVD cache of ``view`` (made on first use; it goes with the view)."""
    if view not in _CACHES:
        _CACHES[view] = SVDCache()
    return _CACHES[view]


def view_svd(view: ModelView, layer: int, kind: str) -> SVD:
    """The sign-fixed SVD of map ``kind`` of ``layer`` (module docstring), computed once per view."""
    return cache_of(view).get(view, layer, kind)
