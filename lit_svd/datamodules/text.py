"""Text streams: WikiText (hub, streaming) or a local text file / folder, as fixed-length token windows.

``TextDataModule(tokenizer, path=None | "file.txt" | "folder/", seq_len=128, n_tokens=16384, seed=0)``
tokenizes the whole text with the model's tokenizer, cuts it into non-overlapping windows of
``seq_len`` tokens and keeps a seeded random subset of ``ceil(n_tokens / seq_len)`` windows (in text
order) whose real tokens add up to exactly ``n_tokens`` (the last window is cut short and padded).

Batch format (a dict of tensors, B windows of L = ``seq_len`` tokens):

==================  ==========  ==========================================================
``input_ids``       [B, L] long token ids, RIGHT-padded with the pad id (last window only)
``attention_mask``  [B, L] long 1 on real tokens, 0 on padding
``index``           [B] long    the window's index in the subsample (for sharding checks)
==================  ==========  ==========================================================

Every loader (train / val / test / predict) reads the same subsample; the training loader shuffles.
Under DDP the evaluation loaders give rank r windows r, r + w, ... with no overlap and no padding.
Without ``path`` the text comes from the hub (``datasets.load_dataset(dataset, dataset_config,
split, streaming=True)``); when that fails the error names the ``path`` option.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lit_svd.datamodules.common import ResumableTrainOrder, ShardSampler, rank_and_world, resolve_tokenizer

LOCAL_WIKITEXT = "../shared/data/wikitext-2/valid.txt"


def read_local_text(path: str) -> list[str]:
    """The texts of a file, or of every ``*.txt`` file under a folder (sorted); fails on missing or empty."""
    root = Path(path)
    if not root.exists():
        raise ValueError(f"path={path!r} does not exist; give a text file or a folder of .txt files")
    files = sorted(root.rglob("*.txt")) if root.is_dir() else [root]
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    if not any(t.strip() for t in texts):
        what = "no .txt file with text" if root.is_dir() else "no text"
        raise ValueError(f"path={path!r} holds {what}; give a non-empty text file or folder")
    return texts


def read_hub_text(dataset: str, config: str | None, split: str) -> Iterable[str]:
    """The ``text`` column of a hub dataset, streamed; a failure names the local-file option."""
    from lit_svd.models.loading import hub_offline

    try:
        if hub_offline():  # fail now instead of after the datasets library's network retries
            raise ConnectionError("the hub is unreachable or HF_HUB_OFFLINE is set")
        from datasets import load_dataset

        rows = load_dataset(dataset, config, split=split, streaming=True)
        first = next(iter(rows))  # streaming is lazy: touch the hub now so failures surface here
    except Exception as err:  # offline, unknown name, no network: all end the same way
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"could not stream dataset={dataset!r} (config {config!r}, split {split!r}) from the hub"
            f" ({reason[:200]}); pass path=<local text file or folder>, e.g. {LOCAL_WIKITEXT}"
        ) from None
    if "text" not in first:
        raise ValueError(f"dataset={dataset!r} has no 'text' column (columns: {', '.join(first)})")
    return (row["text"] for row in rows)


def tokenize_texts(tokenizer, texts: Iterable[str], chunk_chars: int = 100_000) -> torch.Tensor:
    """All texts as one 1-D id tensor; long texts are tokenized in line-aligned chunks."""
    pieces: list[list[int]] = []
    buffer, size = [], 0

    def flush():
        nonlocal buffer, size
        if buffer:
            pieces.append(tokenizer.encode("".join(buffer), add_special_tokens=False))
            buffer, size = [], 0

    for text in texts:
        for line in text.splitlines(keepends=True):
            buffer.append(line)
            size += len(line)
            if size >= chunk_chars:
                flush()
        flush()
    return torch.tensor([i for piece in pieces for i in piece], dtype=torch.long)


def sample_windows(ids: torch.Tensor, seq_len: int, n_tokens: int, seed: int) -> list[torch.Tensor]:
    """A seeded subset of the non-overlapping ``seq_len`` windows of ``ids`` (kept in text order),
    holding exactly ``n_tokens`` tokens; the last window is shortened to fit."""
    available = ids.numel() // seq_len
    needed = math.ceil(n_tokens / seq_len)
    if needed > available:
        raise ValueError(
            f"n_tokens={n_tokens} needs {needed} windows of seq_len={seq_len}, but the text has only"
            f" {available} ({available * seq_len} tokens); ask for at most {available * seq_len}"
        )
    picks = torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:needed].sort().values
    windows = [ids[p * seq_len : (p + 1) * seq_len] for p in picks.tolist()]
    windows[-1] = windows[-1][: n_tokens - (needed - 1) * seq_len]
    return windows


class WindowDataset(Dataset):
    def __init__(self, windows: list[torch.Tensor]):
        self.windows = windows

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        return i, self.windows[i]


def collate_windows(items, pad_id: int, seq_len: int) -> dict[str, torch.Tensor]:
    ids = torch.full((len(items), seq_len), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), seq_len), dtype=torch.long)
    for row, (_, window) in enumerate(items):
        ids[row, : window.numel()] = window
        mask[row, : window.numel()] = 1
    return dict(input_ids=ids, attention_mask=mask, index=torch.tensor([i for i, _ in items]))


class TextDataModule(ResumableTrainOrder, pl.LightningDataModule):
    """Fixed-length token windows of real text (see the module docstring for the batch format).

    Args:
        tokenizer: name or path for ``load_tokenizer`` ("smollm2-135m", ...), or a tokenizer object.
        path: a local text file or folder of ``.txt`` files; None streams ``dataset`` from the hub.
        dataset: the hub dataset used when ``path`` is None.
        dataset_config: its configuration name.
        split: its split.
        seq_len: tokens per window.
        n_tokens: total real tokens in the subsample (16,384 in the tiled-mount paper).
        seed: seeds the choice of windows.
        batch_size: windows per batch.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        tokenizer: Any = "smollm2-135m",
        path: str | None = None,
        dataset: str = "wikitext",
        dataset_config: str | None = "wikitext-2-raw-v1",
        split: str = "validation",
        seq_len: int = 128,
        n_tokens: int = 16384,
        seed: int = 0,
        batch_size: int = 8,
        num_workers: int = 0,
    ):
        super().__init__()
        for key, value in (("seq_len", seq_len), ("n_tokens", n_tokens), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"{key}={value} is invalid; give a positive integer")
        texts = read_local_text(path) if path is not None else read_hub_text(dataset, dataset_config, split)
        self.tokenizer = resolve_tokenizer(tokenizer)
        ids = tokenize_texts(self.tokenizer, texts)
        self.data = WindowDataset(sample_windows(ids, seq_len, n_tokens, seed))
        self.available_tokens = ids.numel()
        self.path, self.seq_len, self.n_tokens, self.seed = path, seq_len, n_tokens, seed
        self.batch_size, self.num_workers = batch_size, num_workers

    def collate(self, items):
        return collate_windows(items, self.tokenizer.pad_token_id, self.seq_len)

    def _loader(self, shuffle: bool) -> DataLoader:
        rank, world = rank_and_world(self.trainer)
        kwargs: dict = dict(batch_size=self.batch_size, collate_fn=self.collate, num_workers=self.num_workers)
        if shuffle:
            kwargs.update(sampler=self.train_sampler(self.data, self.seed))
        elif world > 1:
            kwargs.update(sampler=ShardSampler(self.data, num_replicas=world, rank=rank))
        return DataLoader(self.data, **kwargs)

    def train_dataloader(self):
        return self._loader(shuffle=True)

    def val_dataloader(self):
        return self._loader(shuffle=False)

    def test_dataloader(self):
        return self._loader(shuffle=False)

    def predict_dataloader(self):
        return self._loader(shuffle=False)
