"""Figures as pure functions of result objects: ``lit_svd.figures.<method>.figures(result)`` returns
``{name: matplotlib Figure}`` (the run's PNG names); ``figures_of(result)`` picks the method's function.
Nothing here runs a model or writes a file (``lit_svd.output.save_figure`` writes them)."""

from __future__ import annotations


def figures_of(result) -> dict:
    """The figures of any typed result (``lit_svd.results``), by its type."""
    from lit_svd.figures import circuits, directions, edge_circuits, masks, mounts, sad, tasks, toy, training
    from lit_svd.results import (
        CircuitResult,
        CompareDirectionsResult,
        DirectionCheckResult,
        EdgeCircuitResult,
        EvaluateResult,
        MaskBlocksResult,
        MaskCurveResult,
        MaskResult,
        MaskThresholdsResult,
        MountsResult,
        SADResult,
        ToyAlignmentResult,
        TrainingResult,
    )

    draw = {
        ToyAlignmentResult: toy.figures,
        SADResult: sad.figures,
        TrainingResult: training.figures,
        MaskResult: masks.figures,
        MaskThresholdsResult: masks.threshold_figures,
        MaskCurveResult: masks.curve_figures,
        MaskBlocksResult: masks.blocks_figures,
        DirectionCheckResult: directions.figures,
        CompareDirectionsResult: directions.compare_figures,
        MountsResult: mounts.figures,
        EvaluateResult: tasks.figures,
        CircuitResult: circuits.figures,
        EdgeCircuitResult: edge_circuits.figures,
    }
    kind = next((t for t in type(result).__mro__ if t in draw), None)  # a subclass draws as its type
    if kind is None:
        raise TypeError(f"no figures for {type(result).__name__}")
    return draw[kind](result)
