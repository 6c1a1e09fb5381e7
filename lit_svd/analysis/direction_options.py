"""The direction check's options and their checks, without torch: ``DirectionCheckModule``'s constructor and the
command line's fast check (``config_check``, before torch is imported) run the same
``check_direction_check_options``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from lit_svd.choices import check_choice, choices
from lit_svd.option_checks import REL_GAP, check_rel_gap, is_int

Patchable = Literal["ov", "mlp_in", "mlp_gate", "mlp_out"]  # the component kinds whose directions can be patched
PATCHABLE: tuple[Patchable, ...] = choices(Patchable)


def check_direction_check_options(
    run: str | None = None,
    kinds: Sequence[str] = ("ov",),
    n_random: int | None = None,
    rows_per_forward: int = 512,
    top_k: int = 8,
    rel_gap: float = REL_GAP,
) -> None:
    """Every option of ``DirectionCheckModule`` that can be judged before anything loads (None: not given, not
    judged), one line naming the key otherwise: known kinds, ``n_random`` >= 2, ``rows_per_forward`` and ``top_k``
    >= 1, ``rel_gap`` in [0, 1), and the run folder exists."""
    for kind in kinds:
        check_choice("kinds", kind, PATCHABLE, where=" among the kinds that can be patched")
    if n_random is not None and (not is_int(n_random) or n_random < 2):
        raise ValueError(f"n_random={n_random!r}: the null needs at least 2 random directions")
    for key, value in (("rows_per_forward", rows_per_forward), ("top_k", top_k)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{key}={value!r}: must be >= 1")
    check_rel_gap(rel_gap)
    if run is not None and not Path(run).is_dir():
        raise ValueError(f"run={str(run)!r}: not a folder; give the folder of a finished direction-mask run")
