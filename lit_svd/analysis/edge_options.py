"""The edge-circuit module's options and their one check, without torch: the module's constructor
(``EdgeCircuitModule``) and the command line's fast check (``config_check``, before torch is imported) call
``check_edge_options``; ``curve_names`` names the curves the options ask for. ``BLOCK_ORDERS``: the block rankings
of direction edges (``edge_curves.block_ranking``), methods beside the levels; ``FACTOR_ORDERS``: direction edges by
their score times a factor of their block (``edge_curves.factor_ranking``); ``DIRECTION_ORDERS``: both."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Method = Literal[
    "directions",
    "writer_units",
    "units",
    "blocks",
    "headblocks",
    "coreblocks",
    "netblocks",
    "perweight",
    "pruned",
    "prunedirs",
    "random",
]
BLOCK_ORDERS = ("blocks", "headblocks", "coreblocks")  # direction edges, blocks kept together (edge_curves)
FACTOR_ORDERS = ("netblocks", "perweight")  # direction edges by score x block factor (edge_curves.factor_ranking)
DIRECTION_ORDERS = BLOCK_ORDERS + FACTOR_ORDERS  # the methods that rank direction edges beside the level
Axis = Literal["raw", "fair"]
Unreached = Literal["skip", "best"]  # graph_unreached: what the module draws when graph_curve never reaches graph_f
CutOrder = Literal["blocks", "min"]  # prunedirs' curve order (edge_pruning.order_cut); blocks chosen on validation
# prunedirs' step of the writer and reader logits (PruneOptions.direction_step)
DirectionStep = Literal["adam", "proportional"]
OBJECTIVES = ("faithful", "metric")  # edge pruning's objectives (edge_pruning: CMD, CPR)
LEVELS = ("units", "directions")  # edge pruning's levels: head-level blocks, or blocks and direction logits
CUT_ORDERS = get_args(CutOrder)  # direction-level pruning's curve: blocks first, or one cut of every logit
DIRECTION_STEPS = get_args(DirectionStep)  # how the writer and reader logits step


@dataclass
class PruneOptions:
    """Edge pruning's options (``edge_pruning``; here without torch, so that the command line's fast check builds
    them): ``objective`` (``OBJECTIVES``), ``steps``, Adam's ``lr``, the fraction(s) ``keep`` of the blocks kept (a
    sequence: nested circuits trained together, in any order; at the direction level, of the weighted edge count),
    ``level`` (``LEVELS``), the direction logits' start ``direction_start``, the curve's ``direction_order``
    (``edge_pruning.direction_spec``) and the direction logits' step ``direction_step`` and rate ``direction_lr``
    (None: ``lr``; ``level="directions"``): ``adam``, each logit's own normalised step (a logit of tiny but steady
    gradient moves as fast as one of large); ``proportional``, each step proportional to the logit's gradient (the
    writer and reader logits' gradients divided by their largest magnitude, a moving average of them with
    ``edge_pruning.MOMENTUM`` as Adam's first moment, times the rate: the logit of the largest gradient moves up to
    ``direction_lr`` per step, the others in proportion). The block logits step with Adam at ``lr``. A bad value
    fails in one line that starts with its field's name (the module's option is ``prune_<field>``)."""

    objective: str = "faithful"
    steps: int = 40
    lr: float = 0.05
    keep: float | Sequence[float] = 0.2
    level: str = "units"
    direction_start: float = 0.5
    direction_order: str = "blocks"  # chosen on validation (docs/circuits.md, "Edge pruning over direction edges")
    direction_step: str = "adam"
    direction_lr: float | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("objective", OBJECTIVES), ("level", LEVELS), ("direction_order", CUT_ORDERS),
                              ("direction_step", DIRECTION_STEPS)):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}: allowed: {', '.join(allowed)}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps={self.steps!r}: must be an integer >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r}: need > 0")
        if not self.keeps or not all(0 < k < 1 for k in self.keeps):
            raise ValueError(f"keep={self.keep!r}: need each 0 < keep < 1")
        if self.direction_lr is not None and not self.direction_lr > 0:
            raise ValueError(f"direction_lr={self.direction_lr!r}: need > 0 (or None: lr)")

    @property
    def keeps(self) -> tuple[float, ...]:
        return tuple(sorted([self.keep] if isinstance(self.keep, float | int) else self.keep))


def step_line(name: str, step: int, objective: float) -> str:
    """Edge pruning's step ``step`` of the curve ``name``, as a line (a progress message or a progress bar's
    postfix)."""
    return f"{name} step {step}: objective {objective:.4f}"


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
                            ("prune_prompts", prune_prompts, 1),
                            ("prune_chunk", 1 if prune_chunk is None else prune_chunk, 1)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{key}={value!r}: must be an integer >= {low}")
    try:  # edge pruning's options are judged by their own class; the module names them prune_<field>
        PruneOptions(steps=prune_steps, lr=prune_lr, keep=prune_keep, direction_order=prune_direction_order,
                     direction_step=prune_direction_step, direction_lr=prune_direction_lr)  # fmt: skip
    except ValueError as err:
        raise ValueError(f"prune_{err}") from None
    if fold_norms is not None and fold_norms is not True:
        raise ValueError(f"fold_norms={fold_norms!r}: the edge universe reads the folded view; give true")
