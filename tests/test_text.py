"""TextDataModule: exact token counts from local files, seeded windows, disjoint train / val / test splits
and probe windows outside them, bad input, and DDP sharding of text and task DataModules (two processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bpe_double import gpt2_style_tokenizer, save_gpt2_style_tokenizer

from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.datamodules.text import TextDataModule


@pytest.fixture(scope="module")
def tok():
    return gpt2_style_tokenizer()


@pytest.fixture
def ascii_text(tmp_path) -> Path:
    """A plain-ASCII file of numbered sentences (every window decodes to an exact substring)."""
    path = tmp_path / "story.txt"
    path.write_text("".join(f"Line {i}: the {i % 7}th cat sat on mat number {i * 13 % 101}.\n" for i in range(400)))
    return path


def _all_tokens(dm, split: str = "test") -> list[torch.Tensor]:
    rows = []
    loader = dm.train_dataloader() if split == "train" else getattr(dm, f"{split}_dataloader")()
    for batch in sorted(loader, key=lambda b: int(b["index"][0])):
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            rows.append(ids[mask.bool()])
    return rows


@pytest.mark.parametrize("n_tokens,seq_len", [(1000, 64), (1024, 64), (37, 50)])
def test_local_file_yields_exactly_n_tokens_of_real_text(tok, ascii_text, n_tokens, seq_len):
    dm = TextDataModule(tok, path=str(ascii_text), seq_len=seq_len, n_tokens=0, test_tokens=n_tokens, batch_size=5)
    rows = _all_tokens(dm)
    assert sum(r.numel() for r in rows) == n_tokens
    assert all(r.numel() == seq_len for r in rows[:-1]) and rows[-1].numel() == n_tokens - seq_len * (len(rows) - 1)
    text = ascii_text.read_text()
    for r in rows:  # every window is a contiguous piece of the file (independent: the raw text)
        assert tok.decode(r.tolist()) in text
    starts = [text.index(tok.decode(r.tolist())) for r in rows]
    assert starts == sorted(starts)  # windows keep text order


def test_wikitext_file_and_seeding(tok, wikitext_valid):
    a = TextDataModule(tok, path=wikitext_valid, seq_len=128, n_tokens=0, test_tokens=2048, seed=0)
    b = TextDataModule(tok, path=wikitext_valid, seq_len=128, n_tokens=0, test_tokens=2048, seed=0)
    c = TextDataModule(tok, path=wikitext_valid, seq_len=128, n_tokens=0, test_tokens=2048, seed=1)
    ra, rb, rc = _all_tokens(a), _all_tokens(b), _all_tokens(c)
    assert sum(r.numel() for r in ra) == 2048 and len(ra) == 16
    assert all(torch.equal(x, y) for x, y in zip(ra, rb))
    assert not all(torch.equal(x, y) for x, y in zip(ra, rc))
    assert a.available_tokens > 100_000


def test_folder_reads_every_txt_file(tok, tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta gamma delta " * 50)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("one two three four " * 50)
    (tmp_path / "skip.md").write_text("ignored " * 500)
    dm = TextDataModule(tok, path=str(tmp_path), seq_len=8, n_tokens=0, test_tokens=400)
    text = "".join(tok.decode(r.tolist()) for r in _all_tokens(dm))
    assert "alpha" in text and "three" in text and "ignored" not in text
    expected = len(tok.encode("alpha beta gamma delta " * 50)) + len(tok.encode("one two three four " * 50))
    assert dm.available_tokens == expected


def test_bad_text_inputs_fail_with_one_line(tok, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    (tmp_path / "nothing").mkdir()
    cases = [
        (dict(path=str(tmp_path / "missing.txt")), r"path='.*missing.txt' does not exist"),
        (dict(path=str(empty)), r"path='.*empty.txt' holds no text"),
        (dict(path=str(tmp_path / "nothing")), r"holds no .txt file with text"),
        (dict(path=str(empty), seq_len=0), r"seq_len=0 is invalid"),
        (dict(dataset="wikitext"), r"could not stream dataset='wikitext'.*pass path=<local text file or folder>"),
    ]
    small = tmp_path / "small.txt"
    small.write_text("a few words only\n")
    cases.append((dict(path=str(small), seq_len=4, n_tokens=100), r"\(train 100\) need 25 windows of seq_len=4"))
    cases.append((dict(path=str(small), n_tokens=-1), r"n_tokens=-1 is invalid"))
    cases.append((dict(path=str(small), n_tokens=0), r"all 0"))
    env = os.environ.get("HF_DATASETS_OFFLINE")
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # the hub is unreachable here anyway; make it fail fast
    try:
        for kwargs, pattern in cases:
            with pytest.raises(ValueError, match=pattern) as err:
                TextDataModule(tok, **kwargs)
            assert "\n" not in str(err.value)
    finally:
        if env is None:
            os.environ.pop("HF_DATASETS_OFFLINE")
        else:
            os.environ["HF_DATASETS_OFFLINE"] = env


def test_splits_are_disjoint_and_probes_lie_outside_them(tok, tmp_path):
    """Every window of the train, val and test splits and of the probe is a distinct window of the text (by
    its position in the token stream, an independent recount), each split holds exactly its tokens, the test
    split of a test-only module is the one a module with train and val splits has, and an empty test split
    fails when a test run asks for it."""
    g = torch.Generator().manual_seed(0)  # random letters: no two windows of the stream are equal
    letters = torch.randint(0, 26, (6000,), generator=g).tolist()
    words = " ".join("".join(chr(97 + c) for c in letters[i : i + 5]) for i in range(0, len(letters), 5))
    (tmp_path / "random.txt").write_text(words)
    kw = dict(path=str(tmp_path / "random.txt"), seq_len=16, seed=3, batch_size=4)
    dm = TextDataModule(tok, n_tokens=16 * 20, val_tokens=16 * 6, test_tokens=16 * 5, **kw)
    ids = dm.ids
    starts = {}
    for split in ("train", "val", "test"):
        rows = _all_tokens(dm, split)
        assert sum(r.numel() for r in rows) == dm.tokens[split]
        starts[split] = set()
        for r in rows:  # the window's start: where its tokens sit in the stream (a multiple of seq_len)
            (hits,) = [s for s in range(0, ids.numel() - r.numel() + 1, 16) if torch.equal(ids[s : s + r.numel()], r)]
            starts[split].add(hits)
        assert len(starts[split]) == len(rows)
    probe, mask = dm.probe(7)
    assert probe.shape == mask.shape == (7, 16) and bool(mask.all())
    starts["probe"] = {s for p in probe for s in range(0, ids.numel(), 16) if torch.equal(ids[s : s + 16], p)}
    assert len(starts["probe"]) == 7
    names = list(starts)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not starts[a] & starts[b], (a, b)
    alone = TextDataModule(tok, n_tokens=0, test_tokens=16 * 5, **kw)  # the test split is dealt first
    assert all(torch.equal(x, y) for x, y in zip(_all_tokens(alone), _all_tokens(dm)))
    with pytest.raises(ValueError, match="test_tokens=0: the test split is empty"):
        TextDataModule(tok, n_tokens=64, **kw).test_dataloader()
    with pytest.raises(ValueError, match=r"with 1000 probe windows"):
        dm.probe(1000)


@pytest.mark.slow
def test_ddp_sharding_without_overlap(tmp_path, ascii_text, tok):
    """Two CPU DDP processes: each text window and each IOI test prompt is read by exactly one rank,
    and the synced logit difference equals the single-process mean over all prompts."""
    tok_dir = save_gpt2_style_tokenizer(str(tmp_path / "tok"))
    script = Path(__file__).with_name("ddp_data_script.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), tok_dir, str(ascii_text)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name, total in (("text", 11), ("ioi", 23)):
        seen = [json.loads((tmp_path / f"{name}_rank{r}.json").read_text()) for r in (0, 1)]
        assert seen[0] and seen[1] and not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(total))
    # independent single-process reference for the synced metric
    dm = TaskDataModule("ioi", tok, n_train=4, n_val=4, n_test=23)
    table = torch.linspace(-3, 3, len(tok))
    ref = sum(float(table[e.correct_id] - table[e.wrong_id]) for e in dm.splits["test"].examples) / 23
    assert abs(json.loads((tmp_path / "ioi_metric.json").read_text()) - ref) < 1e-5
