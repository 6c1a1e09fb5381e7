"""Typed results, one per method: fields named and documented, provenance, JSON round trip, table, save.

``load_result(path_or_dict)`` reads any results.json back as its type (by its ``experiment``); the pattern
for a new method is in docs/ARCHITECTURE.md ("Results").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lit_svd.results.base import SCHEMA_VERSION, Provenance, Result
from lit_svd.results.circuits import CircuitResult
from lit_svd.results.directions import CompareDirectionsResult, DirectionCheckResult
from lit_svd.results.edge_circuits import EdgeCircuitResult
from lit_svd.results.faithfulness import FaithfulnessResult
from lit_svd.results.masks import MaskBlocksResult, MaskCurveResult, MaskResult, MaskThresholdsResult
from lit_svd.results.mounts import MountsResult
from lit_svd.results.sad import SADResult
from lit_svd.results.tasks import EvaluateResult
from lit_svd.results.toy import ToyAlignmentResult
from lit_svd.results.training import TrainingResult

TYPES: tuple[type[Result], ...] = (
    ToyAlignmentResult,
    SADResult,
    TrainingResult,
    MaskResult,
    MaskThresholdsResult,
    MaskCurveResult,
    MaskBlocksResult,
    DirectionCheckResult,
    CompareDirectionsResult,
    MountsResult,
    EvaluateResult,
    FaithfulnessResult,
    CircuitResult,
    EdgeCircuitResult,
)
BY_EXPERIMENT: dict[str, type[Result]] = {name: t for t in TYPES for name in (t.experiment, *t.aliases)}


def result_type(experiment: str | None) -> type[Result]:
    """The result type of an ``experiment`` value; a results.json without one is a training run's sections."""
    if experiment is None:
        return TrainingResult
    if experiment not in BY_EXPERIMENT:
        raise ValueError(f"experiment {experiment!r} is unknown; known: {', '.join(sorted(BY_EXPERIMENT))}")
    return BY_EXPERIMENT[experiment]


def load_result(source: str | os.PathLike | dict) -> Result:
    """A results.json (its path, a run folder holding one, or its content) as its typed result; read from a file,
    its ``folder`` is the file's folder."""
    if isinstance(source, dict):
        return result_type(source.get("experiment")).from_dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results.json (has the run finished?)")
    content: dict = json.loads(path.read_text(encoding="utf-8"))
    result = result_type(content.get("experiment")).from_dict(content)
    result.folder = path.parent
    return result


__all__ = [
    "BY_EXPERIMENT",
    "SCHEMA_VERSION",
    "TYPES",
    "CircuitResult",
    "CompareDirectionsResult",
    "DirectionCheckResult",
    "EdgeCircuitResult",
    "EvaluateResult",
    "MaskBlocksResult",
    "MaskCurveResult",
    "MaskResult",
    "MaskThresholdsResult",
    "MountsResult",
    "Provenance",
    "Result",
    "SADResult",
    "ToyAlignmentResult",
    "TrainingResult",
    "load_result",
    "result_type",
]
