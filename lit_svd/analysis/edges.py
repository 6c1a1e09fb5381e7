"""The edge universe of a model: which singular directions write into the residual stream, which read it, and the
edges between them (issue 33; docs/circuits.md, "Edge circuits").

**Writers** (residual order): the embedding (one node; its write is the whole residual entering block 0), each
head's OV directions (``v_k`` of ``[b_V; W_V] W_O``, coefficient ``z_h W_O v_k``, the head's mixed value along the
direction), each MLP's output directions (``v_k`` of ``[b_out; W_out]``, coefficient ``out . v_k`` with ``out`` the
down projection's output). A writer's write into the residual is ``coefficient * W`` with ``W`` its direction
times Gemma's post-norm gain (the post-norm factor belongs to the coefficient). Biases (``b_O``, a bias row inside
an augmented map) and LayerNorm biases are constant nodes: the same on every prompt, always kept, never an edge.
**Writer units** group them: the embedding, each head, each MLP.

**Readers** are the directions of the maps that read the residual through a norm: each head's query map (``q``,
per query head), each KV head's key map (``k``), each head's OV map read on the value side (``v``: coefficient
``sigma_k [1, x^] u_k`` at the source), each MLP's input and gate maps (``mlp``: the ``mlp_in`` directions then the
``mlp_gate`` ones, one unit: they share the MLP's input), and the logits (one reader: the residual entering the
final norm). A direction's read vector is ``r_k = sigma_k u_k`` on the augmented normalised input ``[1, x^]``.
**Reader units** group them by what reads one norm's output as one node in MIB's graph: a head's query input, a KV
head's key input, a head's value input, an MLP's input, the logits.

An **edge** joins an upstream writer direction and a reader direction; upstream means the layers before the
reader's (a sequential block's MLP also sees its own layer's heads; GPT-NeoX's parallel MLP does not). A
**block** is all edges between one writer unit and one reader unit: MIB's head-level edge. Three levels of edge
are offered (``Level``): ``directions`` (reader direction x writer direction), ``writer_units`` (reader direction x
writer unit) and ``units`` (reader unit x writer unit: the head-level edges of MIB's EAP-IG, the anchor). Every
circuit at any level is a set of direction edges (a coarser edge is all its direction edges).

**Sizes.** The raw size of a circuit is its number of edges at its own level. The fair size is its **weighted
edge count**: each direction edge weighs ``1 / (K_w K_r)`` (``K``: the number of directions of its writer unit and
of its reader unit), so a block counts 1 whatever its dimensions, a head-level circuit's weighted count is its
edge count, and a circuit of direction edges is measured in head-level edges (MIB's neuron-level weighting, a
fraction of each edge's writer and reader kept). Counts on SmolLM2 and Gemma-3: docs/circuits.md.

The bases are the view's SVDs (``models.svds.view_svd``: computed once per model, the same directions as every
other method's of the same address), combined in float64 and kept in the analysis dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch
from torch import Tensor

from lit_svd.addresses import EMBED_LAYER, Address
from lit_svd.models.base import ModelView, analysis_dtype
from lit_svd.models.svds import view_svd

Level = Literal["directions", "writer_units", "units"]
ReaderKind = Literal["q", "k", "v", "mlp", "logits"]
WriterKind = Literal["embed", "head", "mlp"]
ReadPoint = Literal["attn", "mlp", "final"]
POINT_OF: dict[str, ReadPoint] = {"q": "attn", "k": "attn", "v": "attn", "mlp": "mlp", "logits": "final"}


@dataclass(frozen=True)
class WriterUnit:
    """A writer unit: its ``size`` directions are columns ``offset .. offset + size - 1`` of the writer matrix."""

    index: int
    layer: int
    kind: WriterKind
    group: int
    size: int
    offset: int

    def __str__(self) -> str:
        if self.kind == "embed":
            return "embed"
        return f"L{self.layer}.h{self.group}" if self.kind == "head" else f"L{self.layer}.mlp"

    def address(self, k: int) -> Address:
        """The address of direction ``k`` of this unit."""
        if self.kind == "embed":
            return Address(EMBED_LAYER, "embed")
        return Address(self.layer, "ov", self.group, k) if self.kind == "head" else Address(self.layer, "mlp_out", 0, k)


@dataclass(frozen=True)
class ReaderUnit:
    """A reader unit: ``size`` reader directions, reading the writer units ``0 .. n_up - 1`` (their directions are
    columns ``0 .. n_cols - 1``); ``offset``: its first direction in the flat list of reader directions."""

    index: int
    layer: int
    kind: ReaderKind
    group: int
    size: int
    n_up: int
    n_cols: int
    offset: int

    @property
    def point(self) -> ReadPoint:
        return POINT_OF[self.kind]

    def __str__(self) -> str:
        if self.kind == "logits":
            return "logits"
        return f"L{self.layer}.mlp_in" if self.kind == "mlp" else f"L{self.layer}.{self.kind}.h{self.group}"


@dataclass
class ReaderBasis:
    """One reader unit's directions: ``R [K, d+1]`` the read vectors ``sigma_k u_k`` on ``[1, x^]``, ``Rc [K, d]``
    what they read of the residual (LayerNorm: centred), and how a change of each coefficient reaches its site:
    ``Y [K, d_out]`` (q / k: the site's raw output space; mlp: rows ``:split`` in ``mlp_in``'s output space, the rest
    in ``mlp_gate``'s),
    ``bias [d_out]`` the site output at ``x^ = 0`` (its map's bias row). ``v``: ``Y`` is the head's write ``v_k``
    ``[K, d]``, ``read [d_head, K]`` maps the KV head's value (minus ``bias``) to the coefficients."""

    R: Tensor
    Rc: Tensor
    Y: Tensor
    bias: Tensor
    read: Tensor | None = None
    split: int = 0  # mlp: how many of the K directions are mlp_in's (the rest are mlp_gate's)


class EdgeUniverse:
    """Writer and reader units of ``view``'s model, their bases (module docstring) and the edge counts.

    Args:
        view: a ``fold_norms=True`` view.
        dtype: the analysis dtype (default: the model's, float32 for bf16 / fp16 models).
    """

    @torch.no_grad()
    def __init__(self, view: ModelView, dtype: torch.dtype | None = None):
        if not view.fold_norms:
            raise ValueError("edge circuits need a view with fold_norms=True (weights acting on the norm output)")
        self.view = view
        self.dtype = dtype or analysis_dtype(view.model_dtype)
        self.device = next(view.model.parameters()).device
        self.writers: list[WriterUnit] = [WriterUnit(0, EMBED_LAYER, "embed", 0, 1, 0)]
        writes: list[Tensor] = [torch.zeros(1, view.d_model, dtype=self.dtype, device=self.device)]
        self.head_read: dict[int, Tensor] = {}  # layer -> W_O V [H, d_head, K]
        self.mlp_V: dict[int, Tensor] = {}  # layer -> [d, K]
        self._attn_units: dict[int, int] = {}  # layer -> number of writer units before its heads
        self._mlp_units: dict[int, int] = {}
        for l in range(view.n_layers):
            U, S, V = self.ov_svd(l)
            H, _, K = V.shape
            self.head_read[l] = (view.attn(l).W_O.double() @ V).to(self.dtype)
            gain = self._gain("attn", l)
            self._attn_units[l] = len(self.writers)
            for h in range(H):
                self._add_writer(l, "head", h, K)
                writes.append((V[h].T * gain).to(self.dtype))
            self._mlp_units[l] = len(self.writers)
            _, _, Vm = self._map_svd("mlp_out", l)
            self.mlp_V[l] = Vm.to(self.dtype)
            self._add_writer(l, "mlp", 0, Vm.shape[1])
            writes.append((Vm.T * self._gain("mlp", l)).to(self.dtype))
        self.W = torch.cat(writes)  # [n_writer_cols, d]: each writer direction's write (row 0: the embedding, unused)
        self.col_unit = torch.repeat_interleave(
            torch.arange(len(self.writers), device=self.device), torch.tensor([w.size for w in self.writers])
        )
        self.readers: list[ReaderUnit] = []
        for l in range(view.n_layers):
            up = self._attn_units[l]
            K_q, K_k, K_v = self._q_svd(l)[1].shape[-1], self._k_svd(l)[1].shape[-1], K
            for h in range(view.n_heads):
                self._add_reader(l, "q", h, K_q, up)
            for g in range(view.n_kv_heads):
                self._add_reader(l, "k", g, K_k, up)
            for h in range(view.n_heads):
                self._add_reader(l, "v", h, K_v, up)
            up_mlp = self._attn_units[l] if view.parallel_residual else self._mlp_units[l]
            K_mlp = sum(self._mlp_in_svd(l, kind)[1].shape[-1] for kind in self.mlp_kinds)
            self._add_reader(l, "mlp", 0, K_mlp, up_mlp)
        self._add_reader(view.n_layers, "logits", 0, 1, len(self.writers))
        self._bases: dict[int, ReaderBasis] = {}
        for l in range(view.n_layers):
            for u in self.reader_units("attn", l) + self.reader_units("mlp", l):
                self._bases[u.index] = self._basis(u)

    # --- construction ----------------------------------------------------------------------------
    def _gain(self, point: Literal["attn", "mlp"], layer: int) -> Tensor:
        aff = self.view.post_norm_affine(point, layer)
        return torch.ones((), dtype=torch.float64) if aff is None else aff.scale.double().to(self.device)

    def _add_writer(self, layer: int, kind: WriterKind, group: int, size: int) -> None:
        offset = self.writers[-1].offset + self.writers[-1].size
        self.writers.append(WriterUnit(len(self.writers), layer, kind, group, size, offset))

    def _add_reader(self, layer: int, kind: ReaderKind, group: int, size: int, n_up: int) -> None:
        n_cols = self.writers[n_up - 1].offset + self.writers[n_up - 1].size
        offset = 0 if not self.readers else self.readers[-1].offset + self.readers[-1].size
        self.readers.append(ReaderUnit(len(self.readers), layer, kind, group, size, n_up, n_cols, offset))

    @property
    def mlp_kinds(self) -> tuple[str, ...]:
        return ("mlp_in", "mlp_gate") if self.view.gated_mlp else ("mlp_in",)

    def ov_svd(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(U [H, d+1, K], S [H, K], V [H, d, K])`` of the heads' OV maps (float64; the ``ov`` component's)."""
        return self._map_svd("ov", layer)

    def _map_svd(self, kind: str, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """The view's SVD of map ``kind`` (``models.svds``: ``q`` per head, ``k`` per KV head, ``ov`` per head, the
        MLP's maps unbatched) in float64."""
        svd = view_svd(self.view, layer, kind)
        U, S, V = (t.double() for t in (svd.U, svd.S, svd.V))
        return (U[0], S[0], V[0]) if kind.startswith("mlp") else (U, S, V)

    def _q_svd(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        return self._map_svd("q", layer)

    def _k_svd(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        return self._map_svd("k", layer)

    def _mlp_in_svd(self, layer: int, kind: str) -> tuple[Tensor, Tensor, Tensor]:
        return self._map_svd(kind, layer)

    # --- sizes and counts ------------------------------------------------------------------------
    @property
    def n_writer_cols(self) -> int:
        return self.W.shape[0]

    @property
    def n_reader_directions(self) -> int:
        return self.readers[-1].offset + self.readers[-1].size

    def reader_units(self, point: ReadPoint, layer: int | None) -> list[ReaderUnit]:
        """The reader units reading ``point`` of ``layer`` (``final``: the logits)."""
        if point == "final":
            return [self.readers[-1]]
        return [u for u in self.readers if u.point == point and u.layer == layer]

    def writer_units(self, layer: int, kind: WriterKind) -> list[WriterUnit]:
        return [w for w in self.writers if w.layer == layer and w.kind == kind]

    @cached_property
    def block_offsets(self) -> Tensor:
        """``[n_readers + 1]``: reader unit ``u``'s blocks are ``block_offsets[u] .. block_offsets[u + 1] - 1`` in
        the flat list of blocks (one per upstream writer unit, in writer order)."""
        return torch.tensor([0, *torch.tensor([u.n_up for u in self.readers]).cumsum(0).tolist()])

    def blocks(self, u: ReaderUnit) -> slice:
        """Reader unit ``u``'s blocks in the flat list of blocks (``block_offsets``)."""
        return slice(int(self.block_offsets[u.index]), int(self.block_offsets[u.index + 1]))

    @property
    def n_blocks(self) -> int:
        return int(self.block_offsets[-1])

    @cached_property
    def writer_sizes(self) -> Tensor:
        return torch.tensor([w.size for w in self.writers])

    def counts(self) -> dict[str, int]:
        """Edges at each ``Level`` and the units / directions they join."""
        sizes = self.writer_sizes
        directions = sum(u.size * u.n_cols for u in self.readers)
        writer_units = sum(u.size * u.n_up for u in self.readers)
        return {
            "directions": int(directions),
            "writer_units": int(writer_units),
            "units": self.n_blocks,
            "reader_units": len(self.readers),
            "reader_directions": self.n_reader_directions,
            "writer_units_n": len(self.writers),
            "writer_directions": int(sizes.sum()),
        }

    def block_sizes(self, u: ReaderUnit) -> Tensor:
        """``[n_up]`` float64: the direction edges of each block of ``u``, ``K_w K_r``."""
        return self.writer_sizes[: u.n_up].double() * u.size

    def block_weights(self, u: ReaderUnit) -> Tensor:
        """``[n_up]`` float64: the weight of one direction edge of each block of ``u``, ``1 / (K_w K_r)``."""
        return 1.0 / self.block_sizes(u)

    # --- names -----------------------------------------------------------------------------------
    def reader_address(self, u: ReaderUnit, k: int) -> Address:
        """The address of reader direction ``k`` of ``u`` (the logits: ``Address(n_layers, "b_U")``, the unembedding
        read as one node)."""
        if u.kind == "logits":
            return Address(self.view.n_layers, "b_U")
        if u.kind == "mlp":
            n_in = self.basis(u).split
            return Address(u.layer, "mlp_in", 0, k) if k < n_in else Address(u.layer, "mlp_gate", 0, k - n_in)
        return Address(u.layer, "ov" if u.kind == "v" else u.kind, u.group, k)

    def writer_address(self, col: int) -> Address:
        """The address of writer column ``col``."""
        w = self.writers[int(self.col_unit[col])]
        return w.address(col - w.offset)

    # --- reader bases ----------------------------------------------------------------------------
    def basis(self, u: ReaderUnit) -> ReaderBasis:
        """The bases of reader unit ``u`` (the logits have none: they read the residual itself)."""
        if u.kind == "logits":
            raise ValueError("the logits read the residual itself: they have no direction basis")
        return self._bases[u.index]

    @torch.no_grad()
    def _basis(self, u: ReaderUnit) -> ReaderBasis:
        v, l = self.view, u.layer
        read = None
        split = 0
        if u.kind in ("q", "k"):
            U, S, V = (self._q_svd if u.kind == "q" else self._k_svd)(l)
            U, S, V = U[u.group], S[u.group], V[u.group]
            raw = self._raw_qk(l, u.kind, u.group)
            if raw is None:  # the site outputs the map itself
                Y = V.T
                bias = (v.q_map(l) if u.kind == "q" else self._k_map(l))[u.group, 0]
            else:  # per-head norm after the site: the map is raw * gain, the site outputs raw
                Y, bias = _raw_directions(raw, U, S), raw[0]
        elif u.kind == "v":
            U, S, V = (t[u.group] for t in self.ov_svd(l))
            Y, read = V.T, self.head_read[l][u.group]
            bias = v.ov(l).A[u.group, 0]
        else:
            parts = [self._mlp_in_svd(l, kind) for kind in self.mlp_kinds]
            U = torch.cat([p[0] for p in parts], 1)
            S = torch.cat([p[1] for p in parts])
            split = parts[0][1].shape[-1]
            Y = torch.cat([p[2].T for p in parts])  # [K_in + K_gate, d_mlp]: rows split between the two maps
            bias = torch.cat([getattr(v, kind)(l)[0] for kind in self.mlp_kinds])  # [d_mlp * n_maps]
        R = (U * S).T
        Rc = R[:, 1:]
        if v.norm_kind == "layernorm":
            Rc = Rc - Rc.mean(-1, keepdim=True)
        cast = lambda t: t.to(device=self.device, dtype=self.dtype)  # noqa: E731
        return ReaderBasis(cast(R), cast(Rc), cast(Y), cast(bias), None if read is None else cast(read), split)

    def _k_map(self, layer: int) -> Tensor:
        return self.view.k_map(layer)[:: self.view.n_heads // self.view.n_kv_heads]

    def _raw_qk(self, layer: int, kind: str, group: int) -> Tensor | None:
        """The raw augmented map ``[d+1, d_head]`` of a head's query / a KV head's key where a per-head norm follows
        the site (Gemma-3, Qwen3), None elsewhere."""
        maps = self.view.head_norm_maps(layer)
        if maps is None:
            return None
        Q, K, _ = maps
        return Q[group] if kind == "q" else K[:: self.view.n_heads // self.view.n_kv_heads][group]


def _raw_directions(raw: Tensor, U: Tensor, S: Tensor) -> Tensor:
    """``[K, d_head]``: each direction's output in the raw site space, ``raw^T u_k / sigma_k`` (the map is ``raw``
    times the head norm's gain, ``sum_k sigma_k u_k v_k^T``); 0 for directions of no singular value."""
    ok = S > S.max() * S.shape[-1] * torch.finfo(S.dtype).eps
    return ((raw.double().T @ U) / torch.where(ok, S, torch.ones_like(S)) * ok).T
