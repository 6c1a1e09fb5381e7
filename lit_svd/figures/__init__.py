"""Figures as pure functions of result objects: ``lit_svd.figures.<method>.figures(result)`` returns
``{name: matplotlib Figure}`` (the run's PNG names); ``figures_of(result)`` picks the method's function from
``drawers()``, the registry that holds one entry per result type of ``lit_svd.results.TYPES`` (a test checks it).
Nothing here runs a model or writes a file (``lit_svd.output.save_figure`` writes them)."""

from __future__ import annotations

from collections.abc import Callable


def drawers() -> dict[type, Callable[..., dict]]:
    """``{result type: its figures function}``, one entry per registered result type (imported on first use: no
    matplotlib until a figure is drawn)."""
    from lit_svd import results as R
    from lit_svd.figures import (
        circuits,
        directions,
        edge_circuits,
        faithfulness,
        masks,
        mounts,
        sad,
        tasks,
        toy,
        training,
    )

    return {
        R.ToyAlignmentResult: toy.figures,
        R.SADResult: sad.figures,
        R.TrainingResult: training.figures,
        R.MaskResult: masks.figures,
        R.MaskThresholdsResult: masks.threshold_figures,
        R.MaskCurveResult: masks.curve_figures,
        R.MaskBlocksResult: masks.blocks_figures,
        R.DirectionCheckResult: directions.figures,
        R.CompareDirectionsResult: directions.compare_figures,
        R.MountsResult: mounts.figures,
        R.EvaluateResult: tasks.figures,
        R.FaithfulnessResult: faithfulness.figures,
        R.CircuitResult: circuits.figures,
        R.EdgeCircuitResult: edge_circuits.figures,
    }


def figures_of(result) -> dict:
    """The figures of any typed result (``lit_svd.results``), by its type (a subclass draws as its type)."""
    draw = drawers()
    kind = next((t for t in type(result).__mro__ if t in draw), None)
    if kind is None:
        raise TypeError(f"no figures for {type(result).__name__}")
    return draw[kind](result)
