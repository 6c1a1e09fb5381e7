"""SAD's options and their checks, without torch: the module's constructor and the command line's fast check
(``config_check``, before torch is imported) run the same ``check_sad_options``."""

from __future__ import annotations

from typing import Any


def check_threshold(threshold: float | None, key: str = "threshold") -> float | None:
    """``None`` (uniform 1/n rule) or a number in [0, 1]; anything else fails with one line."""
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 1.0):
        raise ValueError(
            f"{key}={threshold!r} is outside [0, 1]: give an attention weight in [0, 1], or null for"
            " the uniform level 1/(visible sources)"
        )
    return threshold


def check_tolerance(tol: float, key: str = "recon_tol") -> float:
    if not (isinstance(tol, (int, float)) and 0.0 <= tol < 1.0):
        raise ValueError(f"{key}={tol!r} is outside [0, 1): give a fraction of sum_k |c_k|, e.g. 1e-4")
    return float(tol)


def check_null_draws(n: int, key: str = "null_draws") -> int:
    """0 (no matched null) or at least 2 draws (a percentile needs more than one)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n == 1:
        raise ValueError(f"{key}={n!r}: must be 0 (no matched null) or an integer >= 2")
    return n


def check_null_stride(n: int, key: str = "null_stride") -> int:
    """A positive integer: the matched null sees every n-th prompt (``null_prompts``)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{key}={n!r}: must be a positive integer (1: every prompt)")
    return n


def check_sad_options(
    threshold: float | None = None,
    recon_tol: float = 1e-4,
    min_pairs: int = 20,
    null_draws: int = 16,
    null_stride: int = 1,
    layers: list[int] | None = None,
    heads: list[list[int]] | None = None,
    n_layers: int | None = None,
    n_heads: int | None = None,
) -> None:
    """Every option of ``SADAnalysisModule`` that can be judged before the model loads, one line naming the key
    otherwise (``n_layers`` / ``n_heads``: the model's, when known, bound ``layers`` and ``heads``)."""
    check_threshold(threshold, "model.threshold")
    check_tolerance(recon_tol, "model.recon_tol")
    if isinstance(min_pairs, bool) or not isinstance(min_pairs, int) or min_pairs < 1:
        raise ValueError(f"model.min_pairs={min_pairs!r} must be a positive integer")
    check_null_draws(null_draws, "model.null_draws")
    check_null_stride(null_stride, "model.null_stride")
    if layers is not None and heads is not None:
        raise ValueError(
            "give model.layers or model.heads, not both: layers analyses every head of each layer,"
            " heads lists [layer, head] pairs"
        )
    bounds: list[tuple[str, Any, int | None]] = [("layer", l, n_layers) for l in layers or ()]
    for pair in heads or ():
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"model.heads entry {pair!r} is not a [layer, head] pair")
        bounds += [("layer", pair[0], n_layers), ("head", pair[1], n_heads)]
    for what, value, n in bounds:
        if n is not None and isinstance(value, int) and not 0 <= value < n:
            raise ValueError(f"model.{what}s: {what} {value} is out of range; the model has {n} {what}s (0..{n - 1})")
