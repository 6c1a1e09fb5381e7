"""Value checks shared by the option checks of the modules and data modules, without torch.

Each module's ``check_<method>_options`` (``analysis/*_options.py``, ``data_options.py``) is a torch-free function
that its constructor calls and the command line's fast check (``config_check``) runs before torch is imported;
the checks several of them make live here. Each fails with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

# the relative gap below which neighbouring singular values share a block (why 0.05: ``linalg``'s identifiability
# notes); here, below torch, so that the option checks default to the value the modules use
REL_GAP = 0.05


def is_int(value: Any) -> bool:
    """An integer that is not a bool (YAML's ``true`` is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(key: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{key}={value!r}: must be a positive integer")
    return value


def check_layers_per_pass(per_pass: Any) -> None:
    """``layers_per_pass``: a positive integer, or None (every layer in one pass)."""
    if per_pass is not None and (not is_int(per_pass) or per_pass <= 0):
        raise ValueError(f"layers_per_pass={per_pass!r} is not allowed: give a positive integer or null (all at once)")


def check_indices(key: str, what: str, values: Iterable[Any], n: int | None) -> None:
    """Every integer of ``values`` in ``0 .. n - 1`` (``n``: the model's count of ``what``, None: not known yet);
    ``key`` names the option (``model.layers``)."""
    for value in values:
        if not is_int(value):
            raise ValueError(f"{key}: {what} {value!r} is not an integer")
        if n is not None and not 0 <= value < n:
            raise ValueError(f"{key}: {what} {value} is out of range; the model has {n} {what}s (0..{n - 1})")


def check_rel_gap(rel_gap: Any, key: str = "rel_gap") -> float:
    """``rel_gap``: a number in [0, 1) (the relative gap below which neighbouring singular values share a block)."""
    number = isinstance(rel_gap, (int, float)) and not isinstance(rel_gap, bool) and math.isfinite(rel_gap)
    if not number or not 0 <= rel_gap < 1:
        raise ValueError(f"{key}={rel_gap!r} is invalid; the relative gap between blocks must be in [0, 1)")
    return float(rel_gap)
