"""Text streams: WikiText (hub, streaming) or a local text file / folder, as fixed-length token windows.

``TextDataModule(tokenizer, path=None | "file.txt" | "folder/", seq_len=128, n_tokens=16384, val_tokens=0,
test_tokens=0, seed=0)`` tokenizes the whole text with the model's tokenizer, cuts it into non-overlapping
windows of ``seq_len`` tokens and deals them, in one seeded random order, into three disjoint splits: the
test split first (``test_tokens``), then validation (``val_tokens``), then training (``n_tokens``). Each
split holds ``ceil(tokens / seq_len)`` windows (kept in text order) whose real tokens add up to exactly its
token count (its last window is cut short and padded). ``probe(n)`` gives ``n`` more windows outside all
three (from the other end of the same order): what a during-training callback watches.

Batch format (a dict of tensors, B windows of L = ``seq_len`` tokens):

==================  ==========  ==========================================================
``input_ids``       [B, L] long token ids, RIGHT-padded with the pad id (last window only)
``attention_mask``  [B, L] long 1 on real tokens, 0 on padding
``index``           [B] long    the window's index in the subsample (for sharding checks)
==================  ==========  ==========================================================

The training loader shuffles its split; ``val`` and ``test`` read theirs in order (``predict``: the test
split). Under DDP the evaluation loaders give rank r windows r, r + w, ... with no overlap and no padding.
A test-only analysis (e.g. the mounts run) reads the test split: give ``test_tokens`` (and ``n_tokens: 0``).
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

from lit_svd.data_options import check_text_data_options, check_text_path
from lit_svd.datamodules.common import ResumableTrainOrder, ShardSampler, rank_and_world, resolve_tokenizer

LOCAL_WIKITEXT = "../shared/data/wikitext-2/valid.txt"


def read_local_text(path: str) -> list[str]:
    """The texts of a file, or of every ``*.txt`` file under a folder (sorted); fails on missing or empty."""
    check_text_path(path)
    root = Path(path)
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


SPLITS = ("test", "val", "train")  # the order windows are dealt in


def split_windows(
    ids: torch.Tensor, seq_len: int, tokens: dict[str, int], seed: int, probe: int = 0
) -> tuple[dict[str, list[torch.Tensor]], list[torch.Tensor]]:
    """Disjoint splits of the non-overlapping ``seq_len`` windows of ``ids``: one seeded permutation of the
    windows is dealt in ``SPLITS`` order, ``ceil(tokens[split] / seq_len)`` windows each (kept in text
    order, exactly ``tokens[split]`` tokens: the last window is shortened); ``probe`` more windows come
    from the other end of the permutation, outside every split. Returns ``({split: windows}, probe)``."""
    available = ids.numel() // seq_len
    needed = {split: math.ceil(tokens.get(split, 0) / seq_len) for split in SPLITS}
    if sum(needed.values()) + probe > available:
        asked = ", ".join(f"{s} {tokens.get(s, 0)}" for s in SPLITS if needed[s])
        raise ValueError(
            f"n_tokens / val_tokens / test_tokens ({asked}) need {sum(needed.values()) + probe} windows of"
            f" seq_len={seq_len}{f' (with {probe} probe windows)' if probe else ''}, but the text has only"
            f" {available} ({available * seq_len} tokens); ask for fewer tokens or give a longer text"
        )
    order = torch.randperm(available, generator=torch.Generator().manual_seed(seed)).tolist()
    out, start = {}, 0
    for split in SPLITS:
        picks = sorted(order[start : start + needed[split]])
        start += needed[split]
        windows = [ids[p * seq_len : (p + 1) * seq_len] for p in picks]
        if windows:
            windows[-1] = windows[-1][: tokens[split] - (needed[split] - 1) * seq_len]
        out[split] = windows
    probes = [ids[p * seq_len : (p + 1) * seq_len] for p in sorted(order[available - probe :])] if probe else []
    return out, probes


def sample_windows(ids: torch.Tensor, seq_len: int, n_tokens: int, seed: int) -> list[torch.Tensor]:
    """A seeded subset of the non-overlapping ``seq_len`` windows of ``ids`` (kept in text order),
    holding exactly ``n_tokens`` tokens; the last window is shortened to fit (one split of ``split_windows``)."""
    return split_windows(ids, seq_len, {"test": n_tokens}, seed)[0]["test"]


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
    """Fixed-length token windows of real text in disjoint train / val / test splits (module docstring).

    Args:
        tokenizer: name or path for ``load_tokenizer`` ("smollm2-135m", ...), or a tokenizer object.
        path: a local text file or folder of ``.txt`` files; None streams ``dataset`` from the hub.
        dataset: the hub dataset used when ``path`` is None.
        dataset_config: its configuration name.
        split: its split.
        seq_len: tokens per window.
        n_tokens: real tokens of the training split (0: none).
        val_tokens: real tokens of the validation split, disjoint from the training split (0: none).
        test_tokens: real tokens of the test split, disjoint from both (0: none; a test-only analysis reads
            this split, e.g. 16,384 tokens in the tiled-mount paper).
        seed: seeds the order the windows are dealt into the splits.
        batch_size: windows per batch.
        num_workers: DataLoader workers.
    """

    # the options judged before anything is read (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.data_options:check_text_data_options"

    def __init__(
        self,
        tokenizer: Any = "smollm2-135m",
        path: str | None = None,
        dataset: str = "wikitext",
        dataset_config: str | None = "wikitext-2-raw-v1",
        split: str = "validation",
        seq_len: int = 128,
        n_tokens: int = 16384,
        val_tokens: int = 0,
        test_tokens: int = 0,
        seed: int = 0,
        batch_size: int = 8,
        num_workers: int = 0,
    ):
        super().__init__()
        check_text_data_options(path, seq_len, n_tokens, val_tokens, test_tokens, batch_size)
        texts = read_local_text(path) if path is not None else read_hub_text(dataset, dataset_config, split)
        self.tokenizer = resolve_tokenizer(tokenizer)
        self.ids = tokenize_texts(self.tokenizer, texts)
        self.tokens = {"train": n_tokens, "val": val_tokens, "test": test_tokens}
        windows, _ = split_windows(self.ids, seq_len, self.tokens, seed)
        self.splits = {name: WindowDataset(w) for name, w in windows.items()}
        self.available_tokens = self.ids.numel()
        self.path, self.seq_len, self.n_tokens, self.seed = path, seq_len, n_tokens, seed
        self.batch_size, self.num_workers = batch_size, num_workers

    @property
    def data(self) -> WindowDataset:
        """The training split (``splits["train"]``)."""
        return self.splits["train"]

    def probe(self, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [n, seq_len], attention_mask)``: ``n_windows`` windows outside the train, val and test
        splits (the far end of the same seeded order), for a callback that watches the run."""
        _, probes = split_windows(self.ids, self.seq_len, self.tokens, self.seed, probe=n_windows)
        return torch.stack(probes), torch.ones(n_windows, self.seq_len, dtype=torch.long)

    def collate(self, items):
        return collate_windows(items, self.tokenizer.pad_token_id, self.seq_len)

    def _loader(self, split: str) -> DataLoader:
        data = self.splits[split]
        if split == "test" and not len(data):
            raise ValueError(
                "data.test_tokens=0: the test split is empty; give data.test_tokens (the tokens a test run"
                " analyses, e.g. 16384; data.n_tokens is the training split)"
            )
        rank, world = rank_and_world(self.trainer)
        kwargs: dict = dict(batch_size=self.batch_size, collate_fn=self.collate, num_workers=self.num_workers)
        if split == "train":
            kwargs.update(sampler=self.train_sampler(data, self.seed))
        elif world > 1:
            kwargs.update(sampler=ShardSampler(data, num_replicas=world, rank=rank))
        return DataLoader(data, **kwargs)

    def train_dataloader(self):
        return self._loader("train")

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")

    def predict_dataloader(self):
        return self._loader("test")
