"""Bootstrap intervals of CPR and CMD over the test prompts (docs/circuits.md, "How sure: intervals over prompts").

A curve's ``f`` at each size is a ratio of means over the prompts (``faithfulness.faithfulness_of``), so its CPR and
CMD move with the prompt sample. Drawing the prompts again with replacement and recomputing ``m(full)``,
``m(empty)``, ``f`` and the areas from the per-prompt metrics gives a percentile interval for each curve. Every
curve of one run is scored on the same prompts, so the same draws serve all of them and the difference of two
curves is resampled *paired*: a difference whose interval holds 0 is not resolved by these prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

RESAMPLES = 2000
LEVEL = 0.95


def resample_weights(n_prompts: int, n_resamples: int = RESAMPLES, seed: int = 0) -> Tensor:
    """``[n_resamples, n_prompts]``: how often each prompt is drawn in each resample, over ``n_prompts`` (the mean
    over a resample is then a product with these weights)."""
    if n_prompts < 2:
        raise ValueError(f"intervals over prompts need at least 2 prompts, got {n_prompts}")
    g = torch.Generator().manual_seed(seed)
    draws = torch.randint(n_prompts, (n_resamples, n_prompts), generator=g)
    counts = torch.zeros(n_resamples, n_prompts, dtype=torch.float64)
    counts.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))
    return counts / n_prompts


def f_samples(metric: Tensor, full: Tensor, empty: Tensor, weights: Tensor) -> Tensor:
    """``[S, R]``: ``f`` at each size of the curve whose per-prompt metric is ``metric`` ``[S, P]`` (one row per
    size) with the ends ``full`` / ``empty`` ``[P]``, for each resample of ``weights`` ``[R, P]``: a ratio of the
    weighted means."""
    m, m_full, m_empty = metric.double() @ weights.T, weights @ full.double(), weights @ empty.double()
    return (m - m_empty) / (m_full - m_empty)


def area_samples(sizes: Sequence[float], f: Tensor) -> tuple[Tensor, Tensor]:
    """``(cpr, cmd)``, each ``[R]``: the trapezoid areas over ``sizes`` (``faithfulness.areas``) of each column of
    ``f`` ``[S, R]``."""
    dx = torch.tensor(sizes, dtype=torch.float64).diff()[:, None]
    cpr = (dx * (f[:-1] + f[1:]) / 2).sum(0)
    gap = (1 - f).abs()
    cmd = (dx * (gap[:-1] + gap[1:]) / 2).sum(0)
    return cpr, cmd


def interval(samples: Tensor, level: float = LEVEL) -> list[float]:
    """The central ``level`` percentile interval of ``samples``."""
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    return torch.quantile(samples.double(), q).tolist()


def area_intervals(
    sizes: Sequence[float],
    metrics: Mapping[str, Tensor],
    full: Tensor,
    empty: Tensor,
    pairs: Sequence[tuple[str, str]] = (),
    n_resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> dict:
    """Percentile intervals over resampled prompts. ``metrics``: per curve its per-prompt metric ``[S, P]``;
    ``full`` / ``empty``: the ends' ``[P]`` (all on the same prompts, in the same order). Returns ``{"curves":
    {name: {"cpr": [lo, hi], "cmd": [lo, hi], "f": [[lo per size], [hi per size]]}}, "pairs": {"a - b": {"cpr":
    [lo, hi], "cmd": [lo, hi]}}, "level", "resamples", "prompts"}`` (a pair's interval is of ``a``'s area minus
    ``b``'s, on the same draws)."""
    n = len(full)
    for name, m in metrics.items():
        if m.shape != (len(sizes), n):
            raise ValueError(f"curve {name!r}: per-prompt metric of shape {tuple(m.shape)}, want {(len(sizes), n)}")
    weights = resample_weights(n, n_resamples, seed)
    out: dict = {"level": level, "resamples": n_resamples, "prompts": n, "curves": {}, "pairs": {}}
    samples = {}
    for name, m in metrics.items():
        f = f_samples(m, full, empty, weights)
        samples[name] = cpr, cmd = area_samples(sizes, f)
        f_lo, f_hi = (torch.quantile(f, q, dim=1).tolist() for q in ((1 - level) / 2, (1 + level) / 2))
        out["curves"][name] = {"cpr": interval(cpr, level), "cmd": interval(cmd, level), "f": [f_lo, f_hi]}
    for a, b in pairs:
        missing = [x for x in (a, b) if x not in samples]
        if missing:
            raise ValueError(f"pair ({a!r}, {b!r}): no per-prompt metric for {missing}")
        (cpr_a, cmd_a), (cpr_b, cmd_b) = samples[a], samples[b]
        out["pairs"][f"{a} - {b}"] = {"cpr": interval(cpr_a - cpr_b, level), "cmd": interval(cmd_a - cmd_b, level)}
    return out
