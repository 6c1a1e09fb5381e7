"""What the during-training callbacks share: a held-out probe batch, the step schedule, the results file.

* ``held_out_probe``: fixed windows of a text file that the run does not train on, tokenized with the
  run's tokenizer; a probe file that is (or lies under) the training text fails in one line.
* ``StepCallback``: measures at the start of fit, every ``every_n_steps`` optimiser steps and at the end,
  once per step (also under gradient accumulation), keeping ``self.history``.
* ``update_training_result``: sets one callback's fields of the run's ``TrainingResult`` (rank zero), so the
  SAD, mounts and spectrum callbacks of one run share its ``results.json`` whatever order they finish in.
"""

from __future__ import annotations

import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lit_svd.callbacks.provenance import provenance
from lit_svd.output import run_dir, write_result
from lit_svd.results.training import TrainingResult


def _tokenizer(trainer: pl.Trainer, module):
    tok = getattr(getattr(trainer, "datamodule", None), "tokenizer", None) or getattr(module, "tokenizer", None)
    if tok is None:
        raise ValueError("the probe needs a tokenizer: fit with a datamodule that has one, or a module that loads one")
    return tok


def _training_paths(trainer: pl.Trainer) -> list[Path]:
    dm = getattr(trainer, "datamodule", None)
    path = getattr(dm, "path", None)
    return [Path(path).resolve()] if path else []


def held_out_probe(
    trainer: pl.Trainer, module, path: str, n_windows: int, seq_len: int, map_ids: bool = True
) -> tuple[Tensor, Tensor]:
    """``(ids [n_windows, seq_len], mask)``: the first windows of ``path``, as the model reads them
    (``module.map_ids`` when the vocabulary is compacted, unless ``map_ids`` is False: the tokenizer's
    ids). Fails if ``path`` is the training text."""
    from lit_svd.datamodules.text import read_local_text, tokenize_texts

    probe = Path(path).resolve()
    for train in _training_paths(trainer):
        if probe == train or train in probe.parents:
            raise ValueError(f"probe_path={path!r} is part of the training text ({train}); give a held-out file")
    texts, tok = read_local_text(path), _tokenizer(trainer, module)
    ids = tokenize_texts(tok, [_first_chunk(texts[0])])  # tokenize_texts' first chunk: the same ids, ~50x faster
    if ids.numel() < n_windows * seq_len:
        ids = tokenize_texts(tok, texts)
    if ids.numel() < n_windows * seq_len:
        raise ValueError(
            f"probe_path={path!r} holds {ids.numel()} tokens, fewer than probe_windows * probe_seq_len"
            f" = {n_windows * seq_len}"
        )
    ids = ids[: n_windows * seq_len].reshape(n_windows, seq_len)
    if map_ids and hasattr(module, "map_ids"):
        ids = module.map_ids(ids)
    return ids, torch.ones_like(ids)


def _first_chunk(text: str, chunk_chars: int = 100_000) -> str:
    """The first line-aligned chunk ``tokenize_texts`` cuts from ``text`` (lines until >= ``chunk_chars``)."""
    out, size = [], 0
    for line in text.splitlines(keepends=True):
        out.append(line)
        size += len(line)
        if size >= chunk_chars:
            break
    return "".join(out)


def all_reduce_sum(t: Tensor) -> Tensor:
    """Sum over DDP ranks (identity in one process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
    return t


def update_training_result(trainer: pl.Trainer, module, name: str = "results.json", **fields) -> None:
    """Set ``fields`` of the run's ``TrainingResult`` in ``name``, keeping what the other callbacks of this run
    wrote there (rank zero); the provenance is this write's."""
    if not trainer.is_global_zero:
        return
    path = run_dir(trainer) / name
    result = TrainingResult.from_json(path) if path.exists() else TrainingResult()
    for key, value in fields.items():
        setattr(result, key, value)
    result.provenance = provenance(trainer, module)
    write_result(trainer, result, name)


class StepCallback(Callback):
    """Runs ``self.measure(trainer, module)`` at the start of fit, every ``every_n_steps`` optimiser steps
    and at the end (once per step); subclasses append to ``self.history``."""

    def __init__(self, every_n_steps: int):
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r} must be a positive integer")
        self.every_n_steps = every_n_steps
        self.history: list[dict] = []
        self.seconds = 0.0  # wall time spent measuring (bench/callback_overhead.py reads it)

    def measure(self, trainer: pl.Trainer, module) -> dict:
        raise NotImplementedError

    def _run(self, trainer: pl.Trainer, module) -> None:
        step = trainer.global_step
        if self.history and self.history[-1]["step"] == step:
            return
        start = time.perf_counter()
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                entry = self.measure(trainer, module)
        finally:
            module.train(was_training)
        self.history.append({"step": step, **entry})
        self.seconds += time.perf_counter() - start

    def on_train_start(self, trainer, pl_module) -> None:
        self._run(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._run(trainer, pl_module)
