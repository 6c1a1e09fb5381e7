"""Faithfulness curves of edge circuits on MIB's grid (docs/circuits.md, "Edge circuits"): a ranking of the edges
at one ``Level`` (``analysis.edges``), the circuit of its first edges at each size, scored with the edge ablation
(``analysis.edge_ablation``).

**Two size axes.** *Raw*: a circuit of fraction ``s`` keeps the first ``floor(s N)`` edges of its level (``N``: the
level's edge count; MIB's ``int(pct * n)``). *Fair (weighted)*: it keeps the longest prefix of the ranking whose
weighted edge count (``EdgeUniverse``: a direction edge weighs ``1 / (K_w K_r)``, a block 1) is at most
``s * n_blocks``. A head-level ranking is the same circuit on both axes; a direction ranking is compared with it at
matched weighted count on the fair axis. Ties are broken by reader unit, then by the edge's flat index in it.

**Rankings.** Signed scores (highest first) make the CPR curve, absolute scores the CMD curve (MIB). Random
circuits keep each edge of their level with probability ``s`` (seeded per reader unit, nested over the sizes):
their raw and weighted fractions are both ``s`` in expectation, so one random curve serves both axes (the realised
counts are reported).

**Block rankings** (``BlockRanking``, curves ``blocks_*``, ``headblocks_*``, ``coreblocks_*``): blocks (writer unit
x reader unit) in the order of a block score, the direction edges of a block by their own score, so that a signed
prefix keeps whole blocks instead of the positive edges of every block (whose writers cancel: docs/circuits.md);
``coreblocks`` first brings the top tenth of every block by |score|, then the rest. Their cuts need no selection
pass: a block weighs 1.

**Selection** over ~10^9 direction edges without sorting them: the scores' order-preserving integer keys are
histogrammed on their top 16 bits (counts, or weights on the fair axis), the bucket where the target falls is read
back edge by edge and sorted (``select``). The buckets are read off the floats' bits (``_bucket``: int32, no keys
formed but the candidates'), and the weighted histogram is integer counts per (edge weight, bucket), a reader unit's
edges having a few distinct weights. Scores may live in a memory-mapped file (``ScoreFile``). The cuts of a
direction curve's sizes are nested (prefixes of one order), so the selection's second pass also gives every edge's
*level* (how many of the cuts keep it, ``cut_levels``: the cuts ending in a lower bucket, plus, for the edges of the
cuts' own buckets, those whose prefix holds them) and each size reads its masks from the levels, not from the
scores.

``f``, CPR and CMD as ``analysis.faithfulness`` (``areas``: trapezoids over the grid's points only, ``f`` not
clipped); ``m(full)`` every edge kept (the clean forward), ``m(empty)`` none (the corrupted forward).
"""

from __future__ import annotations

import math
import signal
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import Tensor

from lit_svd.analysis.area_intervals import curve_intervals
from lit_svd.analysis.edge_ablation import AllEdges, Circuit, EdgeAblation, KeepLevels, NoEdges
from lit_svd.analysis.edge_attribution import EdgeScores
from lit_svd.analysis.edge_options import BLOCK_ORDERS, DIRECTION_ORDERS, FACTOR_ORDERS
from lit_svd.analysis.edges import EdgeUniverse, Level, ReaderUnit, WriterUnit
from lit_svd.analysis.faithfulness import MIB_SIZES, check_sizes, faithfulness_of, n_kept, reference_means

BUCKET_BITS = 16


@dataclass
class EdgeRanking:
    """An order of the edges of ``level``: ``scores(u)`` is reader unit ``u``'s scores (higher first), ``[K_u,
    n_cols]`` (``directions``), ``[K_u, n_up]`` (``writer_units``) or ``[1, n_up]`` (``units``)."""

    universe: EdgeUniverse
    level: Level
    scores: Callable[[ReaderUnit], Tensor]

    def weights(self, r: ReaderUnit) -> Tensor:
        """``[cols]`` float64: the weighted count of one edge of each column of ``r``'s scores."""
        u = self.universe
        if self.level == "units":
            return torch.ones(r.n_up, dtype=torch.float64)
        if self.level == "writer_units":
            return torch.full((r.n_up,), 1.0 / r.size, dtype=torch.float64)
        return u.block_weights(r)[u.col_unit[: r.n_cols].cpu()]

    def expand(self, r: ReaderUnit, mask: Tensor) -> Tensor:
        """``mask`` over ``r``'s edges of this level as a keep mask of direction edges ``[K_u, n_cols]``."""
        if self.level != "directions":
            mask = mask[:, self.universe.col_unit[: r.n_cols].to(mask.device)]
        return mask.expand(r.size, -1) if mask.shape[0] == 1 else mask

    def count(self) -> int:
        """The number of edges of this level."""
        return int(self.universe.counts()[self.level])


def absolute(ranking: EdgeRanking) -> EdgeRanking:
    """The same edges ranked by ``|score|`` (MIB's CMD ranking)."""
    return EdgeRanking(ranking.universe, ranking.level, lambda r: ranking.scores(r).abs())


def keys(x: Tensor) -> Tensor:
    """int64 keys with the order of the float scores ``x`` (float32 or float64; -0.0 below +0.0), spread over the
    whole int64 range (a float32's key in the top 32 bits), so that their top bits make the buckets of ``select``."""
    if x.dtype == torch.float64:
        b = x.contiguous().view(torch.int64)
        return torch.where(b < 0, b ^ 0x7FFFFFFFFFFFFFFF, b)
    return _keys32(x.float()).long() << 32


def _keys32(x: Tensor) -> Tensor:
    """int32 keys with the order of float32 scores (``keys`` is this shifted into the top 32 bits)."""
    b = x.contiguous().view(torch.int32)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


def _key_float(key: int, dtype: torch.dtype) -> float | None:
    """The score whose key is ``key`` (None where comparing scores would not keep the order of keys: a zero, whose
    signs the keys tell apart, a key that is no float32's, a NaN)."""
    if dtype == torch.float32:
        if key % (1 << 32):
            return None
        k, fmt, mask = key >> 32, "<i", 0x7FFFFFFF
    elif dtype == torch.float64:
        k, fmt, mask = key, "<q", 0x7FFFFFFFFFFFFFFF
    else:
        return None
    bits = k if k >= 0 else k ^ mask
    value = struct.unpack("<f" if fmt == "<i" else "<d", struct.pack(fmt, bits))[0]
    return None if value == 0.0 or math.isnan(value) or math.isinf(value) else value


@dataclass(frozen=True)
class Cut:
    """The first edges of a ranking: those with key above ``key``, and those with key ``key`` at a position (reader
    unit, flat index) up to ``(unit, index)``. ``kept``: how many edges, ``weight``: their weighted count."""

    key: int
    unit: int
    index: int
    kept: int
    weight: float

    def mask(self, r: ReaderUnit, k: Tensor) -> Tensor:
        """``k``'s keys (``r``'s scores) to the kept mask."""
        return self._mask(r, k, self.key)

    def _mask(self, r: ReaderUnit, k: Tensor, key: int | float) -> Tensor:
        if r.index < self.unit:
            return k >= key
        if r.index > self.unit:
            return k > key
        flat = torch.arange(k.numel(), device=k.device).reshape(k.shape)
        return (k > key) | ((k == key) & (flat <= self.index))

    def mask_of(self, r: ReaderUnit, scores: Tensor) -> Tensor:
        """``r``'s scores to the kept mask, ``mask(r, keys(scores))``, compared as floats where that keeps the keys'
        order (``_key_float``; no keys formed: one pass over the scores)."""
        value = _key_float(self.key, scores.dtype)
        return self.mask(r, keys(scores)) if value is None else self._mask(r, scores, value)


def select(ranking: EdgeRanking, targets: Sequence[float], weighted: bool) -> list[Cut]:
    """For each target, the cut keeping the longest prefix of the ranking whose edge count (``weighted``: weighted
    count) is at most the target (module docstring): two passes over the scores whatever the number of targets."""
    return _select(ranking, targets, weighted, False)[0]


def cut_levels(ranking: EdgeRanking, targets: Sequence[float], weighted: bool) -> CutLevels:
    """``select``'s cuts and every edge's level (``CutLevels``) from the same two passes: the second gives each
    edge the number of cuts ending in a lower bucket (which keep its whole bucket), then the edges of the cuts' own
    buckets (read back anyway) add the cuts whose prefix of their bucket holds them."""
    cuts, levels = _select(ranking, targets, weighted, True)
    assert levels is not None
    return CutLevels(ranking, cuts, levels)


def _select(
    ranking: EdgeRanking, targets: Sequence[float], weighted: bool, with_levels: bool
) -> tuple[list[Cut], _Levels | None]:
    """``select``'s cuts, and with ``with_levels`` each reader unit's levels (``cut_levels``)."""
    if with_levels and len(targets) > 255:
        raise ValueError(f"cut_levels: {len(targets)} cuts, at most 255 (uint8 levels)")
    u = ranking.universe
    n_buckets = 1 << BUCKET_BITS
    counts = torch.zeros(n_buckets, dtype=torch.long)
    weights = torch.zeros(n_buckets, dtype=torch.float64)
    for r in u.readers:
        values, kind = torch.unique(ranking.weights(r), return_inverse=True)  # a few distinct edge weights
        offset = (kind * n_buckets).to(torch.int32)
        per_kind = torch.zeros(len(values) * n_buckets, dtype=torch.long)
        for _, x in _score_rows(ranking, r):  # each edge counted in its (weight, bucket) bin
            per_kind += torch.bincount((_bucket(x) + offset).reshape(-1), minlength=len(per_kind))
        per_kind = per_kind.reshape(len(values), n_buckets)
        counts += per_kind.sum(0)
        weights += values @ per_kind.double()
    counts = counts.double()
    hist = weights if weighted else counts
    above, above_n, above_w = (_above(h) for h in (hist, counts, weights))
    total = float(hist.sum())
    found: dict[int, list[int]] = {}
    out: list[Cut | None] = [None] * len(targets)
    below = torch.zeros(n_buckets, dtype=torch.uint8)  # per bucket: the cuts that keep it whole
    for i, t in enumerate(targets):
        if t < 0:
            raise ValueError(f"select: target {t} < 0")
        if t >= total - _eps(t):
            out[i] = Cut(-(2**63), len(u.readers), 0, int(counts.sum()), float(weights.sum()))
            below += 1
            continue
        level = t + _eps(t)
        bucket = int(torch.nonzero((above <= level) & (above + hist > level)).flatten()[0])
        found.setdefault(bucket, []).append(i)
        below[bucket + 1 :] += 1
    cands, levels = _candidates(ranking, list(found), below if with_levels else None)
    for bucket, which in found.items():
        c = cands[bucket]
        w = c["weight"] if weighted else torch.ones(len(c["key"]), dtype=torch.float64)
        cum = float(above[bucket]) + w.cumsum(0)
        ends = torch.zeros(len(cum) + 1, dtype=torch.long)  # how many cuts end after each edge of this bucket
        for i in which:
            n = int((cum <= targets[i] + _eps(targets[i])).sum())
            ends[0] += 1
            ends[n] -= 1
            kept, weight = int(above_n[bucket]) + n, float(above_w[bucket]) + float(c["weight"][:n].sum())
            if n == 0:  # the prefix ends above this bucket: keep the keys above its largest
                out[i] = Cut(int(c["key"][0]), -1, -1, kept, weight)
            else:
                out[i] = Cut(int(c["key"][n - 1]), int(c["unit"][n - 1]), int(c["index"][n - 1]), kept, weight)
        if levels is not None:
            levels.add(c["unit"], c["index"], ends.cumsum(0)[:-1].to(torch.uint8))
    return [c for c in out if c is not None], levels


@dataclass
class _Levels:
    """Every reader unit's levels (uint8) in one buffer: unit ``i``'s are ``flat[offsets[i] : offsets[i + 1]]``."""

    flat: Tensor
    offsets: Tensor
    shapes: list[tuple[int, int]]

    @classmethod
    def empty(cls, ranking: EdgeRanking) -> _Levels:
        shapes = [ranking_shape(ranking, r) for r in ranking.universe.readers]
        offsets = torch.tensor([0] + [a * b for a, b in shapes]).cumsum(0)
        return cls(torch.empty(int(offsets[-1]), dtype=torch.uint8), offsets, shapes)

    def unit(self, i: int) -> Tensor:
        return self.flat[int(self.offsets[i]) : int(self.offsets[i + 1])].view(self.shapes[i])

    def add(self, unit: Tensor, index: Tensor, add: Tensor) -> None:
        """Add ``add`` to the levels of the edges ``(unit, flat index)`` (each edge once)."""
        at = self.offsets[unit] + index
        self.flat[at] += add


def ranking_shape(ranking: EdgeRanking, r: ReaderUnit) -> tuple[int, int]:
    """The shape of ``r``'s scores at the ranking's level."""
    rows = 1 if ranking.level == "units" else r.size
    return rows, r.n_cols if ranking.level == "directions" else r.n_up


def _above(hist: Tensor) -> Tensor:
    """``[n_buckets]``: the sum of ``hist`` over the buckets above each (higher keys)."""
    return hist.flip(0).cumsum(0).flip(0) - hist


def _eps(t: float) -> float:
    return 1e-9 * max(1.0, abs(t))


def _score_rows(ranking: EdgeRanking, r: ReaderUnit, elements: int = 1 << 22) -> Iterator[tuple[int, Tensor]]:
    """``r``'s scores in chunks of whole rows (at most ``elements`` each but one row): ``(flat start, scores [rows,
    cols])``, on the CPU, float32 or float64."""
    S = ranking.scores(r)
    rows = max(1, elements // max(1, S.shape[1]))
    for i in range(0, S.shape[0], rows):
        part = S[i : i + rows].cpu()
        yield i * S.shape[1], part if part.dtype == torch.float64 else part.float()


def _bucket(x: Tensor) -> Tensor:
    """int32 buckets of the scores ``x`` (float32 or float64, any shape): the top ``BUCKET_BITS`` of their keys
    (``keys``) plus ``2^(BUCKET_BITS - 1)``, so ``0 .. 2^BUCKET_BITS - 1`` in key order, read off the float's bits
    (a key flips a negative float's bits but the sign: so do its top bits) without forming the keys."""
    width = 64 if x.dtype == torch.float64 else 32
    bits = x.contiguous().view(torch.int64 if width == 64 else torch.int32)
    half = 1 << (BUCKET_BITS - 1)
    top = bits >> (width - BUCKET_BITS)
    top ^= (bits >> (width - 1)) & (half - 1)
    top += half
    return top.to(torch.int32)


def _candidates(
    ranking: EdgeRanking, buckets: Sequence[int], below: Tensor | None = None
) -> tuple[dict[int, dict[str, Tensor]], _Levels | None]:
    """Every edge of each bucket: keys, reader unit, flat index, weight, in rank order (key descending, then unit,
    then index); with ``below`` (``[n_buckets]`` uint8) also every edge's ``below[bucket]`` (``_Levels``)."""
    wanted = torch.zeros(1 << BUCKET_BITS, dtype=torch.bool)
    wanted[list(buckets)] = True
    levels = None if below is None else _Levels.empty(ranking)
    parts: dict[str, list[Tensor]] = {"bucket": [], "key": [], "unit": [], "index": [], "weight": []}
    for r in ranking.universe.readers:
        cols = ranking.weights(r)
        flat = None if levels is None else levels.unit(r.index).view(-1)
        for start, x in _score_rows(ranking, r):
            b = _bucket(x).reshape(-1)  # int32: index_select reads a table with it far faster than indexing
            if flat is not None and below is not None:
                flat[start : start + len(b)] = below.index_select(0, b)
            idx = torch.nonzero(wanted.index_select(0, b)).flatten()
            if not len(idx):
                continue
            parts["bucket"].append(b[idx].long())
            parts["key"].append(keys(x.reshape(-1)[idx]))
            parts["unit"].append(torch.full((len(idx),), r.index, dtype=torch.long))
            parts["index"].append(idx + start)
            parts["weight"].append(cols[idx % len(cols)])
    if not parts["key"]:
        return {}, levels
    got = {name: torch.cat(t) for name, t in parts.items()}
    order = torch.argsort(got["key"], descending=True, stable=True)  # units and indices came in ascending order
    got = {name: t[order] for name, t in got.items()}
    return {b: {name: t[got["bucket"] == b] for name, t in got.items()} for b in buckets}, levels


@dataclass
class RankedCircuit:
    """The first edges of a ranking (``Cut``) as a circuit (``edge_ablation.Circuit``)."""

    ranking: EdgeRanking
    cut: Cut

    def keep(self, r: ReaderUnit) -> Tensor | None:
        mask = self.cut.mask_of(r, self.ranking.scores(r)).to(self.ranking.universe.device)
        return None if bool(mask.all()) else self.ranking.expand(r, mask)

    def block_keep(self, r: ReaderUnit) -> Tensor | None:
        """``[n_up]``: the kept blocks of a head-level circuit (None at the finer levels)."""
        return self.cut.mask_of(r, self.ranking.scores(r))[0] if self.ranking.level == "units" else None


class CutLevels:
    """Nested cuts of one directions ranking (the sizes of a curve) as levels: per reader unit ``level [K_u, n_cols]``
    (uint8), how many of the cuts keep each edge (``cut_levels``: from the selection's passes), and its column
    minima / maxima (computed when first asked). A cut keeping ``n`` edges keeps those of level >= the number of
    cuts keeping at least ``n`` (``need``), because cuts are prefixes of one order."""

    def __init__(self, ranking: EdgeRanking, cuts: Sequence[Cut], levels: _Levels):
        self.ranking, self.cuts, self.levels = ranking, list(cuts), levels
        self._units: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def need(self, cut: Cut) -> int:
        return sum(c.kept >= cut.kept for c in self.cuts)

    def of(self, r: ReaderUnit, need: int) -> KeepLevels:
        if r.index not in self._units:
            level = self.levels.unit(r.index).to(self.ranking.universe.device)
            self._units[r.index] = level, level.amin(0), level.amax(0)
        return KeepLevels(*self._units[r.index], need)


@dataclass
class LeveledCircuit:
    """One cut of ``CutLevels`` (the edges of level >= ``need``): ``RankedCircuit``'s circuit, its mask read from the
    levels (``levels``, ``edge_ablation.KeepLevels``) instead of the scores."""

    cuts: CutLevels
    need: int

    def levels(self, r: ReaderUnit) -> KeepLevels:
        return self.cuts.of(r, self.need)

    def keep(self, r: ReaderUnit) -> Tensor | None:
        L = self.levels(r)
        return None if bool((L.low >= self.need).all()) else L.level >= self.need


def _none(r: ReaderUnit) -> Tensor:
    raise AssertionError("a shape-only ranking has no scores")


@dataclass
class RandomCircuit:
    """Each edge of ``level`` kept with probability ``fraction`` (uniforms seeded by ``seed`` and the reader unit: the
    circuits of one seed are nested over the fractions)."""

    universe: EdgeUniverse
    level: Level
    fraction: float
    seed: int

    def uniforms(self, r: ReaderUnit) -> Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + r.index)
        return torch.rand(ranking_shape(EdgeRanking(self.universe, self.level, _none), r), generator=g)

    def keep(self, r: ReaderUnit) -> Tensor | None:
        ranking = EdgeRanking(self.universe, self.level, self.uniforms)
        return ranking.expand(r, (self.uniforms(r) < self.fraction).to(self.universe.device))

    def block_keep(self, r: ReaderUnit) -> Tensor | None:
        """``[n_up]``: the kept blocks of a head-level circuit (None at the finer levels)."""
        return (self.uniforms(r) < self.fraction)[0] if self.level == "units" else None

    def sizes(self) -> tuple[int, float]:
        """``(edges kept at its level, weighted count)``."""
        ranking = EdgeRanking(self.universe, self.level, self.uniforms)
        kept, weight = 0, 0.0
        for r in self.universe.readers:
            m = self.uniforms(r) < self.fraction
            kept += int(m.sum())
            weight += float((m.double() * ranking.weights(r)).sum())
        return kept, weight


@dataclass
class EdgeCurve:
    """One curve: per size the edges kept at its level (``n_edges``), the weighted count as a fraction of the
    blocks (``weighted``), ``f`` (``values``) and the mean metric; CPR / CMD over ``sizes``; seconds; the 95 %
    bootstrap intervals of CPR / CMD and of ``f`` at each size (``[lo, hi]`` lists) over the prompts
    (``area_intervals``); the metric per size and prompt."""

    sizes: list[float]
    n_edges: list[int]
    weighted: list[float]
    values: list[float]
    metric: list[float]
    cpr: float
    cmd: float
    seconds: float = 0.0
    cpr_ci: list[float] | None = None
    cmd_ci: list[float] | None = None
    values_ci: list[list[float]] | None = None
    prompt_metric: list[list[float]] = field(default_factory=list)

    def row(self) -> dict:
        return asdict(self)


@dataclass
class CurveSpec:
    """One curve to draw: ``circuits(size) -> (circuit, n_edges, weighted count)`` for each size."""

    circuits: Callable[[Sequence[float]], list[tuple[Circuit, int, float]]]


def ranked_spec(ranking: EdgeRanking, axis: str) -> CurveSpec:
    """The circuits of ``ranking``'s first edges on the ``raw`` or ``fair`` (weighted) axis."""
    if axis not in ("raw", "fair"):
        raise ValueError(f"axis={axis!r}: choose raw or fair")
    u = ranking.universe

    def circuits(sizes: Sequence[float]) -> list[tuple[Circuit, int, float]]:
        if axis == "raw":
            targets = [float(n_kept(s, ranking.count())) for s in sizes]
        else:
            targets = [s * u.n_blocks for s in sizes]
        if ranking.level != "directions":
            cuts = select(ranking, targets, weighted=axis == "fair")
            return [(RankedCircuit(ranking, c), c.kept, c.weight) for c in cuts]
        levels = cut_levels(ranking, targets, weighted=axis == "fair")
        return [(LeveledCircuit(levels, levels.need(c)), c.kept, c.weight) for c in levels.cuts]

    return CurveSpec(circuits)


def random_spec(universe: EdgeUniverse, level: Level, seed: int) -> CurveSpec:
    """Random circuits of ``level`` (``RandomCircuit``)."""

    def circuits(sizes: Sequence[float]) -> list[tuple[Circuit, int, float]]:
        out: list[tuple[Circuit, int, float]] = []
        for s in sizes:
            c = RandomCircuit(universe, level, s, seed)
            out.append((c, *c.sizes()))
        return out

    return CurveSpec(circuits)


@dataclass
class BlockRanking:
    """Blocks (writer unit x reader unit, ``EdgeUniverse.block_offsets`` order) by ``block_scores`` (higher first,
    ties by block index), the direction edges of one block by ``within``'s scores (a ``directions`` ranking; higher
    first, ties by flat index): the edge analog of ``rankings.unit_rankings``. ``tiers`` (increasing fractions,
    the last 1): every block brings its first ``ceil(tier x edges)`` edges tier after tier, so ``(1.0,)`` keeps
    blocks whole one after the other and ``(0.1, 1.0)`` first the top tenth of every block (the block's *core*),
    then the rest. A prefix ends inside at most one block."""

    within: EdgeRanking
    block_scores: Tensor
    tiers: tuple[float, ...] = (1.0,)

    def __post_init__(self) -> None:
        u = self.within.universe
        if self.within.level != "directions" or self.block_scores.shape != (u.n_blocks,):
            raise ValueError(f"BlockRanking: a directions ranking and {u.n_blocks} block scores are needed")
        if not self.tiers or self.tiers[-1] != 1.0 or any(not 0 < a < b for a, b in zip(self.tiers, self.tiers[1:])):
            raise ValueError(f"BlockRanking: tiers={self.tiers}: increasing fractions in (0, 1], the last 1")
        n_up = torch.tensor([r.n_up for r in u.readers])
        self.reader = torch.repeat_interleave(torch.arange(len(u.readers)), n_up)  # [n_blocks]
        self.writer = torch.arange(u.n_blocks) - u.block_offsets[self.reader]
        self.edges = torch.tensor([r.size for r in u.readers])[self.reader] * u.writer_sizes[self.writer]
        scores = torch.nan_to_num(self.block_scores.double().cpu(), nan=-math.inf)
        order = torch.argsort(scores, descending=True, stable=True)
        # [n_tiers, n_blocks]: the edges of each block kept once its tier is in
        self.ends = torch.stack([torch.ceil(t * self.edges.double() - 1e-9).long().clamp(min=1) for t in self.tiers])
        # items: (block, edges kept before and after it) tier after tier, in block order
        self.item_block = order.repeat(len(self.tiers))
        self.item_end = self.ends[:, order].reshape(-1)
        self.item_start = torch.cat([torch.zeros_like(order), self.ends[:-1, order].reshape(-1)])
        self._thresholds: dict[int, tuple[Tensor, Tensor]] = {}

    def cuts(self, targets: Sequence[float], weighted: bool) -> list[BlockCircuit]:
        """For each target, the longest prefix whose edge count (``weighted``: weighted count) is at most it."""
        u = self.within.universe
        size = self.edges[self.item_block].double()
        per_item = (self.item_end - self.item_start).double()
        cum = (per_item / size if weighted else per_item).cumsum(0)
        out = []
        for t in targets:
            if t < 0:
                raise ValueError(f"BlockRanking: target {t} < 0")
            whole = int((cum <= t + _eps(t)).sum())
            n = torch.zeros(u.n_blocks, dtype=torch.long)
            n.scatter_reduce_(0, self.item_block[:whole], self.item_end[:whole], "amax")  # a block's last tier in
            if whole < len(cum):
                rest = t - (float(cum[whole - 1]) if whole else 0.0)
                edges = rest * (float(size[whole]) if weighted else 1.0)  # the budget left, in edges
                b = int(self.item_block[whole])
                n[b] = int(self.item_start[whole]) + int(math.floor(edges + _eps(edges)))
            weight = float((n.double() / self.edges.double()).sum())
            out.append(BlockCircuit(self, n, int(n.sum()), weight))
        return out

    def thresholds(self, tier: int) -> tuple[Tensor, Tensor]:
        """``(value, need)`` ``[n_blocks]``: the own score of each block's last edge kept at ``tier``'s end and how
        many edges of that score the tier keeps (the first by flat index); computed once, one pass over the
        scores."""
        if tier not in self._thresholds:
            u = self.within.universe
            value = torch.empty(u.n_blocks, dtype=torch.float64)
            need = torch.empty(u.n_blocks, dtype=torch.long)
            for r in u.readers:
                S, o = self.within.scores(r).cpu(), int(u.block_offsets[r.index])
                for w in u.writers[: r.n_up]:
                    part = S[:, w.offset : w.offset + w.size].reshape(-1)
                    k = int(self.ends[tier, o + w.index])
                    v = part.kthvalue(part.numel() - k + 1).values  # the k-th largest
                    value[o + w.index], need[o + w.index] = float(v), k - int((part > v).sum())
            self._thresholds[tier] = value, need
        return self._thresholds[tier]


@dataclass
class BlockCircuit:
    """A prefix of a ``BlockRanking``: ``n [n_blocks]`` edges kept of each block (its first by the ranking's own
    scores); ``kept_edges`` direction edges, ``weight`` their weighted count."""

    ranking: BlockRanking
    n: Tensor
    kept_edges: int
    weight: float

    def _counts(self, r: ReaderUnit) -> tuple[Tensor, Tensor]:
        o = self.ranking.within.universe.block_offsets
        part = slice(int(o[r.index]), int(o[r.index + 1]))
        return self.n[part], self.ranking.edges[part]

    def block_keep(self, r: ReaderUnit) -> Tensor | None:
        """``[n_up]``: the kept blocks of ``r`` where each is kept whole or not at all (else None: see ``keep``)."""
        n, edges = self._counts(r)
        return n > 0 if bool(((n == 0) | (n == edges)).all()) else None

    def keep(self, r: ReaderUnit) -> Tensor | None:
        """Blocks kept to a tier's end compare their scores with the tier's threshold (``BlockRanking.thresholds``),
        the one block kept elsewhere sorts its scores."""
        ranking, u = self.ranking, self.ranking.within.universe
        n, edges = self._counts(r)
        col = u.col_unit[: r.n_cols].cpu()
        mask = (n == edges)[col].expand(r.size, -1).clone()
        partial = (n > 0) & (n < edges)
        if not bool(partial.any()):
            return mask.to(u.device)
        S, o = ranking.within.scores(r).cpu(), int(u.block_offsets[r.index])
        for tier in range(len(ranking.tiers) - 1):
            at = partial & (n == ranking.ends[tier, o : o + r.n_up])
            if not bool(at.any()):
                continue
            partial &= ~at
            value, need = (t[o : o + r.n_up] for t in ranking.thresholds(tier))
            on, v = at[col], value[col].to(S.dtype)  # exact: the values are scores
            tied = (S == v) & on
            n_tied = torch.zeros(r.n_up, dtype=torch.long).index_add_(0, col, tied.sum(0))
            mask |= ((S > v) & on) | (tied & (n_tied == need)[col])
            for w in torch.nonzero(at & (n_tied != need)).flatten().tolist():  # the first tied edges only
                _keep_first(mask, tied, u.writers[w], int(need[w]))
        for w in torch.nonzero(partial).flatten().tolist():
            cols = slice(u.writers[w].offset, u.writers[w].offset + u.writers[w].size)
            part = S[:, cols]
            top = torch.zeros(part.numel(), dtype=torch.bool)
            top[torch.sort(part.reshape(-1), descending=True, stable=True).indices[: int(n[w])]] = True
            mask[:, cols] = top.reshape(part.shape)
        return mask.to(u.device)


def _keep_first(mask: Tensor, which: Tensor, w: WriterUnit, n: int) -> None:
    """Keep the first ``n`` edges (by flat index) of writer unit ``w``'s columns where ``which`` holds."""
    cols = slice(w.offset, w.offset + w.size)
    block = mask[:, cols].reshape(-1).clone()
    block[torch.nonzero(which[:, cols].reshape(-1)).flatten()[:n]] = True
    mask[:, cols] = block.reshape(mask[:, cols].shape)


def block_sums(scores: EdgeScores, gross: bool = False) -> Tensor:
    """``[n_blocks]`` float64: each block's summed direction edge scores (``gross``: ``(net, gross)``, the sums of
    the scores and of their magnitudes), one pass over the scores."""
    u = scores.universe
    net, total = torch.zeros(u.n_blocks, dtype=torch.float64), torch.zeros(u.n_blocks, dtype=torch.float64)
    for r in u.readers:
        part = slice(int(u.block_offsets[r.index]), int(u.block_offsets[r.index + 1]))
        S, col = scores.directions(r).double().cpu(), u.col_unit[: r.n_cols].cpu()
        net[part] = torch.zeros(r.n_up, dtype=torch.float64).index_add_(0, col, S.sum(0))
        if gross:
            total[part] = torch.zeros(r.n_up, dtype=torch.float64).index_add_(0, col, S.abs().sum(0))
    return torch.stack([net, total]) if gross else net


def net_over_gross(scores: EdgeScores, sums: Tensor | None = None) -> Tensor:
    """``[n_blocks]`` float64 in [0, 1]: ``|sum_e s_e| / sum_e |s_e|`` over each block's direction edges (0 where
    every score is 0): near 0 where the block's edges cancel. ``sums``: ``block_sums(scores, gross=True)`` if
    already computed."""
    net, gross = block_sums(scores, gross=True) if sums is None else sums
    return torch.where(gross > 0, net.abs() / gross.clamp(min=torch.finfo(torch.float64).tiny), 0.0)


def per_weight(universe: EdgeUniverse) -> Tensor:
    """``[n_blocks]`` float64: ``K_w K_r``, the number of direction edges of each block, the inverse of one edge's
    weighted count: a score times it is the score per unit of the fair axis."""
    return torch.cat([universe.block_sizes(r) for r in universe.readers])


def block_factor(scores: EdgeScores, order: str, sums: Tensor | None = None) -> Tensor:
    """``[n_blocks]``: the factor of a ``FACTOR_ORDERS`` ranking: ``netblocks`` ``net_over_gross`` (``sums``:
    ``block_sums(scores, gross=True)`` if already computed), ``perweight`` ``per_weight``."""
    if order == "netblocks":
        return net_over_gross(scores, sums)
    if order == "perweight":
        return per_weight(scores.universe)
    raise ValueError(f"order={order!r}: choose one of {FACTOR_ORDERS}")


def factor_ranking(scores: EdgeScores, sign: str, factor: Tensor) -> EdgeRanking:
    """Each direction edge by its score (``abs``: ``|s_e|``) times its block's ``factor [n_blocks]`` (``block_factor``),
    a ``directions`` ranking. ``netblocks``: edges of blocks whose scores cancel come later; ``perweight``: by score
    per unit of weighted edge count (``|s_e| K_w K_r``), the order that keeps the most score on the fair axis if
    scores add up."""
    u = scores.universe

    def ranked(r: ReaderUnit) -> Tensor:
        S = scores.directions(r)
        part = factor[int(u.block_offsets[r.index]) : int(u.block_offsets[r.index + 1])]
        block = part[u.col_unit[: r.n_cols].cpu()].to(S.device, S.dtype)
        return (S.abs() if sign == "abs" else S) * block

    return EdgeRanking(u, "directions", ranked)


def block_spec(ranking: BlockRanking, axis: str) -> CurveSpec:
    """The circuits of ``ranking``'s first edges on the ``raw`` (direction edges) or ``fair`` (weighted) axis."""
    if axis not in ("raw", "fair"):
        raise ValueError(f"axis={axis!r}: choose raw or fair")
    u = ranking.within.universe

    def circuits(sizes: Sequence[float]) -> list[tuple[Circuit, int, float]]:
        n = ranking.within.count()
        targets = [float(n_kept(s, n)) if axis == "raw" else s * u.n_blocks for s in sizes]
        return [(c, c.kept_edges, c.weight) for c in ranking.cuts(targets, weighted=axis == "fair")]

    return CurveSpec(circuits)


# CORE: the fraction of a block's edges in its core (``coreblocks``); the block orders: ``edge_options.BLOCK_ORDERS``
CORE = 0.1


LEVELS: tuple[Level, ...] = ("directions", "writer_units", "units")


def score_ranking(scores: EdgeScores, level: Level) -> EdgeRanking:
    """The signed ranking of ``scores`` at ``level``."""
    u = scores.universe
    if level == "directions":
        return EdgeRanking(u, level, scores.directions)
    if level == "writer_units":
        return EdgeRanking(u, level, scores.writer_units)
    return unit_ranking(u, scores.units)


def unit_ranking(universe: EdgeUniverse, values: Tensor) -> EdgeRanking:
    """The head-level edges (``units``) ranked by ``values [n_blocks]`` (``EdgeUniverse.block_offsets`` order)."""
    return EdgeRanking(universe, "units", lambda r: values[universe.blocks(r)][None])


def block_ranking(scores: EdgeScores, order: str, sign: str, sums: Tensor | None = None) -> BlockRanking:
    """``blocks`` (blocks by their summed direction scores, ``sums`` if given), ``headblocks`` (by head-level
    EAP-IG, ``scores.units``), the edges of a block by their own score; ``coreblocks``: by head-level EAP-IG, the
    top tenth of every block by |score| first (``CORE``), then the rest by |score|. ``abs``: blocks by magnitude,
    edges by |score|."""
    block = scores.units if order != "blocks" else block_sums(scores) if sums is None else sums
    within = EdgeRanking(scores.universe, "directions", scores.directions)
    if order == "coreblocks":
        return BlockRanking(absolute(within), block if sign == "signed" else block.abs(), (CORE, 1.0))
    return BlockRanking(within, block) if sign == "signed" else BlockRanking(absolute(within), block.abs())


def curve_specs(universe: EdgeUniverse, scores: EdgeScores | None, names: Sequence[str]) -> dict[str, CurveSpec]:
    """Curves by name: ``<level>_<signed|abs>_<raw|fair>`` (a ranking of ``scores``; level ``blocks`` /
    ``headblocks`` / ``coreblocks``: a ``BlockRanking``, ``block_ranking``; ``netblocks`` / ``perweight``:
    ``factor_ranking``) or ``random_<level>_<seed>``; one-line errors for others. The block sums (``blocks``,
    ``netblocks``) are computed once for every curve that needs them."""
    out = {}
    sums: Tensor | None = None
    for name in names:
        parts = name.split("_")
        if parts[0] == "random":
            level, seed = "_".join(parts[1:-1]), parts[-1]
            if level not in LEVELS or not seed.isdigit():
                raise ValueError(f"curve {name!r}: random curves are random_<level>_<seed>, level one of {LEVELS}")
            out[name] = random_spec(universe, level, int(seed))
            continue
        level, sign, axis = "_".join(parts[:-2]), parts[-2], parts[-1]
        if level not in LEVELS + DIRECTION_ORDERS or sign not in ("signed", "abs") or axis not in ("raw", "fair"):
            raise ValueError(
                f"curve {name!r}: give <level>_<signed|abs>_<raw|fair> (level one of"
                f" {', '.join(LEVELS + DIRECTION_ORDERS)}) or random_<level>_<seed>"
            )
        if scores is None:
            raise ValueError(f"curve {name!r} needs edge scores")
        if level in ("blocks", "netblocks") and sums is None:  # one pass over the scores for all such curves
            sums = block_sums(scores, gross=True)
        if level in BLOCK_ORDERS:
            net = sums[0] if level == "blocks" and sums is not None else None
            out[name] = block_spec(block_ranking(scores, level, sign, net), axis)
            continue
        if level in FACTOR_ORDERS:
            out[name] = ranked_spec(factor_ranking(scores, sign, block_factor(scores, level, sums)), axis)
            continue
        ranking = score_ranking(scores, cast(Level, level))  # one of LEVELS (checked above)
        out[name] = ranked_spec(ranking if sign == "signed" else absolute(ranking), axis)
    return out


@dataclass
class EdgeCurveSums:
    """Per-prompt metrics (prompts in batch order): ``full`` / ``empty`` ``[P]``, per curve ``[n_sizes, P]``;
    seconds per curve."""

    full: Tensor
    empty: Tensor
    curves: dict[str, Tensor] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def prompts(self) -> int:
        return len(self.full)


@torch.no_grad()
def edge_curves(
    ablation: EdgeAblation,
    batches: Iterable[dict],
    specs: Mapping[str, CurveSpec],
    sizes: Sequence[float] = MIB_SIZES,
    progress: Callable[[str], None] | None = None,
    ends: dict | None = None,
) -> tuple[dict[str, EdgeCurve], dict]:
    """The curve of every spec on the same prompts (``batches``) and sizes. Returns ``(curves, info)``; ``info``:
    ``m_full``, ``m_empty``, ``n_prompts``, ``prompt_full``, ``prompt_empty``, ``intervals``, ``n_blocks``,
    ``wall_s``. ``ends``: a dict that keeps the corrupted recordings and the per-prompt metrics of the two ends across
    calls on the same batches (filled by the first)."""
    sizes = check_sizes(sizes)
    u = ablation.u
    start = time.monotonic()
    batches = list(batches)
    ends = {} if ends is None else ends
    if "refs" not in ends:
        ends["refs"] = refs = [ablation.reference(b) for b in batches]
        ends["full"] = _per_prompt(ablation, batches, refs, AllEdges())
        ends["empty"] = _per_prompt(ablation, batches, refs, NoEdges(u))
    refs = ends["refs"]
    sums = EdgeCurveSums(ends["full"], ends["empty"])
    counts: dict[str, tuple[list[int], list[float]]] = {}
    for name, spec in specs.items():
        t0 = time.monotonic()
        circuits = spec.circuits(sizes)
        counts[name] = ([c[1] for c in circuits], [c[2] / u.n_blocks for c in circuits])
        rows = []
        for i, (circuit, _, _) in enumerate(circuits):
            rows.append(_per_prompt(ablation, batches, refs, circuit))
            if progress:
                progress(f"{name} {sizes[i]:g}")
        sums.curves[name] = torch.stack(rows)
        sums.seconds[name] = time.monotonic() - t0
    curves, info = curves_of(sums, sizes, counts)
    info["n_blocks"] = u.n_blocks
    info["wall_s"] = time.monotonic() - start
    return curves, info


def _per_prompt(ablation: EdgeAblation, batches: Sequence[dict], refs: Sequence, circuit: Circuit) -> Tensor:
    """``[P]`` float64: the metric of every prompt with ``circuit`` kept, in batch order."""
    return torch.cat([ablation.metric(b, circuit, ref).double().cpu() for b, ref in zip(batches, refs)])


def curves_of(
    sums: EdgeCurveSums, sizes: Sequence[float], counts: Mapping[str, tuple[list[int], list[float]]]
) -> tuple[dict[str, EdgeCurve], dict]:
    """Curves from the per-prompt metrics: ``f`` as a ratio of means, CPR / CMD (``faithfulness.faithfulness_of``)
    with their bootstrap intervals over the prompts (``area_intervals``; none for a single prompt). ``info``:
    ``m_full``, ``m_empty``, ``n_prompts``, ``prompt_full`` / ``prompt_empty`` (the per-prompt ends, for intervals
    of differences between curves scored on the same prompts), ``intervals`` (their method, level, resamples and the
    outputs where BCa fell back to percentiles)."""
    full, empty = reference_means(float(sums.full.sum()), float(sums.empty.sum()), sums.prompts, "edge curves")
    ci, about = curve_intervals(sizes, sums.curves, sums.full, sums.empty)
    out = {}
    for name, per_prompt in sums.curves.items():
        metric = per_prompt.mean(1).tolist()
        values, cpr, cmd = faithfulness_of(sizes, metric, full, empty)
        n_edges, weighted = counts[name]
        out[name] = EdgeCurve(
            list(sizes), n_edges, weighted, values, metric, cpr, cmd, sums.seconds.get(name, 0.0), **ci[name],
            prompt_metric=per_prompt.tolist(),
        )  # fmt: skip
    info: dict = {"m_full": full, "m_empty": empty, "n_prompts": sums.prompts}
    if about:
        info["intervals"] = about
    return out, info | {"prompt_full": sums.full.tolist(), "prompt_empty": sums.empty.tolist()}


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Within the block SIGTERM raises ``SystemExit`` (in the main thread), so that the unwinding removes the score
    files (``ScoreFile``: gigabytes in a temporary folder) instead of leaving them behind; the previous handler is
    restored after. Lightning's own handler only notes SIGTERM and carries on, which a long curve never checks."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ScoreFile(MutableMapping):
    """Direction edge scores (or gains: ``name``) of every reader unit (``[K_u, n_cols]`` each, float32) in one file,
    as a mapping from the reader unit's index (``edge_attribution.edge_scores``'s ``store`` or ``gains``): ``store[i]
    = scores`` writes a unit's, ``store[i]`` reads it back (a copy-on-write map of the file: only the pages used are
    read, nothing stays in memory; the operating system caches the file). The file lives in a temporary folder made
    inside ``folder`` (default: the system's) and is removed with the object; ``keep``: it is ``folder/<name>.f32``
    itself and stays (an existing file of the right size is opened as it is: mark its units ``written`` to read them
    back)."""

    def __init__(
        self, universe: EdgeUniverse, folder: str | Path | None = None, name: str = "scores", keep: bool = False
    ):
        sizes = [r.size * r.n_cols for r in universe.readers]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.shapes = {r.index: (r.size, r.n_cols) for r in universe.readers}
        self.written: set[int] = set()
        if keep:
            if folder is None:
                raise ValueError("ScoreFile(keep=True) needs a folder")
            self._dir: tempfile.TemporaryDirectory | None = None
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.path = Path(folder) / f"{name}.f32"
            if self.path.exists() and self.path.stat().st_size == self.nbytes:
                return
        else:
            self._dir = tempfile.TemporaryDirectory(dir=folder, prefix=f"edge_{name}_")
            self.path = Path(self._dir.name) / f"{name}.f32"
        with open(self.path, "wb") as f:
            f.truncate(self.nbytes)

    def __setitem__(self, index: int, scores: Tensor) -> None:
        data = scores.detach().float().cpu().contiguous().numpy().reshape(-1)
        if data.size != int(self.offsets[index + 1] - self.offsets[index]):
            raise ValueError(f"scores of reader unit {index}: {data.size} values, expected {self.shapes[index]}")
        with open(self.path, "r+b") as f:
            f.seek(int(self.offsets[index]) * 4)
            f.write(data.tobytes())
        self.written.add(index)

    def __getitem__(self, index: int) -> Tensor:
        if index not in self.written:
            raise KeyError(index)
        count = int(self.offsets[index + 1] - self.offsets[index])
        data = np.memmap(self.path, np.float32, "c", int(self.offsets[index]) * 4, (count,))
        return torch.from_numpy(data).reshape(self.shapes[index])

    def __delitem__(self, index: int) -> None:
        self.written.discard(index)

    def close(self) -> None:
        """Remove the file and its folder now (a kept file stays)."""
        if self._dir is not None:
            self._dir.cleanup()

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.written))

    def __len__(self) -> int:
        return len(self.written)

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1]) * 4
