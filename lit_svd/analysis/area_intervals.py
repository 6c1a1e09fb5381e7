"""Bootstrap intervals of CPR and CMD over the test prompts (docs/circuits.md, "How sure: intervals over prompts").

A curve's ``f`` at each size is a ratio of means over the prompts (``faithfulness.faithfulness_of``), so its CPR and
CMD move with the prompt sample. Drawing the prompts again with replacement and recomputing ``m(full)``,
``m(empty)``, ``f`` and the areas from the per-prompt metrics gives an interval for each curve. Every curve of one
run is scored on the same prompts, so one statistic computes every curve's areas and every difference on the same
draws: the difference of two curves is resampled *paired*, and one whose interval holds 0 is not resolved by these
prompts.

The intervals are ``scipy.stats.bootstrap``'s bias-corrected and accelerated (BCa) ones by default. CMD is the area
of ``|1 - f|``, which prompt noise only raises: near ``f = 1`` the resamples' CMD lies mostly above the sample's,
and a percentile interval inherits that lean (on a synthetic population whose ``f`` is within 0.03 of 1 at the
large sizes it covers the population's CMD in 0 of 40 samples, BCa in 19: ``tests/test_area_intervals.py``). BCa
moves the interval by the resamples' median bias and their skew (a jackknife over the prompts). Where BCa is
undefined (the sample's value below or above every resample) that output falls back to the percentile interval and
is named in ``percentile_fallback``; an output that no draw moves (a curve against itself) gets ``[value, value]``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor

RESAMPLES = 2000
LEVEL = 0.95
Method = Literal["BCa", "percentile"]


def prompt_weights(idx: Tensor, n_prompts: int) -> Tensor:
    """``[R, n_prompts]``: each prompt's share of the samples ``idx [R, n]`` (prompt indices, repeats allowed), so the
    mean over a sample is a product with these weights."""
    counts = torch.zeros(idx.shape[0], n_prompts, dtype=torch.float64)
    counts.scatter_add_(1, idx, torch.ones(idx.shape, dtype=torch.float64))
    return counts / idx.shape[1]


def f_samples(metric: Tensor, full: Tensor, empty: Tensor, weights: Tensor) -> Tensor:
    """``[S, R]``: ``f`` at each size of the curve whose per-prompt metric is ``metric`` ``[S, P]`` (one row per
    size) with the ends ``full`` / ``empty`` ``[P]``, for each sample of ``weights`` ``[R, P]``: a ratio of the
    weighted means."""
    m, m_full, m_empty = metric.double() @ weights.T, weights @ full.double(), weights @ empty.double()
    return (m - m_empty) / (m_full - m_empty)


def area_samples(sizes: Sequence[float], f: Tensor) -> tuple[Tensor, Tensor]:
    """``(cpr, cmd)``, each ``[R]``: the trapezoid areas of ``f`` and of ``|1 - f|`` over the points ``sizes`` only (no
    point (0, 0) added, as MIB's own code) of each column of ``f`` ``[S, R]``."""
    x = torch.tensor(sizes, dtype=f.dtype, device=f.device)
    return torch.trapezoid(f, x, dim=0), torch.trapezoid((1 - f).abs(), x, dim=0)


def area_statistic(
    sizes: Sequence[float],
    metrics: Mapping[str, Tensor],
    full: Tensor,
    empty: Tensor,
    pairs: Sequence[tuple[str, str]] = (),
) -> tuple[list[str], Callable[[np.ndarray], np.ndarray]]:
    """``(names, statistic)``: ``statistic(idx [..., n])`` (samples of prompt indices) gives ``[len(names), ...]``,
    per curve its CPR, CMD and ``f`` at each size, per pair ``(a, b)`` the CPR and CMD of ``a`` less ``b``'s, all on
    the same samples (``scipy.stats.bootstrap``'s vectorized form; ``names``: ``"a/cpr"``, ``"a/f3"``, ``"a -
    b/cmd"``)."""
    n = len(full)
    names = [f"{c}/{x}" for c in metrics for x in ("cpr", "cmd", *(f"f{i}" for i in range(len(sizes))))]
    names += [f"{a} - {b}/{x}" for a, b in pairs for x in ("cpr", "cmd")]

    def statistic(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        idx_t = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        batch = idx_t.shape[:-1]
        weights = prompt_weights(idx_t.reshape(-1, idx_t.shape[-1]), n)
        rows, areas = [], {}
        for name, m in metrics.items():
            f = f_samples(m, full, empty, weights)
            areas[name] = area_samples(sizes, f)
            rows += [*areas[name], *f]
        for a, b in pairs:
            rows += [areas[a][0] - areas[b][0], areas[a][1] - areas[b][1]]
        return torch.stack(rows).reshape(len(rows), *batch).numpy()

    return names, statistic


def area_intervals(
    sizes: Sequence[float],
    metrics: Mapping[str, Tensor],
    full: Tensor,
    empty: Tensor,
    pairs: Sequence[tuple[str, str]] = (),
    n_resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
    method: Method = "BCa",
) -> dict:
    """Bootstrap intervals over resampled prompts (module docstring). ``metrics``: per curve its per-prompt metric
    ``[S, P]``; ``full`` / ``empty``: the ends' ``[P]`` (all on the same prompts, in the same order). Returns
    ``{"curves": {name: {"cpr": [lo, hi], "cmd": [lo, hi], "f": [[lo per size], [hi per size]]}}, "pairs": {"a -
    b": {"cpr": [lo, hi], "cmd": [lo, hi]}}, "points", "level", "resamples", "prompts", "method",
    "percentile_fallback"}`` (a pair's interval is of ``a``'s area minus ``b``'s, on the same draws; ``points``: the
    statistic on the prompts as given, keyed by ``area_statistic``'s names, ``"a/cmd"``, ``"a/f3"``, ``"a - b/cpr"``).
    """
    from scipy.stats import bootstrap

    n = len(full)
    if n < 2:
        raise ValueError(f"intervals over prompts need at least 2 prompts, got {n}")
    for name, m in metrics.items():
        if m.shape != (len(sizes), n):
            raise ValueError(f"curve {name!r}: per-prompt metric of shape {tuple(m.shape)}, want {(len(sizes), n)}")
    missing = sorted({x for pair in pairs for x in pair if x not in metrics})
    if missing:
        raise ValueError(f"pairs {list(pairs)}: no per-prompt metric for {missing}")
    names, statistic = area_statistic(sizes, metrics, full, empty, pairs)
    with warnings.catch_warnings():  # BCa's undefined outputs are handled below, output by output
        warnings.simplefilter("ignore")
        res = bootstrap(
            (np.arange(n),),
            statistic,
            vectorized=True,
            n_resamples=n_resamples,
            confidence_level=level,
            method=method,
            rng=np.random.default_rng(seed),
        )
    lo, hi = (np.atleast_1d(x).copy() for x in (res.confidence_interval.low, res.confidence_interval.high))
    draws = res.bootstrap_distribution.reshape(len(names), -1)
    point = statistic(np.arange(n)[None])[:, 0]
    fallback = []
    for i in np.flatnonzero(~(np.isfinite(lo) & np.isfinite(hi))):
        if np.ptp(draws[i]) == 0:  # no draw moves it
            lo[i] = hi[i] = point[i]
        else:
            fallback.append(names[i])
            lo[i], hi[i] = np.quantile(draws[i], [(1 - level) / 2, (1 + level) / 2])
    ci = {name: [float(a), float(b)] for name, a, b in zip(names, lo, hi)}
    out: dict = {"level": level, "resamples": n_resamples, "prompts": n, "method": method, "curves": {}, "pairs": {}}
    out["points"] = dict(zip(names, point.tolist()))
    out["percentile_fallback"] = fallback
    for c in metrics:
        f = [ci[f"{c}/f{i}"] for i in range(len(sizes))]
        out["curves"][c] = {"cpr": ci[f"{c}/cpr"], "cmd": ci[f"{c}/cmd"], "f": [[x[0] for x in f], [x[1] for x in f]]}
    for a, b in pairs:
        out["pairs"][f"{a} - {b}"] = {x: ci[f"{a} - {b}/{x}"] for x in ("cpr", "cmd")}
    return out


def curve_intervals(
    sizes: Sequence[float], metrics: Mapping[str, Tensor], full: Tensor, empty: Tensor
) -> tuple[dict[str, dict], dict | None]:
    """``(rows, about)``: per curve of ``metrics`` (``area_intervals``' arguments) the fields a curve row carries,
    ``cpr_ci``, ``cmd_ci`` (``[lo, hi]``) and ``values_ci`` (``[[lo per size], [hi per size]]``), and what the
    intervals are (``method``, ``level``, ``resamples``, ``percentile_fallback``); ``({name: {}}, None)`` for fewer
    than 2 prompts (no interval)."""
    if len(full) < 2:
        return {name: {} for name in metrics}, None
    ci = area_intervals(sizes, metrics, full, empty)
    rows = {name: {"cpr_ci": c["cpr"], "cmd_ci": c["cmd"], "values_ci": c["f"]} for name, c in ci["curves"].items()}
    return rows, {k: ci[k] for k in ("method", "level", "resamples", "percentile_fallback")}


def paired_differences(curves: Mapping[str, Mapping], info: Mapping | None) -> Callable[[str, str, str], dict]:
    """``diff(a, b, area) -> {area + "_diff_ci": [lo, hi]}``: the bootstrap interval of curve ``a``'s area
    (``"cpr"`` or ``"cmd"``) minus ``b``'s, paired over the prompts (``area_intervals`` on the two curves' rows:
    ``sizes``, ``prompt_metric [n][prompts]``; the ends from ``info``'s ``prompt_full`` / ``prompt_empty``, the
    same prompts in the same order); ``{}`` without per-prompt metrics or with one prompt. Each pair is drawn once
    whatever areas are asked of it."""
    if info is None or len(info.get("prompt_full") or ()) < 2:
        return lambda a, b, area: {}
    full, empty = (torch.tensor(info[k], dtype=torch.float64) for k in ("prompt_full", "prompt_empty"))

    @functools.cache
    def pair(a: str, b: str) -> dict:
        metrics = {n: torch.tensor(curves[n]["prompt_metric"], dtype=torch.float64) for n in (a, b)}
        return area_intervals(curves[a]["sizes"], metrics, full, empty, [(a, b)])["pairs"][f"{a} - {b}"]

    def diff(a: str, b: str, area: str) -> dict:
        return {f"{area}_diff_ci": pair(a, b)[area]}

    return diff
