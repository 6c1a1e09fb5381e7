"""Cross-method agreement (issue 24 item 5): do the circuit graph's direction nodes coincide with the directions a
mask run keeps, and with the top SAD terms of the graph's heads, more than chance would make them?

Everything is counted in **units**: a direction, or the block of near-equal singular values it lies in when a
partition into blocks is given (``partition``: ``{(layer, kind, group): [(first, size), ...]}``, e.g. from
``linalg.direction_blocks`` of each component). A graph node or a source direction occupies every unit its
directions fall in (a block node ``L3.ov.h2.d0-3`` occupies the blocks of directions 0..3), so a mask run keeping
direction 2 and a graph holding the block 0-3 meet in that block. Only units of the source's **universe** count
(the components the mask run masked; the QK directions of the graph's heads for SAD): graph nodes outside it are
reported apart (``n_graph_outside``).

Chance: if the graph's ``n`` units were ``n`` units drawn at random from the universe's ``N`` (without
replacement) and the source holds ``K``, the overlap is hypergeometric(N, K, n): expected ``n K / N``; the
p-value is P(overlap >= observed) (``scipy.stats.hypergeom.sf(observed - 1, N, K, n)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.analysis.masks import hard_masks

Unit = tuple[int, str, int, int]  # (layer, kind, group, first direction of the unit)
Component = tuple[int, str, int]  # (layer, kind, group)
Partition = Mapping[Component, Sequence[tuple[int, int]]]  # per component its blocks (first, size), in order


def unit_of(component: Component, direction: int, partition: Partition | None) -> Unit:
    """The unit direction ``direction`` of ``component`` lies in: its block's first direction under
    ``partition``, else itself."""
    for first, size in (partition or {}).get(component, ()):
        if first <= direction < first + size:
            return (*component, first)
    return (*component, direction)


def units(addresses: Iterable[Address], partition: Partition | None = None) -> set[Unit]:
    """Every unit the directions of ``addresses`` fall in (constant nodes have none)."""
    out: set[Unit] = set()
    for a in addresses:
        if a.is_direction:
            out.update(unit_of((a.layer, a.kind, a.group), d, partition) for d in a.directions)
    return out


def universe_units(shapes: Mapping[Component, int], partition: Partition | None = None) -> set[Unit]:
    """Every unit of the universe ``{component: number of directions}``."""
    return {unit_of(c, d, partition) for c, n in shapes.items() for d in range(n)}


def overlap_row(
    graph: Iterable[Address],
    source: Iterable[Address],
    universe: Mapping[Component, int],
    partition: Partition | None = None,
) -> dict:
    """Overlap of the graph's units with the source's inside the universe, against chance (module docstring):
    ``units`` (N), ``n_graph`` (n), ``n_source`` (K), ``n_graph_outside``, ``overlap``, ``expected``,
    ``ratio`` (overlap / expected; None when nothing is expected), ``p_value``."""
    from scipy.stats import hypergeom

    space = universe_units(universe, partition)
    g_all = units(graph, partition)
    g, s = g_all & space, units(source, partition) & space
    N, n, K, k = len(space), len(g), len(s), len(g & s)
    expected = n * K / N if N else 0.0
    return {
        "units": N,
        "n_graph": n,
        "n_source": K,
        "n_graph_outside": len(g_all - space),
        "overlap": k,
        "expected": expected,
        "ratio": k / expected if expected > 0 else None,
        "p_value": float(hypergeom.sf(k - 1, N, K, n)) if N else None,
    }


# --- the sources -----------------------------------------------------------------------------------------
def mask_universe(lambdas: Mapping[str, Tensor], kinds: Sequence[str] | None = None) -> dict[Component, int]:
    """``{(layer, kind, group): directions}`` of a mask run's masked components (``masks.pt["lambdas"]``:
    ``{"L3.ov": [groups, directions]}``), only ``kinds`` when given."""
    out = {}
    for name, lam in lambdas.items():
        layer, kind = name.split(".", 1)
        if kinds is None or kind in kinds:
            groups, n = lam.shape
            out.update({(int(layer[1:]), kind, g): int(n) for g in range(groups)})
    return out


def mask_kept(lambdas: Mapping[str, Tensor], threshold: float, kinds: Sequence[str] | None = None) -> list[Address]:
    """The kept directions of a mask run (``lambda >= threshold``: ``analysis.masks.hard_masks``)."""
    out = []
    for name, hard in hard_masks(dict(lambdas), threshold).items():
        layer, kind = name.split(".", 1)
        if kinds is None or kind in kinds:
            for g, k in hard.nonzero().tolist():
                out.append(Address(int(layer[1:]), kind, int(g), int(k)))
    return out


def sad_top_terms(terms: Mapping[tuple[int, int], Sequence[float]], top: int) -> list[Address]:
    """Per head ``(layer, head)``, its ``top`` QK directions by the task's mean |term| (``terms``: the mean
    |c_k| of each direction k over the task's pairs), as ``qk`` addresses."""
    if top < 1:
        raise ValueError(f"top={top}: must be >= 1")
    out = []
    for (layer, head), values in terms.items():
        order = sorted(range(len(values)), key=lambda k: -abs(values[k]))[:top]
        out += [Address(layer, "qk", head, k) for k in order]
    return out


def sad_universe(terms: Mapping[tuple[int, int], Sequence[float]]) -> dict[Component, int]:
    """``{(layer, "qk", head): directions}`` of the heads SAD ranked."""
    return {(layer, "qk", head): len(values) for (layer, head), values in terms.items()}


def graph_heads(nodes: Iterable[Address], kind: str = "qk") -> set[tuple[int, int]]:
    """``(layer, head)`` of every graph node of ``kind``."""
    return {(a.layer, a.group) for a in nodes if a.kind == kind}


def agreement_rows(
    task: str,
    graph: Sequence[Address],
    mask: tuple[Mapping[str, Tensor], float] | None = None,
    sad_terms: Mapping[tuple[int, int], Sequence[float]] | None = None,
    sad_top: int = 4,
    partition: Partition | None = None,
    mask_kinds: Sequence[str] | None = None,
) -> list[dict]:
    """One row per source given: ``mask`` = ``(lambdas, threshold)`` of a finished mask run (``lit_svd.runs``:
    ``run.masks["lambdas"]``, ``run.masks["threshold"]``); ``sad_terms`` = per graph head its QK directions'
    mean |term| on the task (the top ``sad_top`` per head are the source). Each row: task, source, top (SAD), and
    ``overlap_row``'s fields."""
    rows = []
    if mask is not None:
        lambdas, threshold = mask
        kinds = mask_kinds or sorted({name.split(".", 1)[1] for name in lambdas})
        row = overlap_row(graph, mask_kept(lambdas, threshold, kinds), mask_universe(lambdas, kinds), partition)
        rows.append({"task": task, "source": "mask", "kinds": ",".join(kinds), **row})
    if sad_terms:
        heads = graph_heads(graph)
        terms = {h: v for h, v in sad_terms.items() if h in heads}
        if terms:
            row = overlap_row(graph, sad_top_terms(terms, sad_top), sad_universe(terms), partition)
            rows.append({"task": task, "source": "sad", "kinds": "qk", "top": sad_top, **row})
    return rows
