"""Pieces shared by the task and text DataModules: tokenizer resolution and DDP sharding."""
from __future__ import annotations

from typing import Any, Iterator

import torch.distributed as dist
from torch.utils.data import DistributedSampler


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
