"""The circuit graph of an edge circuit (issue 33 item 4; docs/circuits.md, "Edge circuits"): what is drawn is the
attribution circuit itself, at a chosen size, with its own faithfulness.

**The graph.** A node is a unit: the embedding, a head (its OV map: value reads in, writes out), a head's query
input, a KV head's key input, an MLP's input (its ``mlp_in`` and ``mlp_gate`` directions) and output, the logits
(the root ``metric``). An edge is a **block** of the circuit: a writer unit and a reader unit with at least one
direction edge kept, carrying ``n_kept`` (its kept direction edges), ``fraction`` (of the block's direction edges),
``weight`` (the sum of their EAP-IG scores: the block's attribution within the circuit) and ``abs_weight`` (the
sum of |score|). Every kept direction edge is in exactly one drawn edge, so the drawing is the circuit at unit
resolution; the strongest direction edges are listed apart (``top_edges``).

**The causal check** (issue 24's statistics, ``analysis.causal``): each of the circuit's ``n_check`` strongest
direction edges (by |score|) is dropped alone from the full model under the edge ablation (``m(every edge but e) -
m(full)``, the exact effect of that edge), against ``n_random`` random edges of the same writer direction into
other directions of the same reader unit (the logits: other directions of the same writer unit into the logits),
dropped the same way: ``z = (|effect| - mean |null|) / std |null|``; passes at ``z >= Z_PASS`` and ``|gap
fraction| >= MIN_GAP_FRACTION``, fixed before any run (``analysis.edge_check``'s rule). The check row is attached to
the drawn edge holding that direction edge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lit_svd.addresses import EMBED_LAYER, Address
from lit_svd.analysis.causal import MIN_GAP_FRACTION, Z_PASS, summarize
from lit_svd.analysis.edge_ablation import AllEdges, Circuit, EdgeAblation, NoEdges, UnitMasks
from lit_svd.analysis.edge_attribution import EdgeScores
from lit_svd.analysis.edges import EdgeUniverse, ReaderUnit, WriterUnit

GRAPH_F = 0.8  # the default circuit drawn: the smallest grid size whose f reaches this
PAGE_BLOCKS = 200  # the most blocks drawn on the page by default (readable at 1600 x 1100 pixels)
ROOT = "metric"
READER_KIND = {"q": "q", "k": "k", "v": "v", "mlp": "mlp", "logits": "logit"}


def graph_size(curve: dict, f_target: float = GRAPH_F) -> float | None:
    """The smallest size of ``curve`` (a curve row) whose ``f`` reaches ``f_target``; None if no size does."""
    for size, value in zip(curve["sizes"], curve["values"]):
        if value is not None and value >= f_target:
            return float(size)
    return None


def choose_size(
    name: str, curve: dict, size: float | None, f_target: float, unreached: str = "skip"
) -> tuple[float | None, str, str | None]:
    """The size of curve ``name`` to draw, how it was chosen and a one-line warning (None: nothing to say).

    ``size`` given: that size (``"graph_size"``). Else the smallest size whose f reaches ``f_target``
    (``"graph_f"``). If no size does, never silently another circuit: the warning names the best f reached and its
    size; ``unreached="best"`` draws that size (``"best"``), ``"skip"`` draws nothing (size None, ``"none"``)."""
    if size is not None:
        return float(size), "graph_size", None
    found = graph_size(curve, f_target)
    if found is not None:
        return found, "graph_f", None
    finite = [(v, s) for s, v in zip(curve["sizes"], curve["values"]) if v is not None and math.isfinite(v)]
    best_f, best = max(finite, key=lambda t: (t[0], -t[1])) if finite else (math.nan, None)
    note = f"graph_curve={name} never reaches graph_f={f_target} (best f {best_f:.3f} at size {best})"
    if unreached == "best" and best is not None:
        return float(best), "best", note + "; drawing that size (graph_unreached: best)"
    return (
        None,
        "none",
        note
        + (
            "; no graph drawn: set graph_size, a lower graph_f, another graph_curve (an absolute ranking) or"
            " graph_unreached: best"
        ),
    )


def writer_node(w: WriterUnit) -> Address:
    if w.kind == "embed":
        return Address(EMBED_LAYER, "embed")
    return Address(w.layer, "ov" if w.kind == "head" else "mlp_out", w.group, 0, w.size)


def reader_node(u: EdgeUniverse, r: ReaderUnit) -> Address | None:
    """The node of a reader unit (None: the logits, the root)."""
    if r.kind == "logits":
        return None
    if r.kind == "mlp":
        return Address(r.layer, "mlp_in", 0, 0, r.size)
    return Address(r.layer, "ov" if r.kind == "v" else r.kind, r.group, 0, r.size)


def _name(a: Address | None) -> str:
    return ROOT if a is None else str(a)


def top_edges(scores: EdgeScores, n: int, circuit: Circuit | None = None) -> list[dict]:
    """The ``n`` direction edges of largest |score| (of ``circuit``'s kept edges, if given): ``writer``, ``reader``
    (addresses), ``reader_unit``, ``score``, ``unit``, ``index`` (the reader unit and the edge's flat index in its
    ``[K, n_cols]`` scores)."""
    u = scores.universe
    if n == 0:
        return []
    cand: list[tuple[float, int, int]] = []
    for r in u.readers:
        S = scores.directions(r).reshape(-1)
        a = S.abs()
        if circuit is not None:
            keep = circuit.keep(r)
            if keep is not None:
                a = torch.where(keep.reshape(-1).to(a.device), a, torch.full_like(a, -1.0))
        top = a.topk(min(n, a.numel()))
        cand += [(float(v), r.index, int(i)) for v, i in zip(top.values, top.indices) if v >= 0]
    cand.sort(key=lambda c: (-c[0], c[1], c[2]))
    out = []
    for _, unit, flat in cand[:n]:
        r = u.readers[unit]
        k, col = divmod(flat, r.n_cols)
        out.append({
            "writer": str(u.writer_address(col)),
            "reader": _name(None) if r.kind == "logits" else str(u.reader_address(r, k)),
            "reader_unit": str(r),
            "score": float(scores.directions(r).reshape(-1)[flat]),
            "unit": unit,
            "index": flat,
        })  # fmt: skip
    return out


def _drop_one(r: ReaderUnit, flat: int, device: torch.device) -> UnitMasks:
    mask = torch.ones(r.size * r.n_cols, dtype=torch.bool, device=device)
    mask[flat] = False
    return UnitMasks({r.index: mask.reshape(r.size, r.n_cols)})


def _null_edges(u: EdgeUniverse, r: ReaderUnit, flat: int, n: int, g: torch.Generator) -> list[int]:
    """``n`` random other edges of the same writer direction into ``r`` (the logits: of the same writer unit)."""
    k, col = divmod(flat, r.n_cols)
    if r.size > 1:
        others = torch.tensor([j for j in range(r.size) if j != k])
        pick = others[torch.randint(len(others), (n,), generator=g)]
        return [int(j) * r.n_cols + col for j in pick]
    w = u.writers[int(u.col_unit[col])]
    others = torch.tensor([c for c in range(w.offset, w.offset + w.size) if c != col])
    if not len(others):
        return []
    return [int(c) for c in others[torch.randint(len(others), (n,), generator=g)]]


@torch.no_grad()
def check_edges(
    ablation: EdgeAblation,
    batches: Sequence[dict],
    circuit: Circuit,
    scores: EdgeScores,
    n_check: int,
    n_random: int,
    seed: int = 0,
) -> list[dict]:
    """The causal check of ``circuit``'s ``n_check`` strongest direction edges (module docstring): per edge
    ``writer``, ``reader``, ``reader_unit``, ``score``, ``effect``, ``gap_fraction``, ``null_mean``, ``null_std``,
    ``z``, ``percentile``, ``passes_z``, ``passes``."""
    u = ablation.u
    refs = [ablation.reference(b) for b in batches]
    prompts = sum(len(b["answer_pos"]) for b in batches)

    def mean_metric(c: Circuit) -> float:
        return sum(float(ablation.metric(b, c, ref).sum()) for b, ref in zip(batches, refs)) / prompts

    full = mean_metric(AllEdges())
    gap = full - mean_metric(NoEdges(u))
    g = torch.Generator().manual_seed(seed)
    rows = []
    for edge in top_edges(scores, n_check, circuit):
        r = u.readers[edge["unit"]]
        effect = mean_metric(_drop_one(r, edge["index"], u.device)) - full
        null = torch.tensor(
            [mean_metric(_drop_one(r, j, u.device)) - full for j in _null_edges(u, r, edge["index"], n_random, g)],
            dtype=torch.float64,
        )
        stats: dict = summarize(effect, null) if len(null) > 1 else {"z": None, "percentile": None}
        gap_fraction = -effect / gap if gap else None
        z = stats.get("z")
        passes_z = z is not None and z >= Z_PASS
        rows.append({
            **{k: edge[k] for k in ("writer", "reader", "reader_unit", "score")},
            "effect": effect,
            "gap_fraction": gap_fraction,
            **{k: stats.get(k) for k in ("null_mean", "null_std", "z", "percentile")},
            "passes_z": passes_z,
            "passes": passes_z and gap_fraction is not None and abs(gap_fraction) >= MIN_GAP_FRACTION,
        })  # fmt: skip
    return rows


def circuit_graph(u: EdgeUniverse, scores: EdgeScores, circuit: Circuit, checks: Sequence[dict] = ()) -> dict:
    """The graph of ``circuit`` (module docstring): ``nodes`` and ``edges`` as ``results.circuits.CircuitResult``
    holds them (edges with ``n_kept``, ``fraction``, ``weight``, ``abs_weight``, ``reader_kind``; a checked direction
    edge's check on the edge holding it, with ``checked_edge``), ``checks``, and the circuit's ``blocks``."""
    nodes: dict[str, dict] = {}
    edges: list[dict] = []

    def node(a: Address | None, unit: str) -> str:
        key = _name(a)
        if key not in nodes:
            if a is None:
                nodes[key] = {"address": ROOT, "layer": u.view.n_layers, "kind": "metric", "group": 0, "index": 0,
                              "size": 1, "unit": "root"}  # fmt: skip
            else:
                nodes[key] = {"address": key, "layer": a.layer, "kind": a.kind, "group": a.group, "index": a.index,
                              "size": a.size, "unit": unit}  # fmt: skip
        return key

    for r in u.readers:
        S = scores.directions(r)
        keep = circuit.keep(r)
        keep = torch.ones_like(S, dtype=torch.bool) if keep is None else keep.to(S.device)
        kept = torch.zeros(r.n_up, dtype=torch.long).index_add_(0, u.col_unit[: r.n_cols].cpu(), keep.sum(0).cpu())
        Sk = torch.where(keep, S, torch.zeros_like(S))
        weight = torch.zeros(r.n_up, dtype=torch.float64).index_add_(
            0, u.col_unit[: r.n_cols].cpu(), Sk.sum(0).double().cpu()
        )
        abs_weight = torch.zeros(r.n_up, dtype=torch.float64).index_add_(
            0, u.col_unit[: r.n_cols].cpu(), Sk.abs().sum(0).double().cpu()
        )
        for U in torch.nonzero(kept).flatten().tolist():
            w = u.writers[U]
            edges.append({
                "writer": node(writer_node(w), "unit"),
                "reader": node(reader_node(u, r), "unit"),
                "reader_kind": READER_KIND[r.kind],
                "weight": float(weight[U]),
                "abs_weight": float(abs_weight[U]),
                "kept_in": None,
                "n_kept": int(kept[U]),
                "fraction": int(kept[U]) / (w.size * r.size),
            })  # fmt: skip
    by_block = {(e["writer"], e["reader"], e["reader_kind"]): e for e in edges}
    for row in checks:
        r = next(q for q in u.readers if str(q) == row["reader_unit"])
        w = u.writers[int(u.col_unit[_column(u, row["writer"])])]
        e = by_block.get((_name(writer_node(w)), _name(reader_node(u, r)), READER_KIND[r.kind]))
        if e is not None and e.get("checked_edge") is None:  # the strongest checked edge of a block speaks for it
            e.update({k: row[k] for k in ("effect", "gap_fraction", "null_mean", "null_std", "z", "percentile",
                                          "passes_z", "passes")})  # fmt: skip
            e["checked_edge"] = f"{row['writer']} -> {row['reader']}"
    return {"nodes": list(nodes.values()), "edges": edges, "checks": list(checks)}


def _column(u: EdgeUniverse, writer: str) -> int:
    """The writer column of an address string."""
    if writer == "embed":
        return 0
    a = Address.parse(writer)
    units = [w for w in u.writers if w.layer == a.layer and w.kind == ("head" if a.kind == "ov" else "mlp")]
    w = units[a.group] if a.kind == "ov" else units[0]
    return w.offset + a.index
