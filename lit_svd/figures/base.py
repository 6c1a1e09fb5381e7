"""What every figure module shares: a new figure, and arrays from result values.

Figures are drawn on ``matplotlib.figure.Figure`` objects, never through pyplot, so that no backend is
chosen or switched anywhere in the package (this is the one place that decides it): a script, the CLI
and a Jupyter notebook each keep their own, nothing global is created, and a figure needs no closing.
``lit_svd.output.save_figure`` writes one as PNG and TensorBoard image.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure


def new_figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (5, 3.4), **subplots: Any):
    """``(fig, axes)`` as ``pyplot.subplots`` gives them, on a figure outside pyplot."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **subplots)


def array(values: Any) -> np.ndarray:
    """A float array of result values; None (an undefined value in results.json) becomes NaN."""
    return np.array(values, dtype=float)


def colors() -> list[str]:
    """The default colour cycle."""
    import matplotlib

    return matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]


def nanmean(values: Any, axis: int | None = None) -> np.ndarray:
    """``np.nanmean`` that gives NaN, without a warning, where every value is undefined."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(array(values), axis=axis)
