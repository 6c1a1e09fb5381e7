"""Flattening nested result rows into table rows (one level of dicts joined with ``_``, lists dropped or joined)."""

from __future__ import annotations

from typing import Any

SCALARS = (str, int, float, bool, type(None))


def flat(row: dict, prefix: str = "", lists: bool = False) -> dict[str, Any]:
    """``{"a": 1, "b": {"c": 2}}`` -> ``{"a": 1, "b_c": 2}`` (nested dicts to any depth); lists are left out,
    or joined with ``;`` when ``lists`` (numbers as ``%.6g``)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, f"{name}_", lists))
        elif isinstance(value, (list, tuple)):
            if lists:
                out[name] = ";".join(f"{x:.6g}" if isinstance(x, float) else str(x) for x in value)
        elif isinstance(value, SCALARS):
            out[name] = value
    return out
