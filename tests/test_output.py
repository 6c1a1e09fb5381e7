"""Run outputs: plain JSON, NaN refused, rank-zero writing into trainer.log_dir."""

import json
import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from lit_svd.output import to_jsonable, write_results


def test_to_jsonable_converts_tensors_and_numpy():
    obj = {"a": torch.tensor([1.5, 2.0]), "b": np.float32(0.25), "c": (np.int64(3),), 4: "x"}
    assert to_jsonable(obj) == {"a": [1.5, 2.0], "b": 0.25, "c": [3], "4": "x"}


@pytest.mark.parametrize("bad", [float("nan"), torch.tensor([1.0, math.inf])])
def test_non_finite_results_are_refused(bad):
    with pytest.raises(ValueError, match="non-finite"):
        to_jsonable({"x": bad})


def test_write_results_goes_to_log_dir(tmp_path):
    trainer = pl.Trainer(default_root_dir=tmp_path, max_steps=1, enable_progress_bar=False)
    path = write_results(trainer, {"experiment": "unit", "value": np.float64(1.0)})
    assert path.parent == tmp_path / "lightning_logs" / "version_0"
    assert json.loads(path.read_text()) == {"experiment": "unit", "value": 1.0}
