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
  constant node (embedding, biases) is not in the universe and is skipped.
* ``unit_ranking`` / ``eap_ranking``: head-level attribution patching (``analysis.attribution``): heads and MLP
  layers by ``|attribution|``; a head brings its ``q`` and ``ov`` directions and, the first time one of its
  query heads comes, its KV head's ``k`` directions; an MLP layer brings ``mlp_in``, ``mlp_gate``, ``mlp_out``.
  Within a unit the directions are interleaved by singular index (d0 of every map, then d1, ...), so a size that
  cuts a unit keeps its leading directions of every map.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.analysis.attribution import Attributions
from lit_svd.analysis.faithfulness import Universe

TAIL_SEED = 0  # the seeded random order of ties and unscored directions, fixed before any run


def random_ranking(n: int, seed: int) -> Tensor:
    """A seeded random permutation of ``0 .. n-1``."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))


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


def graph_node_scores(graph) -> dict[Address, float]:
    """Per node of a circuit graph (a networkx DiGraph keyed by ``str(Address)``, edges with ``abs_weight`` or
    ``weight``): the sum of its edges' absolute weights, in and out."""
    out: dict[Address, float] = {}
    for u, v, data in graph.edges(data=True):
        w = data.get("abs_weight")
        w = abs(float(data.get("weight", 0.0))) if w is None else float(w)
        for node in (u, v):
            a = node if isinstance(node, Address) else Address.parse(str(node))
            out[a] = out.get(a, 0.0) + w
    for node in graph.nodes:
        a = node if isinstance(node, Address) else Address.parse(str(node))
        out.setdefault(a, 0.0)
    return out


def graph_ranking(universe: Universe, graph, tail_seed: int = TAIL_SEED) -> tuple[Tensor, dict]:
    """``(ranking, info)`` of a circuit graph (``graph_node_scores``, ``address_scores``)."""
    scores, info = address_scores(universe, graph_node_scores(graph))
    return score_ranking(scores, tail_seed), info


def mask_ranking(universe: Universe, masks: Mapping, tail_seed: int = TAIL_SEED) -> tuple[Tensor, dict]:
    """``(ranking, info)`` of a mask run's ``masks.pt`` state (``{"lambdas": {component: [G, K]}, ...}``): by
    lambda, descending. Components the run masked that the universe lacks fail in one line (a joint ``qk`` mask of
    a non-rotary model has no q / k directions to rank)."""
    lambdas = dict(masks["lambdas"])
    extra = [n for n in lambdas if n not in universe.names]
    if extra:
        raise ValueError(
            f"mask run: component {extra[0]} is not in the faithfulness universe (q, k, ov, mlp maps); a joint qk"
            " mask cannot rank q and k directions"
        )
    scores = universe.flatten(lambdas)
    info = {
        "directions_scored": int((~scores.isnan()).sum()),
        "kept": int((scores >= float(masks.get("threshold", 0.0))).sum()),
    }
    return score_ranking(scores, tail_seed), info


def unit_directions(universe: Universe, parts: Iterable[tuple[str, int]]) -> list[int]:
    """Flat indices of the given ``(component name, group)`` parts of one unit, interleaved by singular index
    (d0 of every part in the parts' order, then d1, ...)."""
    rows = []
    for part, (name, group) in enumerate(parts):
        K = universe.shapes[universe.names.index(name)][1]
        base = universe.slice(name).start + group * K
        rows += [(k, part, base + k) for k in range(K)]
    return [flat for _, _, flat in sorted(rows)]


def eap_ranking(universe: Universe, attr: Attributions, n_kv_heads: int) -> tuple[Tensor, dict]:
    """``(ranking, info)``: heads and MLP layers by ``|attribution|`` descending (ties: heads before MLPs, then
    layer, then head), expanded into their directions (module docstring). Directions of layers the universe lacks
    are not ranked; every universe direction must belong to some unit."""
    L, H = attr.heads.shape
    group = H // n_kv_heads
    units = [(abs(float(attr.heads[l, h])), 0, l, h) for l in range(L) for h in range(H)]
    units += [(abs(float(attr.mlps[l])), 1, l, 0) for l in range(L)]
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
