"""Frozen feature directions with a chosen interference ||E_X||_2 (the theory experiments).

Construction (N features in D dimensions): start from base unit vectors q_i, orthonormal when N <= D
(a Haar-random frame) and independent random unit vectors otherwise; let g be their normalised mean.
Feature i is ``x_i = (q_i + alpha g) / ||q_i + alpha g||``. Mixing in the common direction makes the
features anisotropic: for an orthonormal base every pair has the same cosine rho(alpha) and
``||E_X||_2 = rho (N - 1)``. alpha >= 0 is found by bisection so that ``||E_X||_2`` (see
``lit_svd.analysis.alignment.interference``) equals the request within ``tol``. Reachable values run
from the base's own interference (0 for an orthonormal base) up to (but excluding) N - 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_svd.analysis.alignment import interference, unit_columns
from lit_svd.linalg import haar_orthogonal


def base_directions(n_features: int, d_model: int, generator: torch.Generator) -> Tensor:
    """``[D, N]`` unit columns: orthonormal if N <= D, else random unit vectors (float64)."""
    if n_features <= d_model:
        return haar_orthogonal(d_model, generator=generator, dtype=torch.float64)[:, :n_features]
    return unit_columns(torch.randn(d_model, n_features, generator=generator, dtype=torch.float64))


def features_with_interference(
    n_features: int, d_model: int, target: float | None, generator: torch.Generator, tol: float = 1e-4
) -> tuple[Tensor, float]:
    """Unit feature directions ``[D, N]`` (float32) with ``||E_X||_2 = target`` (None: the base directions as
    drawn); returns them and the value reached."""
    base = base_directions(n_features, d_model, generator)
    if target is None:
        return base.float(), float(interference(base))
    mean_dir = unit_columns(base.sum(dim=1, keepdim=True))

    def make(alpha: float) -> Tensor:
        return unit_columns(base + alpha * mean_dir)

    lowest, ceiling = float(interference(base)), float(n_features - 1)
    if target < lowest - tol or target >= ceiling:
        raise ValueError(
            f"interference={target}: must lie in [{round(lowest, 4):g}, {ceiling:g}) for "
            f"n_features={n_features}, d_model={d_model}"
        )
    lo, hi = 0.0, 1.0
    while float(interference(make(hi))) < target:
        lo, hi = hi, hi * 2.0
        if hi > 1e8:
            raise ValueError(f"interference={target}: not reachable for n_features={n_features}, d_model={d_model}")
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(interference(make(mid))) < target else (lo, mid)
        if hi - lo < 1e-12:
            break
    X = make(0.5 * (lo + hi)) if target > lowest else base
    reached = float(interference(X))
    if abs(reached - target) > max(tol, tol * target):
        raise ValueError(
            f"interference={target}: bisection reached only {reached:.6g} for "
            f"n_features={n_features}, d_model={d_model}"
        )
    return X.float(), reached
