"""The edge-circuit module's options and their one check, without torch: the module's constructor
(``EdgeCircuitModule``) and the command line's fast check (``config_check``, before torch is imported) call
``check_edge_options``; ``curve_names`` names the curves the options ask for. ``BLOCK_ORDERS``: the block rankings
of direction edges (``edge_curves.block_ranking``), methods beside the levels; ``FACTOR_ORDERS``: direction edges by
their score times a factor of their block (``edge_curves.netblock_ranking``); ``DIRECTION_ORDERS``: both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

Method = Literal[
    "directions",
    "writer_units",
    "units",
    "blocks",
    "headblocks",
    "coreblocks",
    "netblocks",
    "pruned",
    "prunedirs",
    "random",
]
BLOCK_ORDERS = ("blocks", "headblocks", "coreblocks")  # direction edges, blocks kept together (edge_curves)
FACTOR_ORDERS = ("netblocks",)  # direction edges by score x block factor (edge_curves.netblock_ranking)
DIRECTION_ORDERS = BLOCK_ORDERS + FACTOR_ORDERS  # the methods that rank direction edges beside the level
Axis = Literal["raw", "fair"]
Unreached = Literal["skip", "best"]  # graph_unreached: what the module draws when graph_curve never reaches graph_f
CutOrder = Literal["blocks", "min"]  # prunedirs' curve order (edge_pruning.order_cut); blocks chosen on validation
# prunedirs' step of the writer and reader logits (edge_pruning.PruneOptions.direction_step)
DirectionStep = Literal["adam", "proportional"]


def curve_names(methods: Sequence[str], axes: Sequence[str], seeds: Sequence[int]) -> list[str]:
    """The curves of the options: each ranked level and block order signed and absolute on each axis (``units`` and
    ``pruned``: raw only, the same circuits on both axes; ``prunedirs``: fair only, its size), and with ``random`` one
    random curve per seed at each ranked level (a block order ranks direction edges: its random curve is
    ``random_directions_<seed>``, as a factor order's and ``prunedirs``'; ``pruned`` ranks head-level edges:
    ``random_units_<seed>``). ``pruned``: edge pruning (``edge_pruning``), ``pruned_signed_raw`` trained on the metric
    (CPR), ``pruned_abs_raw`` on faithfulness (CMD); ``prunedirs``: the same over direction edges."""
    ranked = [m for m in methods if m != "random"]
    names = []
    for level in ranked:
        for sign in ("signed", "abs"):
            for axis in ["raw"] if level in ("units", "pruned") else ["fair"] if level == "prunedirs" else axes:
                names.append(f"{level}_{sign}_{axis}")
    if "random" in methods:
        of = {**dict.fromkeys(DIRECTION_ORDERS + ("prunedirs",), "directions"), "pruned": "units"}
        levels = dict.fromkeys(of.get(m, m) for m in ranked or ["directions"])
        names += [f"random_{level}_{s}" for level in levels for s in seeds]
    return names


def _as_list(value: Sequence[str] | str) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def check_edge_options(
    methods: Sequence[str] | str = ("directions", "units", "random"),
    axes: Sequence[str] | str = ("raw", "fair"),
    random_seeds: Sequence[int] = (0,),
    graph_curve: str | None = "directions_abs_fair",
    steps: int = 5,
    n_attribution: int = 64,
    top_edges: int = 200,
    n_check: int = 8,
    n_random: int = 16,
    fold_norms: bool | None = None,
    curves: Sequence[str] | str | None = None,
    graph_unreached: str = "skip",
    page_blocks: int | None = None,
    prune_steps: int = 40,
    prune_prompts: int = 16,
    prune_keep: float | Sequence[float] = 0.2,
    prune_lr: float = 0.05,
    prune_direction_order: CutOrder = "blocks",
    prune_chunk: int | None = None,
    prune_direction_step: DirectionStep = "adam",
    prune_direction_lr: float | None = None,
) -> None:
    """Known methods and axes, ``curves`` (the curves scored; None: all of ``curve_names``) among the options'
    curves, a graph curve among the scored curves, counts in range, the folded view; one line naming the key
    otherwise."""
    methods, axes = _as_list(methods), _as_list(axes)
    for key, values, allowed in (("methods", methods, get_args(Method)), ("axes", axes, get_args(Axis))):
        if not values:
            raise ValueError(f"{key}=[]: give at least one of {', '.join(allowed)}")
        for v in values:
            if v not in allowed:
                raise ValueError(f"{key}: {v!r} unknown; allowed: {', '.join(allowed)}")
    if "random" in methods and not random_seeds:
        raise ValueError("methods has 'random' but random_seeds is empty; give seeds, e.g. [0]")
    names = curve_names(methods, axes, random_seeds)
    if curves is not None:
        if not _as_list(curves):
            raise ValueError("curves=[]: give at least one curve, or null for all of them")
        for name in _as_list(curves):
            if name not in names:
                raise ValueError(f"curves: {name!r} is not one of the options' curves: {', '.join(names)}")
        names = _as_list(curves)
    if graph_curve is not None and graph_curve not in names:
        raise ValueError(f"graph_curve={graph_curve!r} is not one of the curves: {', '.join(names)} (or null)")
    if graph_unreached not in get_args(Unreached):
        raise ValueError(f"graph_unreached={graph_unreached!r}: allowed: {', '.join(get_args(Unreached))}")
    for key, value, low in (("steps", steps, 1), ("n_attribution", n_attribution, 1), ("top_edges", top_edges, 0),
                            ("n_check", n_check, 0), ("n_random", n_random, 2),
                            ("page_blocks", 1 if page_blocks is None else page_blocks, 1),
                            ("prune_steps", prune_steps, 1), ("prune_prompts", prune_prompts, 1),
                            ("prune_chunk", 1 if prune_chunk is None else prune_chunk, 1)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}={value!r}: must be an integer >= {low}")
    keeps = [prune_keep] if isinstance(prune_keep, float | int) else list(prune_keep)
    if not keeps or not all(0 < k < 1 for k in keeps) or not prune_lr > 0:
        raise ValueError(f"prune_keep={prune_keep!r}, prune_lr={prune_lr!r}: need 0 < prune_keep < 1 and prune_lr > 0")
    if prune_direction_order not in get_args(CutOrder):
        raise ValueError(f"prune_direction_order={prune_direction_order!r}: allowed: {', '.join(get_args(CutOrder))}")
    if prune_direction_lr is not None and not prune_direction_lr > 0:
        raise ValueError(f"prune_direction_lr={prune_direction_lr!r}: need > 0 (or null: prune_lr)")
    if prune_direction_step not in get_args(DirectionStep):
        raise ValueError(
            f"prune_direction_step={prune_direction_step!r}: allowed: {', '.join(get_args(DirectionStep))}"
        )
    if fold_norms is not None and fold_norms is not True:
        raise ValueError(f"fold_norms={fold_norms!r}: the edge universe reads the folded view; give true")
