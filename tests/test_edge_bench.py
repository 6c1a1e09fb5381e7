"""bench/edge_bench.py's ``--scores``: an attribution kept in a folder (score and gain files, head-level scores and a
description) is read back by a later run with the same options, equal to the scores attributed in memory (the files
hold float32: equal to the in-memory float64 scores rounded to float32); other options exit with one line naming
what differs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_svd.analysis.edge_attribution import attribute
from lit_svd.analysis.edge_curves import ScoreFile
from lit_svd.analysis.edges import EdgeUniverse
from lit_svd.models import view as make_view
from tests.bench_script import load_bench
from tests.planted import planted_batch, planted_model


@pytest.fixture(scope="module")
def bench():
    return load_bench("edge_bench")


def test_scores_are_kept_and_read_back(bench, tmp_path):
    model, _, _ = planted_model()
    universe = EdgeUniverse(make_view(model))
    batches = [planted_batch(8, seed=0)]
    args = SimpleNamespace(model="planted", task="ioi", config=None, n_train=8, n_test=8, steps=3)
    folder = str(tmp_path / "scores")
    meta = bench.score_meta(args, universe, batches)
    assert bench.saved_meta(folder, meta) is None  # nothing saved yet: attribute
    want_gains: dict = {}
    want = attribute(universe, batches, "ioi", steps=3, gains=want_gains)  # in memory, float64
    store, gains = ScoreFile(universe, folder, keep=True), ScoreFile(universe, folder, "gains", keep=True)
    scores = attribute(universe, batches, "ioi", steps=3, store=store, gains=gains)
    bench.save_scores(folder, meta, scores, store, gains)
    store.close()
    gains.close()
    assert (Path(folder) / "scores.f32").exists()  # kept
    saved = bench.saved_meta(folder, meta)
    store, gains = ScoreFile(universe, folder, keep=True), ScoreFile(universe, folder, "gains", keep=True)
    back = bench.load_scores(folder, saved, universe, store, gains)
    assert back.prompts == want.prompts and back.steps == 3
    assert torch.equal(back.units, want.units)
    for r in universe.readers:
        assert torch.equal(back.directions(r), want.directions(r).float()), r
    assert set(gains) == set(want_gains)
    for i, g in want_gains.items():
        assert torch.equal(gains[i], g.float())
    for key, value in (("steps", 5), ("task", "gt"), ("n_train", 16)):
        other = bench.score_meta(SimpleNamespace(**{**vars(args), key: value}), universe, batches)
        with pytest.raises(SystemExit, match=f"saved for {key}="):
            bench.saved_meta(folder, other)
    other = bench.score_meta(args, universe, [planted_batch(8, seed=1)])  # as many prompts, other ones
    with pytest.raises(SystemExit, match="saved for train_digest="):
        bench.saved_meta(folder, other)


def test_a_longer_test_split_drawn_last_keeps_the_training_prompts_digest(bench, tokenizer):
    """``test_last``: the training batches (and so the saved scores) do not change with ``n_test``, and the first
    test prompts stay; drawn first, a longer test split changes the training prompts and their digest."""
    from lit_svd.datamodules.tasks import TaskDataModule

    def split(n_test, test_last):
        dm = TaskDataModule("ioi", tokenizer, n_train=16, n_val=4, n_test=n_test, test_last=test_last, seed=0)
        train = [dm.collate(dm.splits["train"].examples[i : i + 8]) for i in (0, 8)]
        return bench.batches_digest(train), [e.clean_ids for e in dm.splits["test"].examples]

    (short, short_test), (long, long_test) = split(8, True), split(32, True)
    assert short == long and long_test[:8] == short_test and len(long_test) == 32
    assert split(8, False)[0] != split(32, False)[0]


@pytest.mark.parametrize("task", ["ioi", "gp", "gt"])
def test_the_label_swapped_null_negates_every_other_prompt(bench, tokenizer, task):
    """``--prune-swap``'s batch: on every other prompt the task's metric of any logits is the negative of the
    original batch's (the answers swapped), on the rest the same; the prompts themselves unchanged."""
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import task_scorer

    dm = TaskDataModule(task=task, tokenizer=tokenizer, n_train=8, n_val=2, n_test=2, batch_size=8, seed=0)
    batch = dm.collate(dm.splits["train"].examples[:8])
    swapped = bench.swapped_answers(batch)
    logits = torch.randn(8, len(tokenizer), generator=torch.Generator().manual_seed(0))
    scorer = task_scorer(task)
    m, s = scorer.metric(logits, batch), scorer.metric(logits, swapped)
    odd = torch.arange(8) % 2 == 1
    assert torch.allclose(s[odd], -m[odd], atol=1e-6) and torch.equal(s[~odd], m[~odd])
    assert bool((m[odd] != 0).all()) and torch.equal(swapped["clean_ids"], batch["clean_ids"])
