"""The mounts analysis's options and their checks, without torch: ``MountsAnalysisModule``'s constructor and the
command line's fast check (``config_check``, before torch is imported) run the same ``check_mounts_options``.

What needs the model's shapes (a tile width against a site's input size, modes against a tile, the gate of an
ungated MLP) is checked by the constructor once the model is loaded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_svd.choices import SITES, check_choice
from lit_svd.option_checks import check_indices, check_layers_per_pass, is_int

STEER_POSITIONS = ("last", "all")


def _positive(key: str, value: Any) -> None:
    if not is_int(value) or value <= 0:
        raise ValueError(f"{key}={value!r} is not allowed: it must be a positive integer")


def check_mounts_options(
    sites: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    modes_per_tile: int = 2,
    modes_sweep: Sequence[int] = (1, 2, 4, 8, 16),
    k_active: int = 8,
    fit_fraction: float = 0.5,
    steer_mounts: int = 8,
    steer_texts: int = 8,
    steer_tokens: int = 32,
    steer_positions: str = "last",
    null_stride: int = 1,
    layers_per_pass: int | None = None,
    n_layers: int | None = None,
) -> None:
    """Every option of ``MountsAnalysisModule`` that can be judged before the model loads, one line naming the key
    otherwise (``n_layers``: the model's, when known, bounds ``layers``)."""
    for site in sites or ():
        check_choice("sites", site, SITES)
    check_indices("layers", "layer", layers or (), n_layers)
    if not (isinstance(fit_fraction, (int, float)) and 0.0 < fit_fraction < 1.0):
        raise ValueError(f"fit_fraction={fit_fraction!r} is not allowed: it must lie strictly between 0 and 1")
    for key, value in (
        ("modes_per_tile", modes_per_tile),
        *(("modes_sweep", m) for m in modes_sweep),
        ("k_active", k_active),
        ("steer_mounts", steer_mounts),
        ("steer_texts", steer_texts),
        ("steer_tokens", steer_tokens),
        ("null_stride", null_stride),
    ):
        _positive(key, value)
    if steer_positions not in STEER_POSITIONS:
        raise ValueError(
            f"steer_positions={steer_positions!r} is not allowed; choose 'last' (steer the read-out"
            " token, prefix cached) or 'all' (every position, a full forward per mount)"
        )
    check_layers_per_pass(layers_per_pass)
