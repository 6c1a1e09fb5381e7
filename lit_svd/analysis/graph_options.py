"""The circuit graph's options, their defaults and their one check, without torch: the builder
(``analysis.circuit_graph.GraphOptions``), the module's constructor (``CircuitGraphModule``) and the command line's
fast check (``config_check``, before torch is imported) read them from here and run ``check_circuit_options``.

Two shares, two names: ``threshold`` keeps a writer for a reader (its |contribution| against the reader's sum of
|contributions|); ``position_share`` keeps a position at which a kept head direction is expanded (its share of the
kept contributions' |value| at that direction).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from lit_svd.option_checks import REL_GAP, check_rel_gap, is_int

Unit = Literal["direction", "block", "head"]
TRACEABLE = ("qk", "ov")  # reader options (``readers``)
# what each reader kind needs of the model: every supported architecture has attention heads; an MLP reader is not
# offered (an MLP output direction is not a linear function of its input directions: its split would not be exact)
NEEDS: dict[str, str] = {"qk": "attention", "ov": "attention"}
DEFAULT_THRESHOLD = 0.002  # SmolLM2 IOI: the metric spreads over ~35k writers, the largest share is ~0.005
DEFAULT_POSITION_SHARE = 0.002
DEFAULT_DEPTH = 2
DEFAULT_QK_TOP = 2


def _share(key: str, value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{key}={value!r}: must lie in (0, 1) ({what})")


def check_circuit_options(
    threshold: float = DEFAULT_THRESHOLD,
    depth: int = DEFAULT_DEPTH,
    readers: Sequence[str] | str = TRACEABLE,
    unit: str = "direction",
    qk_top: int = DEFAULT_QK_TOP,
    rel_gap: float = REL_GAP,
    position_share: float = DEFAULT_POSITION_SHARE,
    n_check: int | None = None,
    n_random: int | None = None,
    rows_per_forward: int | None = None,
    fold_norms: bool | None = None,
    n_layers: int | None = None,
    parts: set[str] | None = None,
) -> None:
    """Every option of the graph and of ``CircuitGraphModule`` that can be judged before the model loads, one line
    naming the key otherwise: ``threshold`` and ``position_share`` in (0, 1); ``depth`` an integer in 1 ..
    ``n_layers`` (the model's layers, when known); ``readers`` known (and, given the model's ``parts``, present in
    it); a known ``unit``; ``qk_top`` >= 1; ``rel_gap`` in [0, 1); the edge check's (None: not given, not judged)."""
    _share("threshold", threshold, "a writer's share of the sum of absolute contributions per reader")
    _share("position_share", position_share, "a position's share of a kept head direction's absolute contributions")
    top = n_layers if n_layers is not None else depth
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= max(top, 1):
        raise ValueError(f"depth={depth!r}: must be an integer in 1 .. {top} (the model's layers)")
    readers = [readers] if isinstance(readers, str) else list(readers)
    if not readers:
        raise ValueError(f"readers=[]: give at least one of {', '.join(TRACEABLE)}")
    for r in readers:
        if r not in TRACEABLE:
            why = " (an MLP's split into its input directions would not be exact)" if r.startswith("mlp") else ""
            raise ValueError(f"readers: {r!r} is not a reader kind{why}; allowed: {', '.join(TRACEABLE)}")
        if parts is not None and NEEDS[r] not in parts:
            raise ValueError(f"readers: {r!r} needs {NEEDS[r]} heads, which this model lacks")
    if unit not in get_args(Unit):
        raise ValueError(f"unit={unit!r} unknown; allowed: {', '.join(get_args(Unit))}")
    if not is_int(qk_top) or qk_top < 1:
        raise ValueError(f"qk_top={qk_top!r}: must be an integer >= 1")
    check_rel_gap(rel_gap)
    if n_check is not None and (not is_int(n_check) or n_check < 0):
        raise ValueError(f"n_check={n_check!r}: must be an integer >= 0")
    if n_check and unit != "direction":
        raise ValueError(f"n_check={n_check} with unit={unit!r}: edge checks run on direction graphs; set n_check: 0")
    if n_random is not None and (not is_int(n_random) or n_random < 2):
        raise ValueError(f"n_random={n_random!r}: the null needs at least 2 random readers")
    if rows_per_forward is not None and (not is_int(rows_per_forward) or rows_per_forward < 1):
        raise ValueError(f"rows_per_forward={rows_per_forward!r}: must be >= 1")
    if fold_norms is not None and fold_norms is not True:
        raise ValueError(f"fold_norms={fold_norms!r}: the circuit graph's exact split reads the folded view; give true")
