"""Edge pruning at the head level (after MIB's EP, arXiv 2406.16778; docs/circuits.md, "Edge pruning"): a keep logit
per block (writer unit x reader unit, MIB's head-level edge) learned by gradient descent under the edge ablation
itself (``edge_ablation``'s soft blocks: a reader unit adds ``(1 - w) Delta_U`` of each writer unit) instead of read
off a first-order attribution. The learned logits rank the blocks (``pruned_ranking``), a head-level ranking scored
on MIB's curve like EAP-IG's.

**The circuit trained** is the top fraction ``keep`` of the blocks by logit: the forward runs that circuit exactly
(whole blocks, ``w`` 0 or 1) and the gradient passes through ``sigmoid(logit - t)`` (a straight-through estimate,
``SoftBlocks``; ``t`` the cut between the kept and the next logit); the size is the constraint, no penalty weight to
tune. With several fractions ``keep`` (nested circuits of one ranking, each its own forward and backward per step)
the loss is their mean, so that the ranking serves several sizes of the curve. After each Adam step the logits are
shifted so that the top ``max(keep)`` are positive (a shift changes no circuit and no gradient). A block the
circuit lacks gets the gradient of adding it to the circuit as it is, so a link of a chain is found back while the
rest of the chain is kept; a chain none of whose links the circuit holds is not (first order). **Warm start** (as
MIB's warm-started EP): the logits start from a head-level ranking (EAP-IG's block scores; signed for ``metric``,
``|score|`` for ``faithful``), spread linearly over ``[-3, 3]`` by rank with the cut at the top ``max(keep)``.
**Objectives** (per prompt, ``m`` the metric of the trained circuit, ``gap`` the training prompts' ``m(full) -
m(empty)`` of their means): ``faithful`` ``((m - m_full) / gap)^2``, each prompt's metric held at the full model's
(CMD); ``metric`` ``-(m - m_empty) / gap``, the metric pushed up (CPR). Every step runs the same training prompts in
the same batches: the run is step-based (another machine gets the same one up to float rounding).

**At the direction level** (``level="directions"``, ``SoftDirections``): beside the block logits ``b``, a logit per
writer direction ``x`` (shared by every reader) and per reader direction ``y`` (shared by every writer); edge ``(k, i)``
of block ``U`` is kept where ``min(b_U, x_i, y_k)`` is above one cut ``t``, a circuit of product form that the edge
ablation runs at the cost of whole blocks (``edge_ablation``'s soft directions). The size is MIB's weighted edge count
(the fair axis: a block weighs 1, a direction edge ``1 / (K_w K_r)``): the cut keeps the largest circuit of weighted
count at most ``keep`` of the blocks (``direction_cut``), so a reader or writer unit whose directions are partly
dropped frees room for more blocks. ``b`` warm-starts as at the head level, ``x`` and ``y`` at ``direction_start``
(every direction kept at the start: step 0 is the head-level circuit); the one direction of a unit of one (the
embedding, the logits) is pinned at +inf (``single_directions``). The curve's circuit at each size is a cut of
the learned logits at that weighted count (``order_cut``, nested; by default the trained directions held and
the blocks cut, ``min`` one cut of every logit), run as soft directions of 0 / 1 (the direction circuit exactly, at
the cost of whole blocks; the edge curves' selection over ~10^9 scores would read back the millions of edges sharing
a logit). With several ``keep``, the largest is one cut of every logit and each smaller one the curve's cut in
``direction_order`` of the logits recentred at the largest: the nested circuits trained are the curve's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import Tensor

from lit_svd.analysis.edge_ablation import AllEdges, Circuit, EdgeAblation, NoEdges, Reference
from lit_svd.analysis.edge_curves import CurveSpec, EdgeRanking, ranked_spec, unit_ranking
from lit_svd.analysis.edge_options import CUT_ORDERS, PruneOptions, step_line
from lit_svd.analysis.edges import EdgeUniverse, ReaderUnit
from lit_svd.metrics import forward_answer_logits

# the block logits, or at the direction level (blocks, writers, readers)
Logits = Tensor | tuple[Tensor, Tensor, Tensor]
MOMENTUM = 0.9  # ``proportional``: the gradients' moving average (Adam's first moment, beta1)
CURVE_OF = {"faithful": "pruned_abs_raw", "metric": "pruned_signed_raw"}  # each objective's curve (CMD / CPR)
DIRECTION_CURVE_OF = {"faithful": "prunedirs_abs_fair", "metric": "prunedirs_signed_fair"}  # the same, directions
OBJECTIVE_OF = {name: objective for of in (CURVE_OF, DIRECTION_CURVE_OF) for objective, name in of.items()}
LEVEL_OF = {name: "units" if name in CURVE_OF.values() else "directions" for name in OBJECTIVE_OF}


@dataclass
class SoftBlocks:
    """The head-level circuit of the blocks whose logit is above ``threshold`` (``logits [n_blocks]`` in
    ``EdgeUniverse.block_offsets`` order), its gradient through ``sigmoid(logits - threshold)`` (straight-through):
    ``edge_ablation``'s soft blocks."""

    universe: EdgeUniverse
    logits: Tensor
    threshold: float = 0.0

    def keep(self, r: ReaderUnit) -> Tensor:
        """The same circuit as a keep mask of direction edges (``edge_ablation.Circuit``)."""
        blocks = self.logits[self.universe.blocks(r)].detach() > self.threshold
        return blocks[self.universe.col_unit[: r.n_cols].to(blocks.device)].expand(r.size, -1)

    def block_weights(self, r: ReaderUnit) -> Tensor:
        return _straight_through(self.logits[self.universe.blocks(r)] - self.threshold, self.universe.dtype)


def kept(logits: Tensor) -> Tensor:
    """Which of the learned ``logits`` the trained circuit keeps (bool): those above 0, where training leaves the cut
    (``_Circuits.recentre``)."""
    return logits.detach() > 0


def _straight_through(part: Tensor, dtype: torch.dtype) -> Tensor:
    """``part > 0`` as 0 / 1 exactly, its gradient that of ``sigmoid(part)``."""
    soft = torch.sigmoid(part)
    return ((part > 0).to(soft.dtype) + (soft - soft.detach())).to(dtype)


@dataclass
class SoftDirections:
    """The direction circuit of the edges ``(k, i)`` of block ``U`` with ``min(blocks_U, writers_i, readers_k)`` above
    ``threshold`` (module docstring; ``blocks [n_blocks]``, ``writers [n_writer_cols]``, ``readers
    [n_reader_directions]``), each factor's gradient straight-through: ``edge_ablation``'s soft directions."""

    universe: EdgeUniverse
    blocks: Tensor
    writers: Tensor
    readers: Tensor
    threshold: float = 0.0

    def _reader(self, r: ReaderUnit) -> Tensor:
        return self.readers[r.offset : r.offset + r.size]

    def block_weights(self, r: ReaderUnit) -> Tensor:
        return _straight_through(self.blocks[self.universe.blocks(r)] - self.threshold, self.universe.dtype)

    def writer_weights(self) -> Tensor:
        return _straight_through(self.writers - self.threshold, self.universe.dtype)

    def reader_weights(self, r: ReaderUnit) -> Tensor:
        return _straight_through(self._reader(r) - self.threshold, self.universe.dtype)

    def keep(self, r: ReaderUnit) -> Tensor:
        """The same circuit as a keep mask of direction edges (``edge_ablation.Circuit``)."""
        u, t = self.universe, self.threshold
        blocks = self.blocks[u.blocks(r)].detach() > t
        cols = blocks[u.col_unit[: r.n_cols].to(blocks.device)] & (self.writers[: r.n_cols].detach() > t)
        return (self._reader(r).detach() > t)[:, None] & cols[None, :]


@dataclass
class DirectionSizes:
    """The weighted edge count (fair axis) of ``SoftDirections`` circuits of ``universe``: each block kept counts its
    writer unit's and its reader unit's fractions of directions kept."""

    universe: EdgeUniverse

    def __post_init__(self) -> None:
        u = self.universe
        n_up = torch.tensor([r.n_up for r in u.readers])
        self.block_writer = torch.cat([torch.arange(int(n)) for n in n_up])
        self.block_reader = torch.repeat_interleave(torch.arange(len(u.readers)), n_up)
        self.reader_sizes = torch.tensor([r.size for r in u.readers])
        self.direction_reader = torch.repeat_interleave(torch.arange(len(u.readers)), self.reader_sizes)
        self.col_unit = u.col_unit[: u.n_writer_cols].cpu()

    def __call__(self, blocks: Tensor, writers: Tensor, readers: Tensor, t: float) -> float:
        """The weighted count of the circuit of the logits above ``t``."""
        return self.counts(blocks, writers, readers, t)[1]

    def counts(self, blocks: Tensor, writers: Tensor, readers: Tensor, t: float) -> tuple[int, float]:
        """``(direction edges, weighted count)`` of the circuit of the logits above ``t``."""
        u = self.universe
        nx = torch.zeros(len(u.writers), dtype=torch.float64).index_add_(0, self.col_unit, (writers > t).double())
        ny = torch.zeros(len(u.readers), dtype=torch.float64).index_add_(
            0, self.direction_reader, (readers > t).double()
        )
        edges = (blocks > t).double() * nx[self.block_writer] * ny[self.block_reader]
        weight = edges / (u.writer_sizes.double()[self.block_writer] * self.reader_sizes.double()[self.block_reader])
        return int(edges.sum()), float(weight.sum())


def direction_cut(
    sizes: DirectionSizes,
    blocks: Tensor,
    writers: Tensor,
    readers: Tensor,
    keep: float,
    moving: tuple[bool, bool, bool] = (True, True, True),
) -> float:
    """The cut ``t`` of the largest circuit (logits above ``t``) whose weighted count is at most ``keep`` of the
    blocks: the midpoint between the lowest logit kept and the next (bisection over the distinct logits). With
    ``moving`` (blocks, writers, readers) some False, those logits are held at their sign (kept where above 0) and the
    cut moves the others only."""
    held = [
        x.detach() if m else torch.where(kept(x), torch.inf, -torch.inf)
        for x, m in zip((blocks, writers, readers), moving)
    ]
    b, x, y = (h.double() for h in held)
    values = torch.unique(torch.cat([h.double() for h, m in zip(held, moving) if m]))  # ascending
    values = values[values.isfinite()]  # a pinned logit (+inf, ``single_directions``) is kept at every cut
    target = keep * sizes.universe.n_blocks
    size = lambda i: sizes(b, x, y, float(values[i]))  # noqa: E731
    if sizes(b, x, y, float(values[0]) - 1) <= target:
        return float(values[0]) - 1.0  # every edge the moving logits can add
    lo, hi = -1, len(values) - 1  # above values[hi] nothing is kept; every logit (lo = -1) is more than the target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if size(mid) <= target else (mid, hi)
    return float(values[hi] + values[hi + 1]) / 2 if hi + 1 < len(values) else float(values[hi]) + 1.0


def single_directions(u: EdgeUniverse) -> tuple[Tensor, Tensor]:
    """Masks ``[n_writer_cols]`` and ``[n_reader_directions]`` of the directions of units of one direction (the
    embedding, the logits; every writer at the unit level): their logits are pinned at +inf, kept at every cut with
    zero gradient. A direction logit chooses directions within a unit; a unit of one has nothing to choose, and its
    one logit would cut it from every block at once (for the embedding: every reader then reads the corrupted
    embedding), which is the blocks' to decide, reader by reader."""
    writers = torch.zeros(u.n_writer_cols, dtype=torch.bool)
    readers = torch.zeros(u.n_reader_directions, dtype=torch.bool)
    for w in u.writers:
        writers[w.offset : w.offset + w.size] = w.size == 1
    for r in u.readers:
        readers[r.offset : r.offset + r.size] = r.size == 1
    return writers, readers


def warm_start(scores: Tensor, keep: float) -> Tensor:
    """``[n]`` float32 logits spread over ``[-3, 3]`` by the rank of ``scores`` (higher first, ties by position),
    exactly the top ``keep`` fraction positive."""
    n = len(scores)
    order = torch.argsort(scores.double(), descending=True, stable=True)
    rank = torch.empty(n, dtype=torch.float64)
    rank[order] = torch.arange(n, dtype=torch.float64)
    cut = round(keep * n) - 0.5  # ranks below it are kept
    logits = torch.where(rank < cut, 3 * (cut - rank) / max(cut, 0.5), -3 * (rank - cut) / max(n - 1 - cut, 0.5))
    return logits.float()


def cut(logits: Tensor, keep: float) -> float:
    """The midpoint between the ``round(keep * n)``-th largest logit and the next."""
    k = round(keep * len(logits))
    top = torch.topk(logits.detach(), k + 1).values
    return float((top[k - 1] + top[k]) / 2)


@dataclass
class PruneLog:
    """Per step: the objective on the training prompts (of the circuits before the step; several ``keep``: their
    mean) and how many blocks of the largest circuit the step swapped out (for as many others); ``final``: the
    objective of the learned logits (after the last step, which no step's objective sees)."""

    objective: list[float] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)
    writers_kept: list[float] = field(default_factory=list)  # direction level: the writer directions kept
    readers_kept: list[float] = field(default_factory=list)  # and the reader directions
    final: float | None = None


def prune_blocks(
    ablation: EdgeAblation,
    batches: Sequence[dict],
    refs: Sequence[Reference],
    full: Sequence[Tensor],
    empty: Sequence[Tensor],
    start: Tensor,
    options: PruneOptions,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[Logits, PruneLog]:
    """The learned logits ``[n_blocks]`` (float32; at the direction level ``(blocks, writers, readers)``) from the
    head-level block scores ``start`` (``warm_start``), and the training log. ``refs``: the batches' corrupted
    recordings; ``full`` / ``empty``: each batch's per-prompt metric of the full and the empty circuit."""
    u = ablation.u
    if start.shape != (u.n_blocks,):
        raise ValueError(f"prune_blocks: start scores of shape {tuple(start.shape)}, expected ({u.n_blocks},)")
    gap = float(torch.cat(list(full)).mean() - torch.cat(list(empty)).mean())
    if abs(gap) < 1e-12:
        raise ValueError("prune_blocks: m(full) equals m(empty) on the training prompts: nothing to prune toward")
    first = start.abs() if options.objective == "faithful" else start
    logits = warm_start(first, max(options.keeps)).requires_grad_(True)
    circuit_at = _Circuits(u, logits, options)
    step_logits = _optimizer(circuit_at.parameters, options)
    n = sum(len(b["answer_pos"]) for b in batches)
    log = PruneLog()

    def objective(learn: bool) -> float:
        """The objective of the circuits at every ``keep`` on the training prompts (``learn``: with its gradient)."""
        total = 0.0
        for keep in options.keeps:
            circuit = circuit_at(keep)
            for batch, ref, m_full, m_empty in zip(batches, refs, full, empty):
                with torch.set_grad_enabled(learn):
                    with ablation.patched(batch, circuit, ref):
                        ids, mask, pos = batch["clean_ids"], batch["attention_mask"], batch["answer_pos"]
                        out = forward_answer_logits(u.view.model, ids, mask, pos)
                    m = ablation.task.metric(out, batch).double()
                    if options.objective == "faithful":
                        part = (((m - m_full.to(m)) / gap) ** 2).sum()
                    else:
                        part = -((m - m_empty.to(m)) / gap).sum()
                    part = part / (n * len(options.keeps))
                    if learn:
                        part.backward()
                total += float(part.detach())
        return total

    for step in range(options.steps):
        before = kept(logits)
        for p in circuit_at.parameters:
            p.grad = None
        total = objective(learn=True)
        step_logits()
        circuit_at.recentre(max(options.keeps))
        log.objective.append(total)
        log.swapped.append(int((before & ~kept(logits)).sum()))
        circuit_at.log(log)
        if progress:
            progress(step, total)
    log.final = objective(learn=False)
    return circuit_at.result(), log


def _optimizer(parameters: list[Tensor], options: PruneOptions) -> Callable[[], None]:
    """One step of the logits ``parameters`` (the block logits, then at the direction level the writer and reader
    logits): Adam on the block logits; on the direction logits Adam, or with ``direction_step="proportional"`` SGD
    with momentum (``MOMENTUM``, as a moving average: dampened alike) of their gradients divided by the largest of
    them, at ``direction_lr``."""
    lr = options.lr if options.direction_lr is None else options.direction_lr
    if options.level != "directions":
        return torch.optim.Adam(parameters, lr=options.lr).step
    blocks, directions = torch.optim.Adam(parameters[:1], lr=options.lr), parameters[1:]
    proportional = options.direction_step == "proportional"
    if proportional:
        other: torch.optim.Optimizer = torch.optim.SGD(directions, lr=lr, momentum=MOMENTUM, dampening=MOMENTUM)
    else:
        other = torch.optim.Adam(directions, lr=lr)  # Adam's state is per logit: as one Adam over all at lr

    def step() -> None:
        blocks.step()
        if proportional:
            _over_largest([p.grad for p in directions if p.grad is not None and p.grad.numel()])
        other.step()

    return step


def _over_largest(grads: list[Tensor]) -> None:
    """Divide ``grads`` in place by the largest magnitude among them (none where every one is 0)."""
    largest = max((float(g.abs().max()) for g in grads), default=0.0)
    if largest > 0:
        for g in grads:
            g /= largest


class _Circuits:
    """The circuit trained at each fraction ``keep`` from the learned logits (``options.level``): ``SoftBlocks`` at
    the cut of the block logits, or ``SoftDirections`` (writer and reader logits from ``direction_start``) at the
    weighted cut."""

    def __init__(self, universe: EdgeUniverse, logits: Tensor, options: PruneOptions):
        self.u, self.logits, self.directed = universe, logits, options.level == "directions"
        self.largest, self.order = max(options.keeps), options.direction_order
        self.parameters = [logits]
        if self.directed:
            self.sizes = DirectionSizes(universe)
            start, (one_writer, one_reader) = options.direction_start, single_directions(universe)
            self.writers = torch.full(one_writer.shape, start).masked_fill_(one_writer, torch.inf).requires_grad_()
            self.readers = torch.full(one_reader.shape, start).masked_fill_(one_reader, torch.inf).requires_grad_()
            self.parameters += [self.writers, self.readers]
            self.recentre(max(options.keeps))

    def _cut(self, keep: float) -> float:
        if not self.directed:
            return cut(self.logits, keep)
        return direction_cut(self.sizes, self.logits, self.writers, self.readers, keep)

    def __call__(self, keep: float) -> SoftBlocks | SoftDirections:
        if not self.directed:
            return SoftBlocks(self.u, self.logits, self._cut(keep))
        if keep == self.largest:  # one cut of every logit: the circuit the recentring keeps positive
            return SoftDirections(self.u, self.logits, self.writers, self.readers, self._cut(keep))
        # a smaller nested circuit: the curve's cut in its order of the logits recentred at the largest
        return SoftDirections(self.u, *order_cut(self.sizes, self.logits, self.writers, self.readers, keep, self.order))

    @torch.no_grad()
    def recentre(self, keep: float) -> None:
        """Shift every logit so that the circuit at ``keep`` is the positive ones (no circuit or gradient changes)."""
        t = self._cut(keep)
        for p in self.parameters:
            p -= t

    def log(self, log: PruneLog) -> None:
        if self.directed:
            log.writers_kept.append(float(kept(self.writers).double().mean()))
            log.readers_kept.append(float(kept(self.readers).double().mean()))

    def result(self) -> Logits:
        if not self.directed:
            return self.logits.detach()
        return self.logits.detach(), self.writers.detach(), self.readers.detach()


def pruned_ranking(universe: EdgeUniverse, logits: Tensor) -> EdgeRanking:
    """The blocks ranked by their learned logits (higher first): a head-level ranking for the curves."""
    return unit_ranking(universe, logits)


def dropped_units(u: EdgeUniverse, writers: Tensor, readers: Tensor) -> dict[str, list[str]]:
    """The writer and reader units all of whose direction logits are <= 0, by the address of their first direction
    less its index: each is cut from every block at once. Training pins the units of one direction
    (``single_directions``), so only logits read back from before the pin (or set by hand) name the embedding or the
    logits here."""
    out: dict[str, list[str]] = {"writers": [], "readers": []}
    for w in u.writers:
        if not bool(kept(writers[w.offset : w.offset + w.size]).any()):
            out["writers"].append(str(u.writer_address(w.offset)).removesuffix(".d0"))
    for r in u.readers:
        if not bool(kept(readers[r.offset : r.offset + r.size]).any()):
            out["readers"].append(str(u.reader_address(r, 0)).removesuffix(".d0"))
    return out


def order_cut(
    sizes: DirectionSizes, blocks: Tensor, writers: Tensor, readers: Tensor, s: float, order: str
) -> tuple[Tensor, Tensor, Tensor]:
    """The logits shifted so that the circuit of weighted count at most ``s`` of the blocks in ``order``
    (``CUT_ORDERS``) is the positive ones: ``min``, one cut of every logit (edges ranked by ``min(b, x, y)``);
    ``blocks``, the directions above 0 held and the blocks cut by their logits, then (past every block) every block
    kept and the directions cut by theirs. Shifts only: a gradient passes through unchanged."""
    if order not in CUT_ORDERS:
        raise ValueError(f"order={order!r}: choose one of {', '.join(CUT_ORDERS)}")
    if order == "min":
        t = direction_cut(sizes, blocks, writers, readers, s)
        return blocks - t, writers - t, readers - t
    every = blocks - blocks.min().detach() + 1  # every block kept
    if s * sizes.universe.n_blocks <= sizes(every, writers, readers, 0.0):
        return blocks - direction_cut(sizes, blocks, writers, readers, s, (True, False, False)), writers, readers
    t = direction_cut(sizes, every, writers, readers, s, (False, True, True))
    return every, writers - t, readers - t


def direction_spec(
    universe: EdgeUniverse, blocks: Tensor, writers: Tensor, readers: Tensor, order: str = "blocks"
) -> CurveSpec:
    """The curve of direction-level pruning's logits on the fair axis: at each size the ``SoftDirections`` circuit of
    the largest cut in ``order`` within that weighted count (``order_cut``), its direction edges and weighted count.
    At the trained size both orders hold the trained circuit (the logits above 0; ``blocks`` may add blocks the
    weighted count still has room for)."""
    if order not in CUT_ORDERS:
        raise ValueError(f"order={order!r}: choose one of {', '.join(CUT_ORDERS)}")
    sizes = DirectionSizes(universe)

    def circuits(targets: Sequence[float]) -> list[tuple[Circuit, int, float]]:
        out: list[tuple[Circuit, int, float]] = []
        for s in targets:
            logits = order_cut(sizes, blocks, writers, readers, s, order)
            kept, weight = sizes.counts(*logits, 0.0)
            out.append((SoftDirections(universe, *logits), kept, weight))
        return out

    return CurveSpec(circuits)


def pruned_curves(
    ablation: EdgeAblation,
    batch: dict,
    start: Tensor,
    names: Sequence[str],
    options: PruneOptions,
    progress: Callable[[str], None] | None = None,
    keep_logits: Callable[[str, Logits], None] | None = None,
    trained: Mapping[str, Logits] | None = None,
    chunk: int | None = None,
    on_step: Callable[[str, int, float], None] | None = None,
) -> tuple[dict[str, CurveSpec], dict[str, dict]]:
    """The curves ``names`` (``pruned_abs_raw``: ``faithful``, ``pruned_signed_raw``: ``metric``, ``CURVE_OF``; at
    the direction level ``prunedirs_*_fair``, ``DIRECTION_CURVE_OF``) of rankings pruned on the prompts of ``batch``
    from the head-level scores ``start``, ``options`` but the objective and the level shared. Returns their specs
    (``edge_curves.ranked_spec``: raw axis for head-level edges, fair for direction edges) and per curve the run's
    options, seconds, objective per step and blocks swapped per step (and the directions kept per step, and
    ``dropped``: how many writer and reader directions the learned logits drop, 0 / 0: whole blocks;
    ``dropped_units``: ``dropped_units``).
    ``keep_logits(name, logits)`` is called with each run's learned logits (to save them); a curve in ``trained``
    (its logits, read back) is not trained again (its run: the options and ``read_back``). ``chunk``: the prompts of
    one forward and backward (``None``: all of ``batch``; smaller takes less memory for the same gradient).
    ``progress(message)`` is told what happens in words; each step's objective goes to ``on_step(name, step,
    objective)`` where given (a progress bar), to ``progress`` as a line otherwise."""
    u = ablation.u
    n = len(batch["answer_pos"])
    per_chunk = n if chunk is None else chunk
    if per_chunk < 1:
        raise ValueError(f"pruned_curves: chunk={chunk}, need at least 1 prompt")
    batches = [{k: v[i : i + per_chunk] for k, v in batch.items()} for i in range(0, n, per_chunk)]
    refs = [ablation.reference(b) for b in batches]
    full = [ablation.metric(b, AllEdges(), ref) for b, ref in zip(batches, refs)]
    empty = [ablation.metric(b, NoEdges(u), ref) for b, ref in zip(batches, refs)]
    specs: dict[str, CurveSpec] = {}
    runs: dict[str, dict] = {}
    for name in names:
        if name not in OBJECTIVE_OF:
            raise ValueError(f"pruned curve {name!r}: choose among {', '.join(OBJECTIVE_OF)}")
        opts = replace(options, objective=OBJECTIVE_OF[name], level=LEVEL_OF[name])
        t = time.monotonic()

        def say(step: int, value: float, name: str = name) -> None:
            if on_step is not None:
                on_step(name, step, value)
            elif progress is not None:
                progress(step_line(name, step, value))

        if trained is not None and name in trained:
            logits, log = trained[name], None
        else:
            logits, log = prune_blocks(ablation, batches, refs, full, empty, start, opts, say)
            if progress is not None:
                progress(f"{name}: objective of the learned logits (after their last update) {log.final:.4f}")
        if keep_logits is not None:
            keep_logits(name, logits)
        done: dict[str, object] = {"read_back": True} if log is None else asdict(log)
        if isinstance(logits, tuple):
            specs[name] = direction_spec(u, *logits, order=opts.direction_order)
            done["dropped"] = dropped = {
                "writers": int((~kept(logits[1])).sum()),
                "readers": int((~kept(logits[2])).sum()),
            }
            done["dropped_units"] = whole = dropped_units(u, logits[1], logits[2])
            if progress is not None and not any(dropped.values()):
                progress(f"{name}: no writer or reader direction dropped: the trained circuit is whole blocks")
            if progress is not None and any(whole.values()):
                progress(f"{name}: units dropped from every block at once: {whole}")
        else:
            specs[name] = ranked_spec(pruned_ranking(u, logits), "raw")
        runs[name] = asdict(opts) | done | {"prompts": n, "chunk": per_chunk, "seconds": time.monotonic() - t}
    return specs, runs
