"""The progress bar of every run: ``step N/max_steps`` and the run's key quantity, with an ETA.

Lightning's default bar counts batches per epoch (``Epoch 0/-2`` on a step-based run) and shows every
``prog_bar`` metric under its raw name plus ``v_num``. ``StepProgressBar`` counts optimizer steps over
the whole run and shows short labels of the quantities a run is about: the toy's mean |cos| (from the
alignment callback), the masks' KL and kept fraction, losses. A callback adds its own entries by
setting a ``progress_bar_metrics`` dict attribute. Evaluation loops (validate / test / predict) keep
Lightning's per-batch bars, which show the batches done and an ETA.
"""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

# metric key -> (label, format); keys not listed are not shown unless the run logs none of these
LABELS: dict[str, tuple[str, str]] = {
    "alignment/mean_abs_cos": ("|cos|", "{:.3f}"),
    "train/kl": ("KL", "{:.3f}"),
    "train/kept_fraction": ("kept", "{:.2%}"),
    "train/loss": ("loss", "{:.3g}"),
    "val/loss": ("val loss", "{:.3g}"),
    "sad/mean_sparsity": ("sparsity", "{:.3f}"),
    "sad/mean_sparsity_rotated": ("rotated", "{:.3f}"),
}


def bar_metrics(metrics: dict[str, Any]) -> dict[str, str]:
    """Labelled, formatted entries for the known keys; all entries (raw) when none is known."""
    known = {LABELS[k][0]: LABELS[k][1].format(float(v)) for k, v in metrics.items() if k in LABELS}
    if known:
        return known
    return {k.removeprefix("train/"): f"{float(v):.3g}" for k, v in metrics.items() if k != "v_num"}


class StepProgressBar(TQDMProgressBar):
    """``step N/max_steps`` over the whole run (optimizer steps, so a resumed run starts where it stopped)."""

    STEP_FORMAT = "step {n_fmt}/{total_fmt} |{bar:20}| [{elapsed}<{remaining}{postfix}]"

    def _step_based(self, trainer: pl.Trainer) -> bool:
        return trainer.max_steps is not None and trainer.max_steps > 0

    def init_train_tqdm(self):
        if not self._step_based(self.trainer):
            return super().init_train_tqdm()
        return Tqdm(
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            bar_format=self.STEP_FORMAT,
            total=self.trainer.max_steps,
            initial=self.trainer.global_step,
        )  # a resumed run starts at its checkpoint's step

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if self._step_based(trainer):
            return
        super().on_train_epoch_start(trainer)
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        self.train_progress_bar.set_description(f"epoch {trainer.current_epoch}{epochs}")

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int):
        if not self._step_based(trainer):
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        bar = self.train_progress_bar
        if bar is not None and not bar.disable:
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, str]:
        metrics = dict(trainer.progress_bar_metrics)
        for cb in trainer.callbacks:
            metrics.update(getattr(cb, "progress_bar_metrics", None) or {})
        return bar_metrics(metrics)
