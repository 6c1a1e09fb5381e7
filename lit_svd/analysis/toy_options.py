"""The toy model's options and their checks, without torch: ``ToyAlignmentModule``'s constructor and the command
line's fast check (``config_check``, before torch is imported) run the same ``check_toy_options``, which also
resolves the per-instance values (a grid expanded, scalars repeated) the constructor builds the ensemble from."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from lit_svd.option_checks import positive_int

GRID_KEYS = ("d_model", "d_head", "interference", "lambda_attn")


def per_instance(name: str, value: Any, n: int) -> list:
    """A scalar repeated n times, or a list that must have n entries."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} values but n_instances={n}; give one or one per instance")
        return list(value)
    return [value] * n


def expand_grid(grid: dict[str, list], n_seeds: int, seed: int) -> dict[str, list]:
    """Per-instance lists for every combination of the ``grid`` values (first key slowest), each repeated
    for ``n_seeds`` seeds ``seed .. seed + n_seeds - 1`` (the same seeds in every cell)."""
    bad = set(grid) - set(GRID_KEYS)
    if bad:
        raise ValueError(f"grid keys {sorted(bad)}: allowed are {', '.join(GRID_KEYS)}")
    positive_int("grid_seeds", n_seeds)
    keys = list(grid)
    for k in keys:
        if not isinstance(grid[k], (list, tuple)) or not grid[k]:
            raise ValueError(f"grid.{k}={grid[k]!r}: must be a non-empty list")
    cells = list(itertools.product(*(grid[k] for k in keys)))
    out = {k: [c[i] for c in cells for _ in range(n_seeds)] for i, k in enumerate(keys)}
    out["seeds"] = [seed + j for _ in cells for j in range(n_seeds)]
    return out


def infer_n_instances(n_instances: int | None, **lists: Any) -> int:
    """``n_instances`` if given, else the length of the per-instance lists (which must agree), else 1."""
    lengths = {k: len(v) for k, v in lists.items() if isinstance(v, (list, tuple))}
    if n_instances is None:
        if len(set(lengths.values())) > 1:
            raise ValueError(f"per-instance lists disagree in length: {lengths}; set n_instances")
        n_instances = next(iter(lengths.values()), 1)
    positive_int("n_instances", n_instances)
    return n_instances


@dataclass(frozen=True)
class ToyInstances:
    """The ensemble's per-instance values, one entry per instance."""

    d_models: list[int]
    d_heads: list[int]
    lambdas: list[float]
    seeds: list[int]
    interference: list[float | None]  # the frozen features' target ||E_X||_2 (None: as drawn)


def check_toy_options(
    *,
    n_features: int,
    d_model: int | list[int],
    d_head: int | list[int] | None,
    lambda_attn: float | list[float],
    temperature: float,
    n_instances: int | None,
    seed: int,
    seeds: list[int] | None,
    importance_decay: float,
    frozen_features: bool,
    interference: float | list[float | None] | None,
    init_scale: float,
    lr: float,
    weight_decay: float,
    grid: dict[str, list] | None,
    grid_seeds: int,
) -> ToyInstances:
    """Every option of ``ToyAlignmentModule`` but the template (checked against ``n_features`` as it is built),
    one line naming the key otherwise; returns the per-instance values. The defaults are the module's alone (the
    fast check passes them, read from its signature)."""
    positive_int("n_features", n_features)
    if grid is not None:
        given = {"d_model": d_model, "d_head": d_head, "interference": interference, "lambda_attn": lambda_attn}
        expanded = expand_grid(grid, grid_seeds, seed)
        for k in expanded:
            if isinstance((given | {"seeds": seeds})[k], (list, tuple)):
                raise ValueError(f"{k} is given as a list and by grid; give it in one place")
        d_model = expanded.get("d_model", d_model)
        d_head = expanded.get("d_head", d_head)
        interference = expanded.get("interference", interference)
        lambda_attn = expanded.get("lambda_attn", lambda_attn)
        seeds, n_instances = expanded["seeds"], len(expanded["seeds"])
    n = infer_n_instances(
        n_instances, d_model=d_model, d_head=d_head, lambda_attn=lambda_attn, seeds=seeds, interference=interference
    )
    dims = per_instance("d_model", d_model, n)
    heads = list(dims) if d_head is None else per_instance("d_head", d_head, n)
    for name, values in (("d_model", dims), ("d_head", heads)):
        for v in values:
            positive_int(name, v)
    lambdas = [float(v) for v in per_instance("lambda_attn", lambda_attn, n)]
    if any(v < 0 for v in lambdas):
        raise ValueError(f"lambda_attn={lambda_attn!r}: must be >= 0")
    for name, v in (("temperature", temperature), ("lr", lr), ("init_scale", init_scale)):
        if not v > 0:
            raise ValueError(f"{name}={v!r}: must be > 0")
    if weight_decay < 0:
        raise ValueError(f"weight_decay={weight_decay!r}: must be >= 0")
    if not 0 < importance_decay <= 1:
        raise ValueError(f"importance_decay={importance_decay!r}: must lie in (0, 1]")
    if frozen_features and interference is None:
        raise ValueError(
            "interference=None: frozen_features=True needs interference (a value >= 0 or one per instance)"
        )
    if not frozen_features and interference is not None:
        raise ValueError(f"interference={interference!r}: only allowed with frozen_features=True")
    seed_list = list(seeds) if seeds is not None else [seed + i for i in range(n)]
    return ToyInstances(dims, heads, lambdas, seed_list, per_instance("interference", interference, n))
