"""The direction-mask module's options and their one check, without torch: ``DirectionMaskModule``'s constructor and
the command line's fast check (``config_check``, before torch is imported) run the same ``check_mask_options``.

What needs the model (the component kinds a model has, a layer against a model built in Python) is checked by the
constructor once the model is loaded."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from lit_svd.choices import check_choice
from lit_svd.option_checks import REL_GAP, check_indices, check_rel_gap, is_int

Ablation = Literal["zero", "patch"]
Positions = Literal["answer", "all"]
MaskLoss = Literal["kl", "metric"]
MaskUnit = Literal["direction", "block"]


def check_mask_unit(mask_unit: str) -> MaskUnit:
    return check_choice("mask_unit", mask_unit, MaskUnit)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_mask_options(
    layers: Sequence[int] | None = None,
    alpha: float = 2e-4,
    lr: float = 2e-2,
    lr_min: float | None = None,
    init: float = 0.99,
    ablation: str = "zero",
    positions: str = "answer",
    threshold: float = 1e-3,
    steps_per_batch: int = 1,
    soft_steps: int = 0,
    mask_unit: str = "direction",
    rel_gap: float = REL_GAP,
    alpha_final: float | None = None,
    loss: str = "kl",
    n_layers: int | None = None,
) -> None:
    """Every option of ``DirectionMaskModule`` that can be judged before the model loads, one line naming the key
    otherwise (``n_layers``: the model's, when known, bounds ``layers``)."""
    if not (_finite(alpha) and alpha >= 0):
        raise ValueError(f"alpha={alpha!r} is invalid; the L1 weight must be a finite number >= 0")
    if alpha_final is not None and not (_finite(alpha_final) and alpha_final > 0 and alpha > 0):
        raise ValueError(
            f"alpha_final={alpha_final!r} is invalid with alpha={alpha!r}; a geometric schedule needs both finite and"
            " > 0 (or alpha_final null: alpha throughout)"
        )
    check_choice("loss", loss, MaskLoss)
    if not 0 < init < 1:
        raise ValueError(f"init={init!r} is invalid; the initial mask value lambda = sigmoid(theta) must be in (0, 1)")
    if not 0 < threshold < 1:
        raise ValueError(f"threshold={threshold!r} is invalid; the kept threshold must be in (0, 1)")
    check_choice("ablation", ablation, Ablation)
    check_choice("positions", positions, Positions)
    check_mask_unit(mask_unit)
    check_rel_gap(rel_gap)
    check_indices("layers", "layer", layers or (), n_layers)
    if not is_int(steps_per_batch) or steps_per_batch < 1:
        raise ValueError(f"steps_per_batch={steps_per_batch} is invalid; give an integer >= 1")
    if lr_min is not None and not 0 <= lr_min <= lr:
        raise ValueError(f"lr_min={lr_min} is invalid; give a number in [0, lr={lr}] or null")
    if not is_int(soft_steps) or soft_steps < 0:
        raise ValueError(f"soft_steps={soft_steps} is invalid; give an integer >= 0")
