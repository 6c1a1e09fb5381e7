"""Pieces shared by the task and text DataModules: tokenizer resolution, DDP sharding, resumable shuffling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, RandomSampler


def resolve_tokenizer(tokenizer: Any):
    """A tokenizer object from a name/path (``load_tokenizer``) or the object itself; pad token set."""
    if isinstance(tokenizer, str):
        from lit_svd.models.loading import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    if not callable(getattr(tokenizer, "encode", None)):
        raise ValueError(f"tokenizer={tokenizer!r} is neither a name/path nor a tokenizer object with .encode")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def rank_and_world(trainer=None) -> tuple[int, int]:
    """``(global_rank, world_size)`` from the trainer, else from torch.distributed, else ``(0, 1)``."""
    if trainer is not None:
        return trainer.global_rank, trainer.world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardSampler(DistributedSampler):
    """Rank ``r`` of ``w`` reads items ``r, r + w, r + 2w, ...`` in order: no overlap, no padding
    (unlike ``DistributedSampler``, which repeats items to even out the ranks and so double-counts
    them in evaluation). A ``DistributedSampler`` subclass so that Lightning does not replace it."""

    def __init__(self, dataset, num_replicas: int, rank: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, len(self.dataset), self.num_replicas))


class ResumableSampler(RandomSampler):
    """A shuffling sampler whose order is a function of ``(seed, epoch)`` alone and that resumes mid-epoch.

    Epoch ``e`` gives the same order as ``DataLoader(shuffle=True, generator=Generator().manual_seed(seed))``
    gives in its ``e``-th epoch (the loader's per-epoch base-seed draw and the sampler's trailing ``randperm``
    are replayed), so runs are unchanged by it. ``state()`` says how many indices of which epoch were handed
    out; ``resume(state)`` makes the next pass over that epoch skip them. Lightning calls ``set_epoch``
    (a ``RandomSampler`` subclass, so under DDP it is replaced by a ``DistributedSampler`` as before).
    """

    def __init__(self, data, seed: int, resume: dict | None = None):
        super().__init__(data)
        self.seed, self.epoch, self.consumed = int(seed), 0, 0
        self._resume = dict(resume) if resume else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def state(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed)
        n = len(self.data_source)
        for _ in range(epoch + 1):
            torch.empty((), dtype=torch.int64).random_(generator=g)  # DataLoader's base seed
            perm = torch.randperm(n, generator=g)
            torch.randperm(n, generator=g)  # RandomSampler's (empty) remainder draw
        return perm.tolist()

    def __iter__(self) -> Iterator[int]:
        skip = 0
        if self._resume is not None and self._resume["epoch"] == self.epoch:
            skip = self._resume["consumed"]
        self._resume = None
        self.consumed = skip
        for index in self.order(self.epoch)[skip:]:
            self.consumed += 1
            yield index


class ResumableTrainOrder:
    """DataModule mixin: the training loader's shuffle order is saved in checkpoints (Lightning calls
    ``state_dict`` / ``load_state_dict`` of the data module), so that ``--ckpt_path last`` continues the
    interrupted epoch where it stopped instead of restarting it."""

    _train_sampler: ResumableSampler | None = None
    _resume: dict | None = None

    def train_sampler(self, data, seed: int) -> ResumableSampler:
        self._train_sampler = ResumableSampler(data, seed, resume=self._resume)
        return self._train_sampler

    def state_dict(self) -> dict:
        return {"train_sampler": self._train_sampler.state()} if self._train_sampler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self._resume = state.get("train_sampler")
