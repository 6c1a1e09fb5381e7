"""Where a run writes, and how: results.json, CSV tables, PNG figures and TensorBoard images.

Every file goes through this module, so that there is one policy for all of them:

* **atomic**: a file is written beside its final name and renamed into place (``write_text``), so a killed
  run never leaves half a results.json;
* **one NaN policy** (``to_jsonable``): a non-finite number in a result is an error naming its key (the run
  diverged), unless the result declares the value undefined (``None``, written as JSON ``null``; a result
  type marks such fields, ``lit_svd.results.base.nan_field``); CSV tables write ``None`` as an empty cell;
* **rank zero only** for the trainer-facing writers (``write_result``, ``save_figure``), into
  ``trainer.log_dir`` (the TensorBoard logger's version folder), so ``--trainer.default_root_dir DIR``
  relocates everything.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


def run_dir(trainer) -> Path:
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


def to_jsonable(obj: Any, where: str = "results", nan_ok: bool = False) -> Any:
    """Tensors, arrays and numpy scalars to plain JSON types. A non-finite float is an error naming its key
    (``where``), unless ``nan_ok``: then it becomes None (JSON null: an undefined value, not a diverged run)."""
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist(), where, nan_ok)
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        if not math.isfinite(value):
            if nan_ok:
                return None
            raise ValueError(f"{where} is {value}: a non-finite value in the results (the run diverged)")
        return value
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v, f"{where}.{k}", nan_ok) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]", nan_ok) for i, v in enumerate(obj)]
    return obj


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a temporary file beside it, then a rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """``obj`` as JSON (``to_jsonable``: non-finite numbers fail), written atomically."""
    return write_text(path, json.dumps(to_jsonable(obj, Path(path).name), indent=indent) + "\n")


def graphml_text(graph, nan_ok: bool = False) -> str:
    """A ``networkx`` graph as GraphML (``networkx.generate_graphml``). GraphML holds only scalars: every
    attribute goes through ``to_jsonable`` (so a non-finite number fails unless ``nan_ok``), None values are left
    out (an undefined value: no attribute), lists and dicts become JSON text."""
    import networkx as nx

    def scalars(attrs: dict, where: str) -> dict:
        out = {}
        for key, value in attrs.items():
            value = to_jsonable(value, f"{where}.{key}", nan_ok)
            if isinstance(value, (list, dict)):
                value = json.dumps(value)
            if value is not None:
                out[str(key)] = value
        return out

    plain = type(graph)()
    plain.graph.update(scalars(graph.graph, "graph"))
    for node, attrs in graph.nodes(data=True):
        plain.add_node(str(node), **scalars(attrs, str(node)))
    if graph.is_multigraph():
        for a, b, key, attrs in graph.edges(keys=True, data=True):
            plain.add_edge(str(a), str(b), key=str(key), **scalars(attrs, f"{a}->{b}"))
    else:
        for a, b, attrs in graph.edges(data=True):
            plain.add_edge(str(a), str(b), **scalars(attrs, f"{a}->{b}"))
    return "\n".join(nx.generate_graphml(plain)) + "\n"


def write_graphml(path: str | os.PathLike, graph, nan_ok: bool = False) -> Path:
    """``graphml_text(graph, nan_ok)`` written atomically."""
    return write_text(path, graphml_text(graph, nan_ok))


def csv_text(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """Rows as CSV: the columns of ``columns`` (default: every key, in first-seen order); None and missing
    keys are empty cells, booleans True / False, floats as Python prints them (shortest exact form)."""
    columns = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return buf.getvalue()


def write_csv(path: str | os.PathLike, rows: Sequence[dict], columns: Sequence[str] | None = None) -> Path:
    """``csv_text(rows, columns)`` written atomically."""
    return write_text(path, csv_text(rows, columns))


def write_results(trainer, obj: Any, name: str = "results.json") -> Path | None:
    """Write a plain JSON object (e.g. ``blocks.json``) into the run folder (rank zero only); returns the path."""
    if not trainer.is_global_zero:
        return None
    return write_json(run_dir(trainer) / name, obj)


def write_result(trainer, result, name: str = "results.json") -> Path | None:
    """Save a typed result (``lit_svd.results``) into the run folder (rank zero only): ``result.save``
    writes ``name`` and the result's table CSV. Returns the path of the JSON file."""
    if not trainer.is_global_zero:
        return None
    return result.save(run_dir(trainer), name=name)


def figure_png(fig, dpi: int = 110) -> bytes:
    """The PNG bytes of a matplotlib figure (any figure: the package draws on ``matplotlib.figure.Figure``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def save_figure(trainer, fig, name: str, step: int | None = None) -> Path | None:
    """Save a matplotlib figure as ``NAME.png`` in the run folder and as a TensorBoard image (rank zero)."""
    if not trainer.is_global_zero:
        return None
    import matplotlib.image as mpimg
    from lightning.pytorch.loggers import TensorBoardLogger

    png = figure_png(fig)  # drawn once: the PNG file and the TensorBoard image are the same pixels
    path = write_bytes(run_dir(trainer) / f"{name}.png", png)
    tb = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
    if tb:
        image = mpimg.imread(io.BytesIO(png), format="png")[..., :3]
        for logger in tb:
            logger.experiment.add_image(
                name, image, global_step=trainer.global_step if step is None else step, dataformats="HWC"
            )
    return path


def save_figures(trainer, figures: dict, step: int | None = None) -> list[Path]:
    """``save_figure`` for every ``{name: figure}``."""
    return [p for name, fig in figures.items() if (p := save_figure(trainer, fig, name, step)) is not None]


def log_figure(trainer, fig, tag: str, step: int | None = None) -> None:
    """Add a figure to every TensorBoard logger of the trainer (no file written)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure(
                tag, fig, global_step=trainer.global_step if step is None else step, close=False
            )


def log_scalars(trainer, scalars: dict[str, float], step: int) -> None:
    """Log scalars to every logger of the trainer; undefined (NaN) values are left out."""
    for logger in trainer.loggers:
        logger.log_metrics({k: v for k, v in scalars.items() if v == v}, step=step)
