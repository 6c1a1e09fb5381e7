"""A causal check per edge of a circuit graph (issue 24, item 3): patch only that edge, against random edges of
the same writer patched the same way on the same prompts.

**The edge patch.** An edge is a writer node ``W`` (a head's OV direction, an MLP output direction, the
embedding; several writers patch their sum) feeding one reader (``analysis.circuit_graph``: the metric, a head's
OV direction, a head's QK direction on the query or the key side) at the positions where that reader was read on
each prompt (``BatchGraphs.entries``). Its patch replaces ``W``'s contribution to that one reader by its value
with ``W``'s coefficients taken from the corrupted prompt at the same positions, the reader's norm factor and
every other frozen scale (pattern of a mixed OV read, the other side of a QK term, Gemma's post-norm factors)
from the clean run:

    delta = contrib(W corrupted -> reader) - contrib(W clean -> reader)

and injects ``delta`` into the reader's coefficient inside the real HF forward at the reader's site; everything
downstream runs live:

* OV reader ``Ll.ov.hH.dk`` (mixed at destination ``d``): the head's output gains ``delta(d) v_k`` at ``d``
  (``v_k``: the direction's write, before any post norm; a hook on the o projection's output);
* QK reader ``Ll.qk.hH.dk`` on the query side: every score ``(d, s')`` of head ``H`` changes by the writer's
  change of the term ``t_k(d, s')`` through the query input at ``d`` (key side held); on the key side: by its
  change through the key input at each source ``s'`` (query side held); the change is added to the scores of
  that head before its softmax (a pre-hook adds it to the attention module's additive mask: HF's eager
  attention re-softmaxes the row and mixes the live values). Gemma-2 soft-caps scores before the mask is added,
  so there the injected change is after the cap (an approximation on Gemma-2 only);
* the metric (``logit`` reader): read through the final norm with its factor frozen, the metric moves by
  ``delta`` exactly: ``m(patched) = m(clean) + delta`` (no forward is run).

Constant writers (biases, norm biases) have no corrupted value: their patch is the identity (effect 0).

**The null.** Random readers of the same reader component: Haar-random unit vectors ``a`` in the head's OV (or
QK) coefficient space, i.e. the reader ``sum_j a_j c_j``; the same writer's contribution to it changes by
``sum_j a_j delta_j`` and is injected the same way (OV: along ``sum_j a_j v_j``; QK: the score change
``sum_j a_j delta_j(d, s')``). The claimed edge is ``a = e_k``. For the metric: random unit readers ``r`` of the
final norm's output (the norm of the metric's read vector), whose patched coefficient moves the metric by
``delta_r cos(r, w)`` through the frozen final norm. ``N_RANDOM = 32`` draws per edge (seeded), issue 17's
statistics (``analysis.causal.summarize``: ``z = (|effect| - mean |null|) / std |null|``).

**The pass rule** (fixed before any run): ``z >= Z_PASS`` (2.326, one-sided 1 %) and ``|gap_fraction| >=
MIN_GAP_FRACTION`` (0.01), where ``gap_fraction = (m(clean) - m(patched)) / (m(clean) - m(corrupted))``, both
means over the edge's prompts: a patch that moves the metric by less than 1 % of the clean-vs-corrupted gap is
not called causal however far it lies from its null.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.analysis.causal import MIN_GAP_FRACTION, N_RANDOM, Z_PASS, random_coords, summarize
from lit_svd.analysis.circuit_graph import METRIC, BatchGraphs, concat_reads, metric_weights, row_scales
from lit_svd.analysis.decompose import Decomposer, Reads, Side, logit_reads, ov_reads, qk_reads
from lit_svd.analysis.sad import causal_visibility
from lit_svd.metrics import TaskScorer, forward_answer_logits, task_scorer
from lit_svd.models.base import ModelView
from lit_svd.models.hooks import Hook, hooks
from lit_svd.models.layer_passes import run_blocks
from lit_svd.models.points import ActivationCache, eager_attention

CHECKED_KINDS = ("logit", "ov", "qk_query", "qk_key")


@dataclass(frozen=True)
class Edge:
    """``writers`` (their contributions patched together; usually one) -> ``reader`` (None: the metric) read as
    ``kind`` (``logit``, ``ov``, ``qk_query``, ``qk_key``)."""

    writers: tuple[Address, ...]
    reader: Address | None
    kind: str

    @classmethod
    def of(cls, row: dict) -> Edge:
        """The edge of a direction-level row of ``EdgeSums.edges`` (``writer``, ``reader``, ``reader_kind``)."""
        reader = None if row["reader"] == METRIC else Address.parse(row["reader"])
        return cls((Address.parse(row["writer"]),), reader, row["reader_kind"])

    def check(self) -> Edge:
        if self.kind not in CHECKED_KINDS:
            raise ValueError(f"edge kind {self.kind!r} unknown; allowed: {', '.join(CHECKED_KINDS)}")
        if (self.reader is None) != (self.kind == "logit"):
            raise ValueError(f"edge {self}: the metric is read as 'logit', a direction as ov / qk_query / qk_key")
        if self.reader is not None and (self.reader.size != 1 or self.reader.kind != self.kind[:2]):
            raise ValueError(f"edge {self}: the reader must be one {self.kind[:2]} direction")
        return self

    def __str__(self) -> str:
        w = "+".join(str(a) for a in self.writers)
        return f"{w} -> {METRIC if self.reader is None else self.reader} ({self.kind})"


@dataclass
class CheckContext:
    """One batch's clean and corrupted caches and coefficient tables, the clean and corrupted metrics."""

    batch: dict
    clean: ActivationCache
    corrupt: ActivationCache
    clean_table: Tensor
    corrupt_table: Tensor
    m_clean: Tensor  # [B]
    m_corrupt: Tensor  # [B]
    boundaries: dict = field(default_factory=dict)  # layer l -> block l - 1's output on the clean prompts

    def boundary(self, view: ModelView, layer: int) -> Any:
        """Block ``layer - 1``'s output on the clean prompts (recorded once per layer): the patched forwards of a
        reader at ``layer`` replay it instead of running the blocks below (``models.layer_passes``)."""
        if layer not in self.boundaries:
            b = self.batch
            self.boundaries[layer] = run_blocks(
                view,
                lambda: view.model(input_ids=b["clean_ids"], attention_mask=b["attention_mask"], use_cache=False),
                stop=layer - 1,
                record=layer - 1,
            )
        return self.boundaries[layer]


@torch.no_grad()
def check_context(dec: Decomposer, batch: dict, task: str | TaskScorer) -> CheckContext:
    """Run the clean and corrupted prompts of ``batch`` once each (cached) and score both."""
    view, task = dec.view, task_scorer(task)
    points = dec.points(mix=True)
    clean = view.run_with_cache(points, batch["clean_ids"], batch["attention_mask"])
    corrupt = view.run_with_cache(points, batch["corrupt_ids"], batch["attention_mask"])
    with eager_attention(view.model):
        m = [
            task.metric(
                forward_answer_logits(view.model, batch[k], batch["attention_mask"], batch["answer_pos"]), batch
            )
            for k in ("clean_ids", "corrupt_ids")
        ]
    return CheckContext(
        batch,
        clean,
        corrupt,
        dec.coefficient_table(clean),
        dec.coefficient_table(corrupt),
        m[0].double(),
        m[1].double(),
    )


def write_change(
    dec: Decomposer, ctx: CheckContext, writers: Sequence[Address], b: Int[Tensor, " R"], pos: Int[Tensor, " R"]
) -> Float[Tensor, "R d_model"]:
    """``[R, d_model]``: the change of the summed write of ``writers`` at rows ``(b, pos)`` from the clean to the
    corrupted prompt (coefficients from the corrupted run, write vectors fixed; the embedding: its own change;
    constant nodes: none)."""
    index = {a: i for i, a in enumerate(dec.nodes)}
    out = torch.zeros(len(b), dec.writers.shape[1], dtype=dec.dtype, device=dec.writers.device)
    for w in writers:
        if w.kind == "embed":
            out += ctx.corrupt["embed"][b, pos].to(dec.dtype) - ctx.clean["embed"][b, pos].to(dec.dtype)
        elif w in index:
            j = index[w] - 1
            change = ctx.corrupt_table[b, pos, j] - ctx.clean_table[b, pos, j]
            out += change.to(dec.dtype)[:, None] * dec.writers[j]
    return out


def read_changes(
    dec: Decomposer, ctx: CheckContext, reads: Reads, writers: Sequence[Address]
) -> Float[Tensor, " n_readers"]:
    """``[n_readers]``: each reader's change when the writers' contributions take their corrupted values."""
    r, scale = row_scales(dec, ctx.clean, reads)
    change = write_change(dec, ctx, writers, reads.batch, reads.position)
    per_row = scale * (r * change).sum(-1)
    return torch.zeros(reads.n_readers, dtype=dec.dtype, device=per_row.device).index_add_(0, reads.reader, per_row)


def _entries(graphs: BatchGraphs, edge: Edge) -> dict[int, dict[tuple[int, int], float]]:
    """``{prompt: {(dest, src): weight}}`` where the edge's reader was expanded."""
    return {b: e for (b, r, k), e in graphs.entries.items() if r == edge.reader and k == edge.kind}


@dataclass
class EdgePlan:
    """What one edge's check runs on one batch: the prompts, and per probe (row 0: the edge, then the random
    draws) the patch: ``ov`` adds ``add[prompt, probe, T, d_model]`` to the head's output; ``qk`` adds
    ``score[prompt, probe, T, T]`` to the head's scores; ``logit`` moves the metric by ``metric[prompt, probe]``."""

    edge: Edge
    prompts: Tensor
    add: Tensor | None = None
    score: Tensor | None = None
    metric: Tensor | None = None
    K: int = 0


@torch.no_grad()
def plan_edge(
    dec: Decomposer,
    ctx: CheckContext,
    graphs: BatchGraphs,
    edge: Edge,
    task: str | TaskScorer,
    n_random: int = N_RANDOM,
    seed: int = 0,
) -> EdgePlan | None:
    """The patches of ``edge`` and of ``n_random`` random readers of the same component on the batch's prompts
    where the reader was read (None when it was read on none of them)."""
    edge.check()
    view, dt = dec.view, dec.dtype
    gen = torch.Generator().manual_seed(seed)
    batch = ctx.batch
    if edge.kind == "logit":
        B = len(batch["answer_pos"])
        rows = torch.arange(B)
        weights = metric_weights(dec, ctx.clean, batch, task)
        reads = logit_reads(dec, ctx.clean, rows, batch["answer_pos"], weights)
        real = read_changes(dec, ctx, reads, edge.writers)  # [B]
        r, scale = row_scales(dec, ctx.clean, reads)  # r: the metric's read vector, scale: its frozen factor
        rnd = random_coords(n_random, r.shape[1], gen).to(dt)  # [N, d]
        change = write_change(dec, ctx, edge.writers, reads.batch, reads.position)  # [B, d]
        norm = r.norm(dim=-1, keepdim=True)  # [B, 1]
        delta_r = scale[:, None] * norm * (change @ rnd.T)  # [B, N]: each random reader's coefficient change
        cos = (r / norm) @ rnd.T  # [B, N]
        return EdgePlan(edge, rows, metric=torch.cat([real[:, None], delta_r * cos], 1))
    entries = _entries(graphs, edge)
    if not entries:
        return None
    prompts = sorted(entries)
    if edge.reader is None:
        raise ValueError(f"edge {edge}: a {edge.kind} edge needs a reader direction")
    l, h, k = edge.reader.layer, edge.reader.group, edge.reader.index
    B, T = batch["clean_ids"].shape
    if edge.kind == "ov":
        K = dec.layers[l].ov_S.shape[-1]
        coords = torch.cat([torch.eye(K)[[k]], random_coords(n_random, K, gen)]).to(dt)  # [1 + N, K]
        pb, pd = [], []
        for b in prompts:
            for d, _ in entries[b]:
                pb.append(b)
                pd.append(d)
        reads = ov_reads(dec, ctx.clean, l, h, pb, pd, None, mix=True)
        delta = read_changes(dec, ctx, reads, edge.writers).reshape(len(pb), K)  # [E, K]
        V = dec.layers[l].ov_V[h]  # [d, K]
        dirs = coords @ V.T  # [1 + N, d]
        add = torch.zeros(len(prompts), len(coords), T, V.shape[0], dtype=dt)
        where = {b: i for i, b in enumerate(prompts)}
        for e, (b, d) in enumerate(zip(pb, pd)):
            add[where[b], :, d] += (coords @ delta[e])[:, None] * dirs
        return EdgePlan(edge, torch.tensor(prompts), add=add, K=K)
    side: Side = "query" if edge.kind == "qk_query" else "key"
    svd = dec.qk_basis(l)[2]
    K = svd.S.shape[-1]
    coords = torch.cat([torch.eye(K)[[k]], random_coords(n_random, K, gen)]).to(dt)
    mask = batch["attention_mask"]
    pb, pd, ps = [], [], []
    for b in prompts:
        vis = causal_visibility(mask, view.window(l))[b]
        for d in sorted({d for d, _ in entries[b]}):
            for s in torch.nonzero(vis[d]).flatten().tolist():
                pb.append(b)
                pd.append(d)
                ps.append(s)
    parts = [qk_reads(dec, ctx.clean, l, h, pb, pd, ps, mask, None, side, relative=False)]
    delta = read_changes(dec, ctx, concat_reads(parts), edge.writers).reshape(len(pb), K)  # [pairs, K]
    score = torch.zeros(len(prompts), len(coords), T, T, dtype=dt)
    where = {b: i for i, b in enumerate(prompts)}
    per = coords @ delta.T  # [1 + N, pairs]
    for e, (b, d, s) in enumerate(zip(pb, pd, ps)):
        score[where[b], :, d, s] += per[:, e]
    return EdgePlan(edge, torch.tensor(prompts), score=score, K=K)


def _ov_hook(view: ModelView, layer: int, add: Tensor) -> Hook:
    def hook(module, args, kwargs, out):
        site = view.site_output(layer, "o", out)
        return view.with_site_output(layer, "o", out, site + add.to(site.dtype))

    return Hook(view.site_module(layer, "o"), hook, "post")


def _qk_hook(view: ModelView, layer: int, head: int, score: Tensor) -> Hook:
    def hook(module, args, kwargs):
        m = kwargs.get("attention_mask")
        if m is None or not torch.is_floating_point(m):
            raise RuntimeError("edge check: the attention module got no additive float mask (run eager attention)")
        extra = torch.zeros(m.shape[0], view.n_heads, *m.shape[2:], dtype=m.dtype, device=m.device)
        extra[:, head, :, : score.shape[-1]] = score.to(m.dtype)
        return args, {**kwargs, "attention_mask": m + extra}

    return Hook(view.attention_module(layer), hook, "pre")


@torch.no_grad()
def patched_changes(
    dec: Decomposer, ctx: CheckContext, plan: EdgePlan, task: str | TaskScorer, rows_per_forward: int = 256
) -> Float[Tensor, "P probes"]:
    """``[n_prompts, 1 + n_random]``: the metric's change (patched - clean) on the plan's prompts, per probe."""
    task = task_scorer(task)
    if plan.metric is not None:
        return plan.metric
    view, batch = dec.view, ctx.batch
    P = len(plan.prompts)
    patch = plan.add if plan.add is not None else plan.score  # ov: add, qk: score
    if patch is None:
        raise ValueError(f"edge plan of {plan.edge}: none of metric, add, score is set")
    reader = plan.edge.reader
    if reader is None:
        raise ValueError(f"edge plan of {plan.edge}: an ov / qk patch needs a reader direction")
    n_probes = patch.shape[1]
    out = torch.empty(P, n_probes, dtype=torch.float64)
    flat = [(i, j) for i in range(P) for j in range(n_probes)]
    l = reader.layer
    for start in range(0, len(flat), rows_per_forward):
        chunk = flat[start : start + rows_per_forward]
        pi = torch.tensor([plan.prompts[i] for i, _ in chunk])
        ii = torch.tensor([i for i, _ in chunk])
        jj = torch.tensor([j for _, j in chunk])
        sub = {k: v[pi] for k, v in batch.items() if isinstance(v, Tensor)}
        if plan.add is not None:
            hook = _ov_hook(view, l, plan.add[ii, jj])
        else:
            hook = _qk_hook(view, l, reader.group, patch[ii, jj])  # patch is plan.score
        got = []

        def forward(sub: dict = sub) -> None:
            got.append(forward_answer_logits(view.model, sub["clean_ids"], sub["attention_mask"], sub["answer_pos"]))

        with eager_attention(view.model), hooks(hook):
            if l == 0:
                forward()
            else:  # the blocks below the reader replay the clean run's boundary (they are not patched)
                run_blocks(view, forward, start=l, resume=_rows(ctx.boundary(view, l), pi))
        out[ii, jj] = task.metric(got[0], sub).double() - ctx.m_clean[pi]
    return out


def _rows(output: Any, rows: Tensor) -> Any:
    """Rows ``rows`` of a block's recorded output (a tensor, or a tuple whose first part is the hidden states)."""
    if isinstance(output, (tuple, list)):
        return type(output)([output[0][rows], *output[1:]])
    return output[rows]


@dataclass
class EdgeTotals:
    """Sums over prompts for one edge: ``change[1 + n_random]`` (the edge, then the random readers), the clean -
    corrupted ``gap`` summed over the same prompts, ``prompts``. Adds across batches and DDP ranks."""

    change: Tensor
    gap: float = 0.0
    prompts: int = 0

    def add(self, other: EdgeTotals) -> EdgeTotals:
        return EdgeTotals(self.change + other.change, self.gap + other.gap, self.prompts + other.prompts)


def check_batch(
    dec: Decomposer,
    ctx: CheckContext,
    graphs: BatchGraphs,
    edges: Sequence[Edge],
    task: str | TaskScorer,
    n_random: int = N_RANDOM,
    seed: int = 0,
    rows_per_forward: int = 256,
) -> dict[Edge, EdgeTotals]:
    """Each edge's sums on one batch (edges whose reader was read on none of its prompts are left out)."""
    out = {}
    for edge in edges:
        plan = plan_edge(dec, ctx, graphs, edge, task, n_random, seed)
        if plan is None:
            continue
        ch = patched_changes(dec, ctx, plan, task, rows_per_forward)
        gap = (ctx.m_clean - ctx.m_corrupt)[plan.prompts]
        out[edge] = EdgeTotals(ch.sum(0), float(gap.sum()), len(plan.prompts))
    return out


def judge_edge(edge: Edge, totals: EdgeTotals) -> dict:
    """The check row of one edge: ``effect`` (mean change of the metric), the null (``null_mean``, ``null_std``,
    ``z``, ``percentile``), ``gap`` (mean clean - corrupted metric over the same prompts), ``gap_fraction``
    (``-effect / gap``), ``passes_z`` (z alone) and ``passes`` (z and ``|gap_fraction| >= MIN_GAP_FRACTION``)."""
    n = max(totals.prompts, 1)
    mean = totals.change / n
    row = summarize(float(mean[0]), mean[1:])
    gap = totals.gap / n
    frac = -float(mean[0]) / gap if gap != 0 else 0.0
    passes_z = bool(row.pop("passes"))
    return {
        "writer": "+".join(str(a) for a in edge.writers),
        "reader": METRIC if edge.reader is None else str(edge.reader),
        "reader_kind": edge.kind,
        **row,
        "gap": gap,
        "gap_fraction": frac,
        "prompts": totals.prompts,
        "passes_z": passes_z,
        "passes": bool(passes_z and row["z"] >= Z_PASS and abs(frac) >= MIN_GAP_FRACTION),
    }
