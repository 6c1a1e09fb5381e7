"""``ThreadShare``: keeps a run's torch threads at its share of the machine's cores while it runs (``lit_svd.threads``).

The command line adds it to every run not given a thread count (``--threads``, ``OMP_NUM_THREADS``). From ``setup``
to ``teardown`` the run is registered as alive; at the start of a batch and at an epoch's end (before the module's
own epoch-end work), at most every ``every_s`` seconds, it reads how many runs are alive and sets
``torch.set_num_threads(max(1, cores // runs))`` (on the main thread, between batches, where a change is safe); at
``teardown`` it unregisters and gives back the thread count it found.
"""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch

from lit_svd.threads import Registry, usable_cores


class ThreadShare(pl.Callback):
    """Torch threads = this run's share of the cores, re-read every ``every_s`` seconds at a batch start."""

    def __init__(self, every_s: float = 2.0, registry: Registry | None = None):
        self.every_s, self.registry = every_s, registry or Registry()
        self.cores = usable_cores()
        self._found: int | None = None
        self._checked = float("-inf")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._found is None:
            self._found = torch.get_num_threads()
        self.registry.register()
        self.adjust(force=True)

    def adjust(self, force: bool = False) -> int:
        """Set the threads to the share now (at most every ``every_s`` seconds unless ``force``); returns them."""
        now = time.monotonic()
        if force or now - self._checked >= self.every_s:
            self._checked = now
            share = self.registry.share(self.cores)
            if share != torch.get_num_threads():
                torch.set_num_threads(share)
        return torch.get_num_threads()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.adjust()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.adjust()

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.adjust()

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.adjust()

    # before the module's own epoch-end work (callbacks run first): a run's end-of-epoch analysis
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.adjust()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self.adjust()

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self.adjust()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.registry.unregister()
        if self._found is not None:
            torch.set_num_threads(self._found)
            self._found = None
