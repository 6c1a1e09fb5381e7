"""Attention templates T (N x N) of the toy model, built from a config spec.

The target logit between a query with features f(r) and a key with features f(s) is
``t = f(r)^T T f(s)``. A spec is a dict with exactly one of these keys:

- ``pair: [i, j, value]``                         one entry T[i, j] = value
- ``pairs: [[i, j, value], ...]``                 several entries
- ``ramp: {count: k, offset: o, start: 0, high: a, low: b}``
                                                  pairs (start + n, start + n + o), n < k, values falling
                                                  linearly from a (first pair) to b (last pair)
- ``file: PATH``                                  a full N x N matrix (.npy, .pt or whitespace/comma text)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

TEMPLATE_KINDS = ("pair", "pairs", "ramp", "file")
RAMP_KEYS = ("count", "offset", "start", "high", "low")


def build_template(spec: dict[str, Any], n_features: int) -> Tensor:
    """The template matrix ``[N, N]`` for ``spec``; raises ValueError / IndexError with one line on bad input."""
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in TEMPLATE_KINDS:
        raise ValueError(f"template={spec!r}: must be a dict with exactly one key of {TEMPLATE_KINDS}")
    kind, value = next(iter(spec.items()))
    if kind == "file":
        return _template_from_file(value, n_features)
    if kind == "pair":
        entries = [value]
    elif kind == "pairs":
        entries = value
    else:
        entries = _ramp_entries(value)
    if not isinstance(entries, (list, tuple)) or len(entries) == 0:
        raise ValueError(f"template.{kind}={value!r}: must list at least one [i, j, value] entry")
    T = torch.zeros(n_features, n_features)
    for entry in entries:
        i, j, v = _check_entry(kind, entry, n_features)
        T[i, j] = v
    return T


def template_pairs(T: Tensor) -> list[tuple[int, int, float]]:
    """Nonzero entries of ``T`` as ``(query_feature, key_feature, target)``, largest |target| first."""
    idx = torch.nonzero(T, as_tuple=False)
    pairs = [(int(i), int(j), float(T[i, j])) for i, j in idx]
    return sorted(pairs, key=lambda p: (-abs(p[2]), p[0], p[1]))


def _check_entry(kind: str, entry: Any, n: int) -> tuple[int, int, float]:
    if not isinstance(entry, (list, tuple)) or len(entry) != 3:
        raise ValueError(f"template.{kind} entry {entry!r}: must be [query_feature, key_feature, value]")
    i, j, v = entry
    for name, idx in (("query_feature", i), ("key_feature", j)):
        if not isinstance(idx, int) or isinstance(idx, bool):
            raise ValueError(f"template.{kind} entry {entry!r}: {name}={idx!r} must be an integer")
        if not 0 <= idx < n:
            raise IndexError(f"template.{kind} entry {list(entry)}: {name}={idx} is outside [0, n_features={n})")
    if not isinstance(v, (int, float)) or not np.isfinite(v):
        raise ValueError(f"template.{kind} entry {entry!r}: value={v!r} must be a finite number")
    return i, j, float(v)


def _ramp_entries(ramp: Any) -> list[list]:
    if not isinstance(ramp, dict) or set(ramp) - set(RAMP_KEYS) or not {"count", "offset"} <= set(ramp):
        raise ValueError(
            f"template.ramp={ramp!r}: needs count and offset, optional start, high, low; allowed keys {RAMP_KEYS}"
        )
    k, off, start = ramp["count"], ramp["offset"], ramp.get("start", 0)
    high, low = float(ramp.get("high", 1.0)), float(ramp.get("low", 0.1))
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"template.ramp.count={k!r}: must be a positive integer")
    values = np.linspace(high, low, k) if k > 1 else np.array([high])
    return [[start + n, start + n + off, float(values[n])] for n in range(k)]


def _template_from_file(path: Any, n: int) -> Tensor:
    p = Path(str(path))
    if not p.is_file():
        raise ValueError(f"template.file={str(path)!r}: no such file")
    try:
        if p.suffix == ".npy":
            M = torch.as_tensor(np.load(p, allow_pickle=False), dtype=torch.float32)
        elif p.suffix == ".pt":
            M = torch.as_tensor(torch.load(p, weights_only=True), dtype=torch.float32)
        else:
            M = torch.as_tensor(
                np.loadtxt(p, delimiter="," if p.suffix == ".csv" else None, ndmin=2), dtype=torch.float32
            )
    except Exception as err:  # any parse failure is a malformed file
        raise ValueError(
            f"template.file={str(path)!r}: cannot be read as a numeric matrix "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from None
    if M.shape != (n, n):
        raise ValueError(
            f"template.file={str(path)!r}: matrix has shape {tuple(M.shape)}, "
            f"must be (n_features, n_features) = ({n}, {n})"
        )
    if not torch.isfinite(M).all():
        raise ValueError(f"template.file={str(path)!r}: matrix contains NaN or infinite entries")
    if not M.any():
        raise ValueError(f"template.file={str(path)!r}: matrix is all zeros, the head would have nothing to attend")
    return M
