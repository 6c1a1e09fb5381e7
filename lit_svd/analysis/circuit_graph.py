"""Circuit graphs of singular directions: which upstream write feeds which downstream read, per prompt, merged
over a task's prompts (issue 24, item 2). Pure functions and one accumulator; no Lightning.

**Per prompt.** Level 1 splits the task's metric (``TaskScorer.logit_weights`` read at the answer position
through the final norm: ``decompose.logit_reads``) over every upstream writer node of ``Decomposer`` (the
embedding, each head's OV singular directions and ``b_V``, each layer's ``b_O``, each MLP's output directions and
``b_out``, the read's own bias rows, LayerNorm biases). A writer is **kept** for a reader when

    |contribution| >= threshold * sum over all writers of |contribution|        (threshold in (0, 1))

so at most ``1 / threshold`` writers are kept per reader. Every kept *head direction* ``Ll.ov.hH.dk`` (the only
writers whose own inputs are traced; MLP directions, the embedding and biases are leaves) is expanded at the next
level, up to ``depth`` levels of edges, into its head's readers at the positions where its write was read
(each position weighted by its share of the kept contributions' |value|; positions below ``position_share`` are
dropped and the rest renormalised to weights summing to 1):

* ``ov`` (reader kind ``"ov"``): the direction's own mixed coefficient ``z_h(d) W_O v_k`` at those destinations
  (``ov_reads(..., mix=True)``: rows over the sources, the clean pattern frozen), the weighted sum over
  destinations. Its writers are what the head moves along ``v_k``;
* ``qk`` (reader kinds ``"qk_query"``, ``"qk_key"``): at each destination ``d`` the head's most attended
  visible source ``s`` on the clean run, and the head's ``qk_top`` QK singular directions of largest
  ``|c_j(d, s)|`` (SAD's relative term: ``qk_reads(..., relative=True)``), split on the query side (writes at
  ``d``) and on the key side (writes at every visible source): what makes the head attend ``d -> s``.

A reader reached from several kept writers on one prompt is expanded once (its positions' weights add).
``"mlp"`` readers are not offered: an MLP output direction's coefficient is a non-linear function of its input
directions (the gate / activation), so a split into input directions would not be exact; MLP directions stay
leaves.

**Merged over prompts.** For each edge ``writer -> reader`` (and reader kind): ``weight`` = mean over all
prompts of its signed contribution, ``abs_weight`` = mean of |contribution|, ``kept_in`` = prompts where it was
kept, ``expanded_in`` = prompts where its reader was expanded. On a prompt where the reader was expanded the
contribution is the split's value whether or not the edge was kept there (every writer of an expanded reader is
computed); on a prompt where the reader was not expanded (no kept path from it to the metric) it counts 0. An
edge appears in the graph when it was kept on at least one prompt.

**Node units** (``unit``): ``"direction"`` (an ``Address``), ``"block"`` (its block of near-equal singular
values, ``Address.block`` with ``linalg.direction_blocks`` at ``rel_gap``), ``"head"`` (``Address.whole``: a head's
OV or QK map, a whole MLP). Graphs are built on directions; a coarser unit sums the direction edges that map
to the same (writer unit, reader unit, reader kind) prompt by prompt (``weight`` is the sum of the direction
edges' weights; ``abs_weight`` the mean |sum|; ``kept_in`` the prompts where any of them was kept).

Frozen (as in ``decompose``): every reader's norm factor, Gemma's post-norm factors, the attention pattern of
mixed OV reads, the other side of a QK term; contributions are exact pieces of the clean coefficients.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.analysis.decompose import Decomposer, Reads, Side, Split, logit_reads, ov_reads, qk_reads
from lit_svd.analysis.graph_options import (  # noqa: F401  (TRACEABLE, Unit: re-exported)
    DEFAULT_DEPTH,
    DEFAULT_POSITION_SHARE,
    DEFAULT_QK_TOP,
    DEFAULT_THRESHOLD,
    TRACEABLE,
    Unit,
    check_circuit_options,
)
from lit_svd.analysis.sad import causal_visibility
from lit_svd.linalg import REL_GAP, DirectionBlocks, direction_blocks
from lit_svd.metrics import TaskScorer, task_scorer
from lit_svd.models.base import augment_inputs
from lit_svd.models.points import ActivationCache

if TYPE_CHECKING:
    import networkx as nx

ReaderKind = Literal["logit", "ov", "qk_query", "qk_key"]
METRIC = "metric"  # the root node's key


@dataclass(frozen=True)
class GraphOptions:
    """How a graph is built (module docstring; ``analysis.graph_options`` holds the defaults and the one check).

    Args:
        threshold: a writer is kept for a reader when ``|contribution| >= threshold * sum |contributions|``; in (0, 1).
        depth: levels of edges from the metric (1: direct writers of the metric only); 1 .. n_layers.
        readers: which readers of a kept head direction are traced: ``qk``, ``ov`` (``mlp`` is not exact: leaves).
        unit: node unit: ``direction``, ``block`` (near-equal singular values), ``head``.
        qk_top: QK directions traced per (head, destination): the largest ``|c_j(d, s)|``.
        rel_gap: relative gap below which neighbouring singular values share a block (``unit: block``).
        position_share: a kept head direction is expanded at the positions holding at least this share of its
            kept contributions' |value|; in (0, 1).
    """

    threshold: float = DEFAULT_THRESHOLD
    depth: int = DEFAULT_DEPTH
    readers: tuple[str, ...] = TRACEABLE
    unit: Unit = "direction"
    qk_top: int = DEFAULT_QK_TOP
    rel_gap: float = REL_GAP
    position_share: float = DEFAULT_POSITION_SHARE

    def check(self, n_layers: int | None = None) -> GraphOptions:
        """The options if valid (``n_layers``: the model's, bounds ``depth``); one-line errors otherwise."""
        check_circuit_options(**asdict(self), n_layers=n_layers)
        return self


# --------------------------------------------------------------------------------------------------------------
# reads: concatenation, totals, per-row contributions
# --------------------------------------------------------------------------------------------------------------
def concat_reads(parts: Sequence[Reads]) -> Reads:
    """One ``Reads`` holding every reader of ``parts`` (same point and layer), in order. The factored form is
    kept when every part has one (they must share the basis: the same head's map)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    offsets, n = [], 0
    for p in parts:
        offsets.append(n)
        n += p.n_readers
    factored = all(p.basis is not None for p in parts)
    addresses: list[Address] | None = None
    if first.addresses is not None:
        addresses = []
        for p in parts:
            if p.addresses is None:
                raise ValueError("concat_reads: the first part has reader addresses, another has none")
            addresses += p.addresses
    coords: list[Tensor] = []
    for p in parts if factored else []:
        if p.coords is None:
            raise ValueError("concat_reads: a part with a factored basis has no coords")
        coords.append(p.coords)
    info_keys = set.intersection(*(set(p.info) for p in parts))
    return Reads(
        first.point,
        first.layer,
        torch.cat([p.batch for p in parts]),
        torch.cat([p.position for p in parts]),
        torch.cat([p.vector for p in parts]),
        torch.cat([p.weight for p in parts]),
        torch.cat([p.reader + o for p, o in zip(parts, offsets)]),
        torch.cat([p.own_bias for p in parts]),
        [b for p in parts for b in p.bias],
        addresses,
        {k: torch.cat([p.info[k] for p in parts]) for k in info_keys},
        first.basis if factored else None,
        torch.cat(coords) if factored else None,
    )


def read_totals(dec: Decomposer, cache: ActivationCache, reads: Reads) -> Float[Tensor, " n_readers"]:
    """``[n_readers]``: each reader's coefficient on the cached run (``Split.total`` without the split)."""
    x = augment_inputs(cache[f"{reads.point}_normalized", reads.layer][reads.batch, reads.position].to(dec.dtype))
    per_row = reads.weight.to(dec.dtype) * (reads.vector.to(dec.dtype) * x).sum(-1)
    return torch.zeros(reads.n_readers, dtype=dec.dtype, device=per_row.device).index_add_(0, reads.reader, per_row)


def row_scales(
    dec: Decomposer, cache: ActivationCache, reads: Reads
) -> tuple[Float[Tensor, "R d_model"], Float[Tensor, " R"]]:
    """``(vectors [R, d_model], scale [R])``: row ``i`` reads a residual write ``w`` at its position as
    ``scale[i] * vectors[i] . w`` (the clean norm factor and the row's weight in ``scale``; LayerNorm: centred)."""
    dt = dec.dtype
    factor = cache[f"{reads.point}_factor", reads.layer][reads.batch, reads.position, 0].to(dt)
    r = reads.vector[:, 1:].to(dt)
    if dec.view.norm_kind == "layernorm":
        r = r - r.mean(-1, keepdim=True)
    return r, reads.weight.to(dt) * factor


def row_contributions(
    dec: Decomposer,
    cache: ActivationCache,
    reads: Reads,
    table: Float[Tensor, "B T n_writers"],
    writers: Int[Tensor, " M"],
) -> Float[Tensor, "R M"]:
    """``[R, M]``: the contribution of writer nodes ``writers`` (indices into ``dec.nodes``, not the embedding)
    to each row of ``reads`` (the pieces ``Split.values`` sums over a reader's rows)."""
    r, scale = row_scales(dec, cache, reads)
    W = dec.writers[writers - 1]  # [M, d]
    coef = table[reads.batch, reads.position][:, writers - 1].to(dec.dtype)  # [R, M]
    return scale[:, None] * (r @ W.T) * coef


# --------------------------------------------------------------------------------------------------------------
# the per-prompt expansion
# --------------------------------------------------------------------------------------------------------------
@dataclass
class ReaderRow:
    """One expanded reader on one prompt: its split over ``nodes`` and which writers were kept."""

    prompt: int  # row of the batch
    reader: Address | None  # None: the metric
    kind: str
    nodes: list[Address]
    values: Tensor  # [n_nodes]
    kept: Tensor  # [n_nodes] bool


@dataclass
class BatchGraphs:
    """The per-prompt graphs of one batch: every expanded reader's row, and per prompt the entries each
    (reader, kind) was read at: ``entries[(prompt, reader, kind)] = {(dest, src): weight}`` (``src`` -1 for OV
    and logit readers; weights sum to 1)."""

    rows: list[ReaderRow] = field(default_factory=list)
    entries: dict[tuple[int, Address | None, str], dict[tuple[int, int], float]] = field(default_factory=dict)


def _kept(values: Tensor, threshold: float) -> Tensor:
    total = values.abs().sum(-1, keepdim=True)
    return (values.abs() >= threshold * total) & (total > 0)


def _positions(weights: dict[int, float], share: float) -> dict[int, float]:
    """Positions whose share of |contribution| is at least ``share``, renormalised to sum to 1."""
    total = sum(weights.values())
    if total <= 0:
        return {}
    keep = {p: w / total for p, w in weights.items() if w / total >= share}
    if not keep:
        keep = {max(weights, key=lambda p: weights[p]): 1.0}
    s = sum(keep.values())
    return {p: w / s for p, w in keep.items()}


def metric_weights(
    dec: Decomposer, cache: ActivationCache, batch: dict, task: str | TaskScorer
) -> Float[Tensor, "B vocab"]:
    """``[B, vocab]``: d metric / d logits at the clean answer logits (``TaskScorer.logit_weights``; exact and
    constant for the logit difference, the linearisation at the clean run for GT's probability difference).
    The logits are recomputed from the cache (the folded unembedding of ``final_normalized``)."""
    W_U, b_U = dec.view.unembed()
    answer = batch["answer_pos"].to(W_U.device)
    x = cache["final_normalized"][torch.arange(len(answer), device=W_U.device), answer].to(W_U.dtype)
    logits = (x @ W_U + b_U).double()
    with torch.inference_mode(False):  # a gradient, also inside Lightning's test loop (inference mode)
        batch = {k: v.to(W_U.device).clone() if torch.is_tensor(v) else v for k, v in batch.items()}
        return task_scorer(task).logit_weights(logits.clone(), batch).double()


class GraphBuilder:
    """Builds the per-prompt graphs of batches (``batch``) for one model and task.

    ``dec``: the model's ``Decomposer``; ``task``: a task name or ``TaskScorer``; ``options``: ``GraphOptions``.
    Call ``batch(cache, batch)`` with ``cache = view.run_with_cache(dec.points(mix=True), ids, mask)``.
    """

    def __init__(self, dec: Decomposer, task: str | TaskScorer, options: GraphOptions | None = None):
        self.dec = dec
        self.view = dec.view
        self.task = task_scorer(task)
        self.options = (options or GraphOptions()).check(self.view.n_layers)

    # --- one batch ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def batch(self, cache: ActivationCache, batch: dict) -> BatchGraphs:
        """Every prompt's graph of ``batch`` (right-padded task batch with ``answer_pos``)."""
        dec, opt = self.dec, self.options
        table = dec.coefficient_table(cache)
        answer = batch["answer_pos"].to(table.device)
        B = len(answer)
        rows = torch.arange(B, device=table.device)
        weights = metric_weights(self.dec, cache, batch, self.task)
        out = BatchGraphs()
        reads = logit_reads(dec, cache, rows, answer, weights)
        split = dec.split(cache, reads, table=table)
        for b in range(B):
            out.entries[(b, None, "logit")] = {(int(answer[b]), -1): 1.0}
        owner = list(range(B))  # prompt-level reader of each split reader
        frontier = self._record(out, cache, table, reads, split, [(b, None, "logit") for b in range(B)], owner)
        expanded: set[tuple[int, Address]] = set()
        for _ in range(1, opt.depth):
            frontier = {k: v for k, v in frontier.items() if k not in expanded}
            if not frontier:
                break
            expanded |= set(frontier)
            frontier = self._expand(out, cache, table, batch, frontier)
        return out

    def _record(
        self,
        out: BatchGraphs,
        cache: ActivationCache,
        table: Tensor,
        reads: Reads,
        split: Split,
        keys: Sequence[tuple[int, Address | None, str]],
        owner: Sequence[int],
        share: Tensor | None = None,
    ) -> dict[tuple[int, Address], dict[int, float]]:
        """Combine the split's readers into prompt-level readers ``keys`` (``owner[j]``: the key of split reader
        ``j``; ``share[j]``: its weight), keep writers, and return the next frontier ``{(prompt, head
        direction): {position: weight}}``."""
        dt = self.dec.dtype
        n = len(keys)
        owner_t = torch.as_tensor(owner, device=split.values.device)
        w = torch.ones(len(owner), dtype=dt, device=owner_t.device) if share is None else share.to(dt)
        values = torch.zeros(n, len(split.nodes), dtype=dt, device=owner_t.device)
        values.index_add_(0, owner_t, split.values * w[:, None])
        kept = _kept(values, self.options.threshold)
        traced = torch.tensor([a.kind == "ov" for a in split.nodes], device=kept.device)
        frontier: dict[tuple[int, Address], dict[int, float]] = {}
        for j, (b, reader, kind) in enumerate(keys):
            out.rows.append(ReaderRow(b, reader, kind, split.nodes, values[j], kept[j]))
        grow = kept & traced[None]
        if not grow.any():
            return frontier
        cols = torch.nonzero(grow.any(0)).flatten()
        node_idx = torch.tensor([self._node_index[split.nodes[c]] for c in cols.tolist()], device=cols.device)
        contrib = row_contributions(self.dec, cache, reads, table, node_idx)  # [R, M]
        row_owner = owner_t[reads.reader]  # prompt-level reader of each row
        row_w = w[reads.reader]
        for j, c in torch.nonzero(grow, as_tuple=False).tolist():
            m = int(torch.nonzero(cols == c)[0])
            sel = row_owner == j
            pos = reads.position[sel]
            val = (contrib[sel, m] * row_w[sel]).abs()
            b = keys[j][0]
            acc = frontier.setdefault((b, split.nodes[c]), {})
            for p, v in zip(pos.tolist(), val.tolist()):
                acc[p] = acc.get(p, 0.0) + v
        return frontier

    @property
    def _node_index(self) -> dict[Address, int]:
        if not hasattr(self, "_index"):
            self._index = {a: i for i, a in enumerate(self.dec.nodes)}
        return self._index

    def _expand(
        self,
        out: BatchGraphs,
        cache: ActivationCache,
        table: Tensor,
        batch: dict,
        frontier: dict[tuple[int, Address], dict[int, float]],
    ) -> dict[tuple[int, Address], dict[int, float]]:
        dec, opt = self.dec, self.options
        ov_req: dict[tuple[int, Address], dict[tuple[int, int], float]] = {}
        qk_pos: dict[tuple[int, int, int], dict[int, float]] = {}  # (prompt, layer, head) -> {dest: weight}
        for (b, w), positions in frontier.items():
            kept = _positions(positions, opt.position_share)
            if "ov" in opt.readers:
                acc_ov = ov_req.setdefault((b, w), {})
                for d, x in kept.items():
                    acc_ov[(d, -1)] = acc_ov.get((d, -1), 0.0) + x
            if "qk" in opt.readers:
                acc_qk = qk_pos.setdefault((b, w.layer, w.group), {})
                for d, x in kept.items():
                    acc_qk[d] = acc_qk.get(d, 0.0) + x
        nxt: dict[tuple[int, Address], dict[int, float]] = {}
        # OV: one split per head
        by_head: dict[tuple[int, int], list[tuple[int, Address, dict[tuple[int, int], float]]]] = defaultdict(list)
        for (b, w), ent in ov_req.items():
            by_head[(w.layer, w.group)].append((b, w, ent))
        for (l, h), items in sorted(by_head.items()):
            parts: list[Reads] = []
            keys: list[tuple[int, Address | None, str]] = []
            owner: list[int] = []
            share: list[float] = []
            for b, w, ent in items:
                tot = sum(ent.values())
                ent = {k: v / tot for k, v in ent.items()}
                out.entries[(b, w, "ov")] = ent
                dests = [d for d, _ in ent]
                parts.append(ov_reads(dec, cache, l, h, [b] * len(dests), dests, [w.index], mix=True))
                owner += [len(keys)] * len(dests)
                share += list(ent.values())
                keys.append((b, w, "ov"))
            self._split_and_record(out, cache, table, parts, keys, owner, share, nxt)
        # QK: choose the directions, then one split per layer (query side) and per head (key side)
        if qk_pos:
            mask = batch["attention_mask"].to(table.device)
            req: dict[tuple[int, Address], dict[tuple[int, int], float]] = {}
            for (b, l, h), dest_weights in sorted(qk_pos.items()):
                tot = sum(dest_weights.values())
                vis = causal_visibility(mask, self.view.window(l))[b]  # [T, T]
                pat = cache["pattern", l][b, h]
                pairs = []
                for d, x in dest_weights.items():
                    if vis[d].sum() < 2:
                        continue
                    s = int(torch.where(vis[d], pat[d], torch.full_like(pat[d], -1.0)).argmax())
                    pairs.append((d, s, x / tot))
                if not pairs:
                    continue
                ds = [p[0] for p in pairs]
                ss = [p[1] for p in pairs]
                allr = qk_reads(dec, cache, l, h, [b] * len(ds), ds, ss, mask, None, "query", relative=True)
                terms = read_totals(dec, cache, allr).reshape(len(ds), -1)
                top = terms.abs().topk(min(opt.qk_top, terms.shape[1]), dim=1).indices
                for i, (d, s, x) in enumerate(pairs):
                    for k in top[i].tolist():
                        acc_req = req.setdefault((b, Address(l, "qk", h, k)), {})
                        acc_req[(d, s)] = acc_req.get((d, s), 0.0) + x
            sides: tuple[Side, Side] = ("query", "key")
            for side in sides:
                groups: dict[tuple[int, int], list[tuple[int, Address, dict[tuple[int, int], float]]]]
                groups = defaultdict(list)
                for (b, a), ent in req.items():
                    groups[(a.layer, a.group if side == "key" else 0)].append((b, a, ent))
                for (l, _), items in sorted(groups.items()):
                    parts, keys, owner, share = [], [], [], []
                    for b, a, ent in items:
                        tot = sum(ent.values())
                        ent = {k: v / tot for k, v in ent.items()}
                        out.entries[(b, a, f"qk_{side}")] = ent
                        ds, ss = [d for d, _ in ent], [s for _, s in ent]
                        parts.append(
                            qk_reads(dec, cache, l, a.group, [b] * len(ds), ds, ss, mask, [a.index], side, True)
                        )
                        owner += [len(keys)] * len(ds)
                        share += list(ent.values())
                        keys.append((b, a, f"qk_{side}"))
                    self._split_and_record(out, cache, table, parts, keys, owner, share, nxt)
        return nxt

    def _split_and_record(
        self,
        out: BatchGraphs,
        cache: ActivationCache,
        table: Tensor,
        parts: Sequence[Reads],
        keys: Sequence[tuple[int, Address | None, str]],
        owner: Sequence[int],
        share: Sequence[float],
        nxt: dict[tuple[int, Address], dict[int, float]],
    ) -> None:
        reads = concat_reads(parts)
        split = self.dec.split(cache, reads, table=table)
        share_t = torch.tensor(share, dtype=self.dec.dtype, device=split.values.device)
        got = self._record(out, cache, table, reads, split, keys, owner, share_t)
        for k, v in got.items():
            acc = nxt.setdefault(k, {})
            for p, x in v.items():
                acc[p] = acc.get(p, 0.0) + x


# --------------------------------------------------------------------------------------------------------------
# units and the merge over prompts
# --------------------------------------------------------------------------------------------------------------
class Units:
    """Maps a direction address to its node unit (``direction`` / ``block`` / ``head``) for one model."""

    def __init__(self, dec: Decomposer, unit: Unit = "direction", rel_gap: float = REL_GAP):
        self.dec, self.unit, self.rel_gap = dec, unit, rel_gap
        self._blocks: dict[tuple[int, str], DirectionBlocks] = {}
        self._cache: dict[Address, Address] = {}

    def spectrum(self, layer: int, kind: str) -> Tensor:
        """``[groups, K]``: the singular values of a component's groups."""
        if kind == "ov":
            return self.dec.layers[layer].ov_S
        if kind == "qk":
            return self.dec.qk_basis(layer)[2].S
        if kind == "mlp_out":
            w = self.dec.layers[layer]
            V = w.mlp_V
            b = (w.b_out @ V) if w.b_out is not None else torch.zeros(V.shape[1], dtype=V.dtype)
            return (w.mlp_read.pow(2).sum(0) + b.pow(2)).sqrt()[None]
        raise ValueError(f"no spectrum for kind {kind!r}")

    @overload
    def __call__(self, a: Address) -> Address: ...
    @overload
    def __call__(self, a: None) -> None: ...
    def __call__(self, a: Address | None) -> Address | None:
        if a is None or self.unit == "direction" or not a.is_direction:
            return a
        if a not in self._cache:
            S = self.spectrum(a.layer, a.kind)
            if self.unit == "head":
                self._cache[a] = a.whole(S.shape[-1])
            else:
                key = (a.layer, a.kind)
                if key not in self._blocks:
                    self._blocks[key] = direction_blocks(S, self.rel_gap)
                self._cache[a] = a.block(self._blocks[key])
        return self._cache[a]


@dataclass
class EdgeSums:
    """Sums over prompts of every edge into every expanded reader (unit level): per ``(reader, kind)`` the
    signed sum, the sum of |.|, the count of prompts where kept, the count of prompts where the reader was
    expanded; ``n_prompts`` all prompts seen. Writers are columns of ``nodes``. ``merge`` adds another's sums
    (DDP ranks)."""

    nodes: list[Address] = field(default_factory=list)
    readers: dict[tuple[Address | None, str], dict[str, Tensor]] = field(default_factory=dict)
    expanded: dict[tuple[Address | None, str], int] = field(default_factory=dict)
    n_prompts: int = 0

    def _columns(self, nodes: Sequence[Address]) -> Tensor:
        if not hasattr(self, "_col"):
            self._col = {a: i for i, a in enumerate(self.nodes)}
        idx = []
        for a in nodes:
            if a not in self._col:
                self._col[a] = len(self.nodes)
                self.nodes.append(a)
            idx.append(self._col[a])
        return torch.tensor(idx, dtype=torch.long)

    def _row(self, key: tuple[Address | None, str]) -> dict[str, Tensor]:
        n = len(self.nodes)
        r = self.readers.setdefault(key, {name: torch.zeros(0, dtype=torch.float64) for name in ("sum", "abs", "kept")})
        if r["sum"].numel() < n:
            for name in r:
                r[name] = torch.cat([r[name], torch.zeros(n - r[name].numel(), dtype=torch.float64)])
        return r

    def add(self, graphs: BatchGraphs, units: Units, n_prompts: int) -> None:
        """Add one batch's per-prompt graphs (``n_prompts``: the batch's prompts)."""
        per_prompt: dict[tuple[int, Address | None, str], list[ReaderRow]] = defaultdict(list)
        for row in graphs.rows:
            per_prompt[(row.prompt, units(row.reader), row.kind)].append(row)
        columns: dict[int, Tensor] = {}  # the rows of one split share its node list: map it once
        for (_, reader, kind), rows in per_prompt.items():
            vec = torch.zeros(0, dtype=torch.float64)
            kept = torch.zeros(0, dtype=torch.float64)
            for row in rows:
                if id(row.nodes) not in columns:
                    columns[id(row.nodes)] = self._columns([units(a) for a in row.nodes])
                cols = columns[id(row.nodes)]
                n = len(self.nodes)
                if vec.numel() < n:
                    vec = torch.cat([vec, torch.zeros(n - vec.numel(), dtype=torch.float64)])
                    kept = torch.cat([kept, torch.zeros(n - kept.numel(), dtype=torch.float64)])
                vec.index_add_(0, cols, row.values.double().cpu())
                kept.index_add_(0, cols, row.kept.double().cpu())
            r = self._row((reader, kind))
            n = vec.numel()
            r["sum"][:n] += vec
            r["abs"][:n] += vec.abs()
            r["kept"][:n] += (kept > 0).double()
            self.expanded[(reader, kind)] = self.expanded.get((reader, kind), 0) + 1
        self.n_prompts += n_prompts

    def merge(self, other: EdgeSums) -> EdgeSums:
        """These sums plus ``other``'s (in place; returns self)."""
        cols = self._columns(other.nodes)
        for key, r in other.readers.items():
            mine = self._row(key)
            for name in ("sum", "abs", "kept"):
                mine[name].index_add_(0, cols[: r[name].numel()], r[name])
            self.expanded[key] = self.expanded.get(key, 0) + other.expanded.get(key, 0)
        self.n_prompts += other.n_prompts
        return self

    def edges(self) -> list[dict]:
        """One flat dict per edge kept on at least one prompt: ``writer``, ``reader`` (``str`` of the address;
        ``metric`` for the root), ``reader_kind``, ``weight``, ``abs_weight``, ``kept_in``, ``expanded_in``,
        ``n_prompts``; sorted by ``abs_weight``, largest first."""
        rows: list[dict[str, Any]] = []
        n = max(self.n_prompts, 1)
        for (reader, kind), r in self.readers.items():
            for c in torch.nonzero(r["kept"] > 0).flatten().tolist():
                rows.append(
                    {
                        "writer": str(self.nodes[c]),
                        "reader": METRIC if reader is None else str(reader),
                        "reader_kind": kind,
                        "weight": float(r["sum"][c]) / n,
                        "abs_weight": float(r["abs"][c]) / n,
                        "kept_in": int(r["kept"][c]),
                        "expanded_in": self.expanded[(reader, kind)],
                        "n_prompts": self.n_prompts,
                    }
                )
        rows.sort(key=lambda e: (-e["abs_weight"], e["writer"], e["reader"], e["reader_kind"]))
        return rows


def node_attributes(key: str, unit: str, n_layers: int) -> dict:
    """``layer``, ``kind``, ``group``, ``index``, ``size``, ``unit`` of a node key (``metric``: the root)."""
    if key == METRIC:
        return {"layer": n_layers, "kind": METRIC, "group": 0, "index": 0, "size": 1, "unit": unit}
    a = Address.parse(key)
    u = unit if a.is_direction else "constant"
    return {"layer": a.layer, "kind": a.kind, "group": a.group, "index": a.index, "size": a.size, "unit": u}


def to_networkx(edges: Sequence[dict], unit: str, n_layers: int) -> nx.MultiDiGraph:
    """A ``networkx.MultiDiGraph`` (a ``DiGraph`` subclass; one edge per (writer, reader, reader kind), the kind
    is the edge key) of ``edges`` (``EdgeSums.edges``): nodes keyed ``str(Address)`` / ``metric`` with
    ``node_attributes``; edges with ``weight``, ``abs_weight``, ``kept_in``, ``expanded_in``, ``reader_kind``."""
    import networkx as nx

    G = nx.MultiDiGraph(unit=unit)
    for e in edges:
        for key in (e["writer"], e["reader"]):
            if key not in G:
                G.add_node(key, **node_attributes(key, unit, n_layers))
        attrs = {k: e[k] for k in ("weight", "abs_weight", "kept_in", "expanded_in", "reader_kind")}
        G.add_edge(e["writer"], e["reader"], key=e["reader_kind"], **attrs)
    return G


def graph_edges(G: nx.MultiDiGraph) -> list[dict]:
    """The edges of a graph from ``to_networkx`` as flat dicts (``writer``, ``reader`` and the edge attributes)."""
    return [{"writer": u, "reader": v, **d} for u, v, d in G.edges(data=True)]


def build_graph(
    dec: Decomposer,
    task: str | TaskScorer,
    batches: Iterable[dict],
    options: GraphOptions | None = None,
) -> tuple[nx.MultiDiGraph, EdgeSums, list[BatchGraphs]]:
    """``(networkx graph, EdgeSums, [BatchGraphs])`` of the task over ``batches`` (an iterable of task batches):
    the whole pipeline of this module in one call (the Lightning module does the same batch by batch)."""
    builder = GraphBuilder(dec, task, options)
    units = Units(dec, builder.options.unit, builder.options.rel_gap)
    sums, per_batch = EdgeSums(), []
    for batch in batches:
        cache = dec.view.run_with_cache(dec.points(mix=True), batch["clean_ids"], batch["attention_mask"])
        graphs = builder.batch(cache, batch)
        sums.add(graphs, units, len(batch["answer_pos"]))
        per_batch.append(graphs)
    G = to_networkx(sums.edges(), builder.options.unit, dec.view.n_layers)
    return G, sums, per_batch
