"""Orderings of the faithfulness universe (``analysis.faithfulness.Universe``): which directions a circuit of a
given size keeps. Each is a permutation of the universe's flat indices, most important first.

* ``random_ranking``: a seeded random order (the baseline that must sit at the bottom).
* ``score_ranking``: by a score per direction, descending; ties and unscored directions (NaN) follow in a seeded
  random order (``tail_seed``), so a ranking that knows nothing about some directions treats them as the random
  baseline does.
* ``mask_ranking``: a finished mask run's directions by lambda (``runs.load_run``; components of the universe
  the run did not mask are unscored).
* ``graph_ranking``: directions by their importance in a circuit graph: the sum of ``abs_weight`` (or
  ``|weight|``) over the node's edges, in and out; a block node gives its score to each of its directions, a
  constant node (embedding, biases) is not in the universe and is skipped. With ``mlp_inputs`` (the ``graph_mlp``
  method) every MLP layer with scored output directions also ranks its input and gate directions, each at the
  layer's largest output-direction score (by singular index within the layer): the graph splits reads only up
  to an MLP's output directions (the activation and gate are not linear), and those are computed from them.
* ``attribution_rankings``: a direction attribution (``analysis.direction_attribution``) ranked twice, signed (most
  positive first: MIB's CPR ranking) and by magnitude (MIB's CMD ranking); ``per_weight`` divides a score by the
  direction's cost on a weighted size axis (``faithfulness.fair_weights``).
* ``eap_ranking``: head-level attribution patching (``analysis.attribution``, or head-level EAP-IG summed from
  direction attributions): heads and MLP layers by ``|attribution|`` (``signed``: by attribution); a head brings
  its ``q`` and ``ov`` directions and, the first time one of its query heads comes, its KV head's ``k``
  directions; an MLP layer brings ``mlp_in``, ``mlp_gate``, ``mlp_out``. Within a unit the directions are
  interleaved by singular index (d0 of every map, then d1, ...), so a size that cuts a unit keeps its leading
  directions of every map.
* ``unit_rankings``: one merged order per unit of fair size over whole units (query heads, KV heads, MLP layers)
  and single directions; a unit's score is its directions' summed score or, from ``writer_unit_scores``, its
  head-level EAP-IG (the writer path).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.analysis.attribution import Attributions
from lit_svd.analysis.faithfulness import Universe
from lit_svd.linalg import SVD, average_ranks, svd_factored
from lit_svd.models.base import ModelView

if TYPE_CHECKING:
    import networkx as nx

TAIL_SEED = 0  # the seeded random order of ties and unscored directions, fixed before any run


def random_ranking(n: int, seed: int) -> Tensor:
    """A seeded random permutation of ``0 .. n-1``."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))


def attribution_rankings(scores: Tensor, tail_seed: int = TAIL_SEED) -> dict[str, Tensor]:
    """``{"signed": by score descending, "absolute": by |score| descending}`` (``score_ranking``): MIB scores a
    method's CPR on the first and its CMD on the second."""
    scores = torch.as_tensor(scores, dtype=torch.float64)
    return {"signed": score_ranking(scores, tail_seed), "absolute": score_ranking(scores.abs(), tail_seed)}


def per_weight(scores: Tensor, weights: Tensor) -> Tensor:
    """``scores / weights``: a direction's score per unit of the size it costs on a weighted axis (the fair axis:
    ``faithfulness.fair_weights``), so that a prefix of the ranking gathers the most score for its size."""
    return torch.as_tensor(scores, dtype=torch.float64) / weights.double()


def score_ranking(scores: Tensor, tail_seed: int = TAIL_SEED) -> Tensor:
    """Flat indices by ``scores: [N]`` descending; ties and NaN (unscored) in a seeded random order, NaN last."""
    scores = torch.as_tensor(scores, dtype=torch.float64).flatten().cpu()
    perm = random_ranking(len(scores), tail_seed)
    s = scores[perm]
    s = torch.where(torch.isnan(s), torch.full_like(s, -math.inf), s)
    return perm[torch.sort(-s, stable=True).indices]


def address_scores(universe: Universe, scores: Mapping[Address, float]) -> tuple[Tensor, dict]:
    """``[N]`` scores (NaN where unscored) from ``{Address: score}``: a direction gets its score, a block (``size >
    1``) gives it to every direction it spans, repeated addresses add up. Returns ``(scores, info)`` with the counts
    of nodes used and skipped (constant nodes and directions outside the universe)."""
    out = torch.full((len(universe),), math.nan, dtype=torch.float64)
    used = skipped = 0
    for address, value in scores.items():
        if not address.is_direction:
            skipped += 1
            continue
        flats = []
        for k in address.directions:
            single = Address(address.layer, address.kind, address.group, k)
            if universe.has(single):
                flats.append(universe.index(single))
        if not flats:
            skipped += 1
            continue
        used += 1
        idx = torch.tensor(flats)
        out[idx] = torch.nan_to_num(out[idx], nan=0.0) + float(value)
    return out, {"nodes_used": used, "nodes_skipped": skipped, "directions_scored": int((~out.isnan()).sum())}


def _node_address(node: Any) -> Address | None:
    """A graph node's address (None for the root ``metric`` and other non-address keys)."""
    if isinstance(node, Address):
        return node
    try:
        return Address.parse(str(node))
    except ValueError:
        return None


def edge_node_scores(edges: Iterable[dict]) -> dict[Address, float]:
    """Per node, the sum of the absolute weights of its edges, in and out, from edge rows (``writer``, ``reader``,
    ``abs_weight`` or ``weight``: a circuit run's results.json ``edges``)."""
    out: dict[Address, float] = {}
    for e in edges:
        w = e.get("abs_weight")
        w = abs(float(e.get("weight") or 0.0)) if w is None else float(w)
        for node in (e["writer"], e["reader"]):
            a = _node_address(node)
            if a is not None:
                out[a] = out.get(a, 0.0) + w
    return out


def graph_node_scores(graph: nx.DiGraph) -> dict[Address, float]:
    """``edge_node_scores`` of a networkx graph keyed by ``str(Address)`` (edge attributes ``abs_weight`` or
    ``weight``; the root ``metric`` is not a direction); nodes without edges score 0."""
    out = edge_node_scores({"writer": u, "reader": v, **data} for u, v, data in graph.edges(data=True))
    for node in graph.nodes:
        a = _node_address(node)
        if a is not None:
            out.setdefault(a, 0.0)
    return out


@torch.no_grad()
def qk_to_map_scores(view: ModelView, universe: Universe, scores: Mapping[Address, float]) -> dict[Address, float]:
    """``scores`` with every ``qk`` node (a direction of SAD's basis, the SVD of a head's ``Omega(0) = A_q A_k^T``)
    replaced by scores on the universe's ``q`` directions of that head and ``k`` directions of its KV head: the
    node's score spread by the squared overlaps of its query-side (key-side) singular vector with the q (k) map's
    input singular vectors. The query-side vector lies in the q map's input span, so its squared overlaps sum to 1
    and the score is conserved on each side; a ``qk`` block spreads the score of each of its directions."""
    out: dict[Address, float] = {}
    bases: dict[int, SVD] = {}
    comps = {c.name: c for c in universe.components}
    group = view.n_heads // view.n_kv_heads
    for a, value in scores.items():
        if a.kind != "qk":
            out[a] = out.get(a, 0.0) + value
            continue
        if a.layer not in bases:
            fm = view.qk_unrotated(a.layer)
            bases[a.layer] = svd_factored(fm.A.double(), fm.B.double())
        svd = bases[a.layer]
        for k in a.directions:
            for kind, vec, g in (("q", svd.U[a.group, :, k], a.group), ("k", svd.V[a.group, :, k], a.group // group)):
                comp = comps.get(f"L{a.layer}.{kind}")
                if comp is None:
                    continue
                share = (comp.U[g].double().T @ vec.to(comp.U.device)).square()  # [K]
                for j in torch.nonzero(share > 1e-12).flatten().tolist():
                    key = Address(a.layer, kind, g, j)
                    out[key] = out.get(key, 0.0) + value * float(share[j])
    return out


MLP_INPUT_TIE = 1e-9  # relative score step between consecutive singular indices of an MLP's input directions


def mlp_input_scores(universe: Universe, scores: Mapping[Address, float]) -> dict[Address, float]:
    """``scores`` plus, for every layer with scored ``mlp_out`` directions, each ``mlp_in`` / ``mlp_gate`` direction
    of that layer in the universe at the layer's largest ``mlp_out`` score, lowered by ``MLP_INPUT_TIE`` relative
    per singular index from d0 on: they follow that output direction, in singular order (d0 of both maps, d1, ...)."""
    top: dict[int, float] = {}
    for a, value in scores.items():
        if a.kind == "mlp_out":
            top[a.layer] = max(top.get(a.layer, 0.0), float(value))
    out = dict(scores)
    for layer, value in top.items():
        for kind in ("mlp_in", "mlp_gate"):
            name = f"L{layer}.{kind}"
            if name not in universe.names:
                continue
            K = universe.shapes[universe.names.index(name)][1]
            for k in range(K):
                key = Address(layer, kind, 0, k)
                out[key] = max(out.get(key, 0.0), value * (1 - MLP_INPUT_TIE * (k + 1)))
    return out


def graph_ranking(
    universe: Universe,
    graph: nx.DiGraph | list[dict],
    view: ModelView | None = None,
    tail_seed: int = TAIL_SEED,
    mlp_inputs: bool = False,
) -> tuple[Tensor, dict]:
    """``(ranking, info)`` of a circuit graph (a networkx graph, or a list of edge rows): node scores
    (``graph_node_scores`` / ``edge_node_scores``), ``qk`` nodes spread over the q and k maps (``qk_to_map_scores``;
    needs ``view``), with ``mlp_inputs`` the MLP input directions of its MLP layers (``mlp_input_scores``), then
    ``address_scores`` and ``score_ranking``."""
    scores = edge_node_scores(graph) if isinstance(graph, list) else graph_node_scores(graph)
    n_qk = sum(a.kind == "qk" for a in scores)
    if n_qk:
        if view is None:
            raise ValueError("graph_ranking: the graph has qk nodes; give the model's view to map them onto q and k")
        scores = qk_to_map_scores(view, universe, scores)
    n_nodes = len(scores)
    if mlp_inputs:
        scores = mlp_input_scores(universe, scores)
    flat, info = address_scores(universe, scores)
    return score_ranking(flat, tail_seed), {**info, "graph_nodes": n_nodes, "qk_nodes": n_qk}


def run_graph_ranking(
    universe: Universe,
    folder: str | os.PathLike,
    view: ModelView | None = None,
    tail_seed: int = TAIL_SEED,
    mlp_inputs: bool = False,
) -> tuple[Tensor, dict]:
    """``graph_ranking`` of a finished circuit run (its results.json ``edges``, read with ``runs.load_run``)."""
    from lit_svd.runs import load_run

    content = load_run(folder, need=("results",), what="circuit-graph run").content
    if "edges" not in content:
        raise ValueError(f"{folder}: results.json has no edges; give the folder of a finished circuit-graph run")
    ranking, info = graph_ranking(universe, list(content["edges"]), view, tail_seed, mlp_inputs)
    return ranking, {**info, "graph_run": str(folder)}


def mask_ranking(universe: Universe, masks: Mapping, tail_seed: int = TAIL_SEED) -> tuple[Tensor, dict]:
    """``(ranking, info)`` of a mask run's ``masks.pt`` state (``{"lambdas": {component: [G, K]}, ...}``), descending
    by ``mask_order_scores``. Components the run masked that the universe lacks fail in one line (a joint ``qk`` mask
    of a non-rotary model has no q / k directions to rank)."""
    lambdas = dict(masks["lambdas"])
    extra = [n for n in lambdas if n not in universe.names]
    if extra:
        raise ValueError(
            f"mask run: component {extra[0]} is not in the faithfulness universe (q, k, ov, mlp maps); a joint qk"
            " mask cannot rank q and k directions"
        )
    lambdas, null = without_null_lambdas(universe, lambdas)
    flat = universe.flatten(lambdas)
    scores, ranked_by = mask_order_scores(universe, masks)
    info = {
        "directions_scored": int((~flat.isnan()).sum()),
        "kept": int((flat >= float(masks.get("threshold", 0.0))).sum()),
        "null_left_out": null,
        "ranked_by": ranked_by,
    }
    return score_ranking(scores, tail_seed), info


def mask_order_scores(universe: Universe, masks: Mapping) -> tuple[Tensor, str]:
    """``([N] scores, what ranks them)`` of a mask run (NaN: directions it did not mask). By ``lambda``; by the mask
    logit ``theta`` where the run saved it (``logits``: no ties where lambda underflows to 0, below theta ~ -100 in
    float32); with ``last_kept`` (the last optimiser step each direction was in the hard mask), by that step first
    and by the logit within a step: a direction that left the circuit later ranks higher, and the circuit of any size
    is (nearly) the hard mask of the step when the run kept that many."""

    def flat(key: str) -> Tensor:
        return universe.flatten(without_null_lambdas(universe, dict(masks[key]))[0])

    if "logits" not in masks:
        return flat("lambdas"), "lambda"
    scores = flat("logits")
    if "last_kept" not in masks:
        return scores, "logit"
    scored = ~scores.isnan()
    within = torch.zeros_like(scores)
    within[scored] = average_ranks(scores[scored]) / max(int(scored.sum()), 1)  # in [0, 1): the logit's rank
    return flat("last_kept") + within, "last_kept, logit"


def without_null_lambdas(universe: Universe, lambdas: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], int]:
    """``(lambdas, n)``: a mask run's lambdas cut to the universe's directions. A run whose components kept their null
    directions (the default of ``build_components``) has more directions per group than the universe in those maps;
    they are the trailing singular indices (``SVD.without_null``), so the first ``K`` of each group are the universe's.
    ``n``: how many were left out."""
    out, n = {}, 0
    for name, lam in lambdas.items():
        G, K = universe.shapes[universe.names.index(name)]
        if lam.ndim == 2 and lam.shape[0] == G and lam.shape[1] > K:
            n += G * (lam.shape[1] - K)
            lam = lam[:, :K]
        out[name] = lam
    return out, n


def unit_directions(universe: Universe, parts: Iterable[tuple[str, int]]) -> list[int]:
    """Flat indices of the given ``(component name, group)`` parts of one unit, interleaved by singular index
    (d0 of every part in the parts' order, then d1, ...)."""
    rows = []
    for part, (name, group) in enumerate(parts):
        K = universe.shapes[universe.names.index(name)][1]
        base = universe.slice(name).start + group * K
        rows += [(k, part, base + k) for k in range(K)]
    return [flat for _, _, flat in sorted(rows)]


def eap_ranking(universe: Universe, attr: Attributions, n_kv_heads: int, signed: bool = False) -> tuple[Tensor, dict]:
    """``(ranking, info)``: heads and MLP layers by ``|attribution|`` (``signed``: by attribution) descending (ties:
    heads before MLPs, then layer, then head), expanded into their directions (module docstring). Directions of
    layers the universe lacks are not ranked; every universe direction must belong to some unit."""
    L, H = attr.heads.shape
    group = H // n_kv_heads
    key = (lambda v: float(v)) if signed else (lambda v: abs(float(v)))  # noqa: E731
    units = [(key(attr.heads[l, h]), 0, l, h) for l in range(L) for h in range(H)]
    units += [(key(attr.mlps[l]), 1, l, 0) for l in range(L)]
    units.sort(key=lambda u: (-u[0], u[1], u[2], u[3]))
    names = set(universe.names)
    order: list[int] = []
    kv_done: set[tuple[int, int]] = set()
    for _, is_mlp, l, h in units:
        if is_mlp:
            parts = [(f"L{l}.{k}", 0) for k in ("mlp_in", "mlp_gate", "mlp_out")]
        else:
            parts = [(f"L{l}.q", h), (f"L{l}.ov", h)]
            if (l, h // group) not in kv_done:
                kv_done.add((l, h // group))
                parts.insert(1, (f"L{l}.k", h // group))
        parts = [p for p in parts if p[0] in names]
        order += unit_directions(universe, parts)
    ranking = torch.tensor(order, dtype=torch.long)
    if len(ranking) != len(universe):
        raise ValueError(
            f"eap ranking covers {len(ranking)} of the universe's {len(universe)} directions; the universe must"
            " be made of q, k, ov and mlp maps"
        )
    top = [(u[2], u[3], "mlp" if u[1] else "head") for u in units[:5]]
    return ranking, {"top_units": [f"L{l}.{kind}" + ("" if kind == "mlp" else f".h{h}") for l, h, kind in top]}


UNIT_TYPES = ("head", "kv", "mlp")
UNIT_OF_KIND = {"q": "head", "ov": "head", "k": "kv", "mlp_in": "mlp", "mlp_gate": "mlp", "mlp_out": "mlp"}
PART_OF_KIND = {"q": 0, "k": 1, "ov": 2, "mlp_in": 0, "mlp_gate": 1, "mlp_out": 2}  # eap_ranking's map order


def direction_units(universe: Universe) -> tuple[Tensor, Tensor, list[str]]:
    """``(unit [N], interleave [N], names)``: each direction's unit (``L{l}.h{h}``: a query head's ``q`` and ``ov``
    directions; ``L{l}.kv{g}``: a KV head's ``k`` directions; ``L{l}.mlp``: an MLP layer's ``mlp_in``, ``mlp_gate``,
    ``mlp_out`` directions) and its place within the unit when the unit's maps are interleaved by singular index
    (d0 of every map in ``PART_OF_KIND``'s order, then d1, ...: ``unit_directions``' order)."""
    unit = torch.empty(len(universe), dtype=torch.long)
    interleave = torch.empty(len(universe), dtype=torch.long)
    names: list[str] = []
    position: dict[str, int] = {}
    for c in universe.components:
        G, K = universe.shapes[universe.names.index(c.name)]
        start = universe.slice(c.name).start
        kind = UNIT_OF_KIND.get(c.kind)
        if kind is None:
            raise ValueError(f"{c.name}: kind {c.kind!r} belongs to no unit; units hold {', '.join(UNIT_OF_KIND)}")
        for g in range(G):
            name = f"L{c.layer}." + {"head": f"h{g}", "kv": f"kv{g}", "mlp": "mlp"}[kind]
            if name not in position:
                position[name] = len(names)
                names.append(name)
            unit[start + g * K : start + (g + 1) * K] = position[name]
            interleave[start + g * K : start + (g + 1) * K] = torch.arange(K) * len(PART_OF_KIND) + PART_OF_KIND[c.kind]
    return unit, interleave, names


def unit_type(name: str) -> str:
    """``head``, ``kv`` or ``mlp``: the type of a unit named as ``direction_units`` names them."""
    tail = name.split(".", 1)[1]
    return "mlp" if tail == "mlp" else "kv" if tail.startswith("kv") else "head"


def writer_unit_scores(
    universe: Universe, heads: Attributions, n_kv_heads: int, types: Iterable[str] = ("mlp",)
) -> dict[str, float]:
    """Unit scores (``unit_rankings``' ``unit_scores``) from head-level attribution ``heads`` (head-level EAP-IG: the
    writer path, ``ov`` and ``mlp_out`` interpolated) for the universe's units of the given ``types``: an MLP layer's
    is ``heads.mlps[l]``, a query head's ``heads.heads[l, h]``, a KV head's the sum over the query heads that read
    its keys."""
    types = set(types)
    if not types <= set(UNIT_TYPES):
        raise ValueError(f"types={sorted(types)}: unit types are {', '.join(UNIT_TYPES)}")
    group = heads.heads.shape[1] // n_kv_heads
    out: dict[str, float] = {}
    for name in direction_units(universe)[2]:
        kind = unit_type(name)
        if kind not in types:
            continue
        layer, tail = int(name.split(".")[0][1:]), name.split(".")[1]
        if kind == "mlp":
            out[name] = float(heads.mlps[layer])
        elif kind == "head":
            out[name] = float(heads.heads[layer, int(tail[1:])])
        else:
            g = int(tail[2:])
            out[name] = float(heads.heads[layer, g * group : (g + 1) * group].sum())
    return out


def unit_rankings(
    universe: Universe,
    scores: Tensor,
    weights: Tensor,
    whole: Iterable[str] = ("mlp",),
    unit_scores: Mapping[str, float] | None = None,
    within: str = "singular",
    tail_seed: int = TAIL_SEED,
) -> dict[str, Tensor]:
    """``{"signed", "absolute"}`` rankings of one merged order over whole units and single directions, per unit of
    fair size: every unit of a type in ``whole`` (``UNIT_TYPES``; ``direction_units``) is one item whose score is
    its directions' summed score (or ``unit_scores[unit name]``) over its summed weight (``weights``: the fair
    weights), every other direction is an item of its own scored ``score / weight``; items by that score descending
    (``signed``) or by its magnitude (``absolute``); ties in a seeded random order. A whole unit's directions come
    together: interleaved by singular index (``within="singular"``, as ``eap_ranking`` expands a unit) or by their
    own score per weight (``within="score"``, signed or absolute as the ranking). NaN scores count as 0 in a sum and
    put a single direction last."""
    whole = set(whole)
    if not whole <= set(UNIT_TYPES):
        raise ValueError(f"whole={sorted(whole)}: unit types are {', '.join(UNIT_TYPES)}")
    if within not in ("singular", "score"):
        raise ValueError(f"within={within!r}: give 'singular' or 'score'")
    scores = torch.as_tensor(scores, dtype=torch.float64).flatten().cpu()
    weights = weights.double().cpu()
    unit, interleave, names = direction_units(universe)
    n, n_units = len(universe), len(names)
    totals = torch.zeros(n_units, dtype=torch.float64).index_add_(0, unit, torch.nan_to_num(scores, nan=0.0))
    for name, value in (unit_scores or {}).items():
        if name not in names:
            raise KeyError(f"unit_scores: {name!r} is not a unit of this universe ({', '.join(names[:4])}, ...)")
        totals[names.index(name)] = float(value)
    sizes = torch.zeros(n_units, dtype=torch.float64).index_add_(0, unit, weights)
    is_whole = torch.tensor([unit_type(name) in whole for name in names])[unit]
    own = scores / weights
    key = torch.where(is_whole, (totals / sizes)[unit], own)
    item = torch.where(is_whole, unit, n_units + torch.arange(n))
    tie = torch.empty(n_units + n, dtype=torch.long)
    tie[random_ranking(n_units + n, tail_seed)] = torch.arange(n_units + n)
    out = {}
    for variant, fn in (("signed", lambda t: t), ("absolute", torch.abs)):
        inner = interleave
        if within == "score":
            inner = torch.empty(n, dtype=torch.long)
            inner[score_ranking(fn(own), tail_seed)] = torch.arange(n)
        order = torch.argsort(inner, stable=True)
        order = order[torch.argsort(tie[item[order]], stable=True)]
        k = fn(key)
        k = torch.where(torch.isnan(k), torch.full_like(k, -math.inf), k)
        out[variant] = order[torch.argsort(-k[order], stable=True)]
    return out
