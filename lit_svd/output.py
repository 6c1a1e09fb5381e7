"""Where a run writes: results.json, PNG figures and TensorBoard images, on rank zero only.

Every run writes into ``trainer.log_dir`` (the TensorBoard logger's version folder), so
``--trainer.default_root_dir DIR`` relocates everything.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch


def run_dir(trainer: pl.Trainer) -> Path:
    """The run's output folder: ``trainer.log_dir``, else ``default_root_dir``.

    Resolved locally, as ``trainer.log_dir`` does but without its DDP broadcast: that broadcast is a
    collective, and rank zero alone calling it (as the rank-zero writers below do) hangs a DDP run.
    Rank zero's own logger folder is the right one, since only rank zero writes.
    """
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    if trainer.loggers:
        logger = trainer.loggers[0]
        local = logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else logger.save_dir
    else:
        local = trainer.default_root_dir
    path = Path(local or trainer.default_root_dir)
    if trainer.is_global_zero:
        path.mkdir(parents=True, exist_ok=True)
    return path


def to_jsonable(obj: Any) -> Any:
    """Tensors, arrays and numpy scalars to plain JSON types; NaN becomes an error."""
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        if not math.isfinite(value):
            raise ValueError(f"results contain a non-finite value ({value}); the run diverged")
        return value
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


def write_results(trainer: pl.Trainer, results: dict, name: str = "results.json") -> Path | None:
    """Write ``results`` as plain JSON into the run folder (rank zero only); returns the path."""
    if not trainer.is_global_zero:
        return None
    path = run_dir(trainer) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(to_jsonable(results), indent=2))
    os.replace(tmp, path)
    return path


def save_figure(trainer: pl.Trainer, fig, name: str, step: int | None = None) -> Path | None:
    """Save a matplotlib figure as ``NAME.png`` in the run folder and as a TensorBoard image.

    Rank zero only; the figure is closed either way.
    """
    import io

    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt
    from lightning.pytorch.loggers import TensorBoardLogger

    path = None
    if trainer.is_global_zero:
        path = run_dir(trainer) / f"{name}.png"
        buf = io.BytesIO()  # drawn once: the PNG file and the TensorBoard image are the same pixels
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        path.write_bytes(buf.getvalue())
        tb = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if tb:
            image = mpimg.imread(io.BytesIO(buf.getvalue()), format="png")[..., :3]
            for logger in tb:
                logger.experiment.add_image(
                    name, image, global_step=trainer.global_step if step is None else step, dataformats="HWC"
                )
    plt.close(fig)
    return path


def log_figure(trainer: pl.Trainer, fig, tag: str, step: int | None = None) -> None:
    """Add a figure to every TensorBoard logger of the trainer (no file written)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure(
                tag, fig, global_step=trainer.global_step if step is None else step, close=False
            )
