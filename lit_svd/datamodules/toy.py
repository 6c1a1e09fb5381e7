"""The toy model's data: an endless, seeded stream of sparse feature vectors.

Each of N features is active with probability p and then takes a value uniform in [0, 1]. One sample is
a query feature vector f(r) and m key feature vectors f(s_1..s_m). A batch is a tensor
``[n_instances, batch_size, 1 + m, N]`` (token 0 is the query): every ensemble member gets its own
samples, drawn with its own p. The stream is seeded from (seed, rank, dataloader worker), so each DDP
rank and worker draws different samples, and the same ones on every rerun.
"""

from __future__ import annotations

from collections.abc import Iterator

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lit_svd.data_options import check_sparse_feature_options


def stream_seed(seed: int, rank: int, worker: int = 0) -> int:
    """A 63-bit generator seed that differs for every (seed, rank, worker)."""
    state = np.random.SeedSequence([seed, rank, worker]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


def sample_sparse_features(
    generator: torch.Generator, batch_size: int, n_tokens: int, n_features: int, p: Tensor
) -> Tensor:
    """``[len(p), batch_size, n_tokens, n_features]``: active with probability ``p[instance]``, then U[0, 1]."""
    shape = (len(p), batch_size, n_tokens, n_features)
    active = torch.rand(shape, generator=generator) < p.view(-1, 1, 1, 1)
    return torch.rand(shape, generator=generator) * active


class SparseFeatureStream(IterableDataset):
    """Endless batches from ``sample_sparse_features``; seeded per (seed, rank, worker)."""

    def __init__(self, n_features: int, n_keys: int, p: Tensor, batch_size: int, seed: int, rank: int = 0):
        self.n_features, self.n_tokens, self.p = n_features, 1 + n_keys, p
        self.batch_size, self.seed, self.rank = batch_size, seed, rank

    def __iter__(self) -> Iterator[Tensor]:
        info = get_worker_info()
        g = torch.Generator().manual_seed(stream_seed(self.seed, self.rank, info.id if info else 0))
        while True:
            yield sample_sparse_features(g, self.batch_size, self.n_tokens, self.n_features, self.p)


class SparseFeatureDataModule(pl.LightningDataModule):
    """Sparse feature stream for ``ToyAlignmentModule``.

    Args:
        n_features: N, must equal the model's n_features.
        n_keys: m, key tokens per query.
        p: activation probability, one value or one per ensemble instance.
        n_instances: ensemble size (taken from ``p`` when that is a list).
        batch_size: samples per step per instance (and per DDP rank).
        seed: base seed of the stream; rank and worker are mixed in.
        num_workers: DataLoader worker processes (each gets its own seed).
    """

    # the options judged before anything is built (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.data_options:check_sparse_feature_options"

    def __init__(
        self,
        n_features: int = 20,
        n_keys: int = 8,
        p: float | list[float] = 0.1,
        n_instances: int | None = None,
        batch_size: int = 1024,
        seed: int = 0,
        num_workers: int = 0,
    ):
        super().__init__()
        probs, n_instances = check_sparse_feature_options(n_features, n_keys, p, n_instances, batch_size, num_workers)
        # no save_hyperparameters: the module's hparams (seed, n_features) would clash in the logger merge
        self.n_features, self.n_keys, self.batch_size = n_features, n_keys, batch_size
        self.n_instances, self.seed, self.num_workers = n_instances, seed, num_workers
        self.p = torch.tensor(probs * n_instances if len(probs) == 1 else probs)

    def rank(self) -> int:
        return self.trainer.global_rank if self.trainer is not None else 0

    def train_dataloader(self) -> DataLoader:
        stream = SparseFeatureStream(self.n_features, self.n_keys, self.p, self.batch_size, self.seed, self.rank())
        return DataLoader(
            stream, batch_size=None, num_workers=self.num_workers, persistent_workers=self.num_workers > 0
        )
