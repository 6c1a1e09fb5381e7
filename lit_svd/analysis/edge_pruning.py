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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import Tensor

from lit_svd.analysis.edge_ablation import AllEdges, EdgeAblation, NoEdges, Reference
from lit_svd.analysis.edge_curves import CurveSpec, EdgeRanking, ranked_spec, unit_ranking
from lit_svd.analysis.edges import EdgeUniverse, ReaderUnit
from lit_svd.metrics import forward_answer_logits

OBJECTIVES = ("faithful", "metric")
CURVE_OF = {"faithful": "pruned_abs_raw", "metric": "pruned_signed_raw"}  # each objective's curve (CMD / CPR)
OBJECTIVE_OF = {name: objective for objective, name in CURVE_OF.items()}


@dataclass
class PruneOptions:
    """``objective`` (``OBJECTIVES``), ``steps``, Adam's ``lr``, the fraction(s) ``keep`` of the blocks kept (a tuple:
    nested circuits trained together, ascending)."""

    objective: str = "faithful"
    steps: int = 40
    lr: float = 0.05
    keep: float | tuple[float, ...] = 0.2

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}: choose one of {', '.join(OBJECTIVES)}")
        keeps = self.keeps
        if self.steps < 1 or self.lr <= 0 or not keeps or not all(0 < k < 1 for k in keeps):
            raise ValueError(
                f"steps={self.steps}, lr={self.lr}, keep={self.keep}: need steps >= 1, lr > 0, 0 < keep < 1"
            )

    @property
    def keeps(self) -> tuple[float, ...]:
        return tuple(sorted((self.keep,) if isinstance(self.keep, float | int) else self.keep))


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
        part = self.logits[self.universe.blocks(r)] - self.threshold
        soft = torch.sigmoid(part)
        return ((part > 0).to(soft.dtype) + (soft - soft.detach())).to(self.universe.dtype)  # exactly 0 / 1


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


def recentre(logits: Tensor, keep: float) -> None:
    """Shift ``logits`` in place so that exactly the top ``round(keep * n)`` are positive."""
    logits -= cut(logits, keep)


@dataclass
class PruneLog:
    """Per step: the objective on the training prompts (of the circuits before the step; several ``keep``: their
    mean) and how many blocks of the largest circuit the step swapped out (for as many others)."""

    objective: list[float] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)


def prune_blocks(
    ablation: EdgeAblation,
    batches: Sequence[dict],
    refs: Sequence[Reference],
    full: Sequence[Tensor],
    empty: Sequence[Tensor],
    start: Tensor,
    options: PruneOptions,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[Tensor, PruneLog]:
    """The learned logits ``[n_blocks]`` (float32) from the head-level block scores ``start`` (``warm_start``), and
    the training log. ``refs``: the batches' corrupted recordings; ``full`` / ``empty``: each batch's per-prompt
    metric of the full and the empty circuit."""
    u = ablation.u
    if start.shape != (u.n_blocks,):
        raise ValueError(f"prune_blocks: start scores of shape {tuple(start.shape)}, expected ({u.n_blocks},)")
    gap = float(torch.cat(list(full)).mean() - torch.cat(list(empty)).mean())
    if abs(gap) < 1e-12:
        raise ValueError("prune_blocks: m(full) equals m(empty) on the training prompts: nothing to prune toward")
    first = start.abs() if options.objective == "faithful" else start
    logits = warm_start(first, max(options.keeps)).requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=options.lr)
    n = sum(len(b["answer_pos"]) for b in batches)
    log = PruneLog()
    for step in range(options.steps):
        before = logits.detach() > 0
        opt.zero_grad()
        total = 0.0
        for keep in options.keeps:
            circuit = SoftBlocks(u, logits, cut(logits, keep))
            for batch, ref, m_full, m_empty in zip(batches, refs, full, empty):
                with ablation.patched(batch, circuit, ref):
                    ids, mask, pos = batch["clean_ids"], batch["attention_mask"], batch["answer_pos"]
                    out = forward_answer_logits(u.view.model, ids, mask, pos)
                m = ablation.task.metric(out, batch).double()
                if options.objective == "faithful":
                    part = (((m - m_full.to(m)) / gap) ** 2).sum()
                else:
                    part = -((m - m_empty.to(m)) / gap).sum()
                part = part / (n * len(options.keeps))
                part.backward()
                total += float(part.detach())
        opt.step()
        with torch.no_grad():
            recentre(logits, max(options.keeps))
        log.objective.append(total)
        log.swapped.append(int((before & ~(logits.detach() > 0)).sum()))
        if progress:
            progress(step, total)
    return logits.detach(), log


def pruned_ranking(universe: EdgeUniverse, logits: Tensor) -> EdgeRanking:
    """The blocks ranked by their learned logits (higher first): a head-level ranking for the curves."""
    return unit_ranking(universe, logits)


def pruned_curves(
    ablation: EdgeAblation,
    batch: dict,
    start: Tensor,
    names: Sequence[str],
    options: PruneOptions,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, CurveSpec], dict[str, dict]]:
    """The curves ``names`` (``pruned_abs_raw``: ``faithful``, ``pruned_signed_raw``: ``metric``; ``CURVE_OF``) of
    rankings pruned on the prompts of ``batch`` from the head-level scores ``start``, ``options`` but the objective
    shared. Returns their specs (``edge_curves.ranked_spec``, raw axis: head-level edges) and per curve the run's
    options, seconds, objective per step and blocks swapped per step."""
    u = ablation.u
    ref = ablation.reference(batch)
    full, empty = ablation.metric(batch, AllEdges(), ref), ablation.metric(batch, NoEdges(u), ref)
    specs: dict[str, CurveSpec] = {}
    runs: dict[str, dict] = {}
    for name in names:
        if name not in OBJECTIVE_OF:
            raise ValueError(f"pruned curve {name!r}: choose among {', '.join(OBJECTIVE_OF)}")
        opts = replace(options, objective=OBJECTIVE_OF[name])
        t = time.monotonic()
        say = None if progress is None else lambda step, value: progress(f"{name} step {step}: objective {value:.4f}")
        logits, log = prune_blocks(ablation, [batch], [ref], [full], [empty], start, opts, say)
        specs[name] = ranked_spec(pruned_ranking(u, logits), "raw")
        runs[name] = asdict(opts) | asdict(log) | {"prompts": len(batch["answer_pos"]), "seconds": time.monotonic() - t}
    return specs, runs
