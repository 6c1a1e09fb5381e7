"""Task DataModules: template invariants per template and tokenizer, single-token filtering, seeded
disjoint splits, batch format, bad input, and the real SmolLM2 forward through the metrics."""

from __future__ import annotations

import pytest
import torch
from bpe_double import gpt2_style_tokenizer

from lit_svd.datamodules import task_words as words
from lit_svd.datamodules.tasks import TaskDataModule, make_task, single_token_words


@pytest.fixture(scope="module")
def bpe2():
    """GPT-2-style byte-level BPE with two-digit number tokens (test double for GPT-2's tokenizer)."""
    return gpt2_style_tokenizer()


@pytest.fixture(params=["bpe2", pytest.param("smollm2", marks=pytest.mark.slow)])
def tokenizer(request):
    if request.param == "bpe2":
        return request.getfixturevalue("bpe2")
    return request.getfixturevalue("smollm2_tokenizer")


def _points_of_template(task, template: int, count: int):
    """``count`` points of the task's space whose template slot is ``template``."""
    rest = task.space_size // task.radices[0]
    step = max(1, rest // count)
    return [template * rest + (k * step + 7 * k) % rest for k in range(count)]


def _text(tok, ids):
    return tok.decode(ids)


@pytest.mark.parametrize("task_name", ["ioi", "gp", "gt"])
def test_every_template_keeps_token_length_and_structure(task_name, tokenizer):
    """For every template: clean and corrupted prompts have the same token count, decode back to
    the rendered strings, and the answers are what the task's structure says they are."""
    import random

    task = make_task(task_name, tokenizer)
    for t in range(len(task.templates)):
        for point in _points_of_template(task, t, 6):
            prompt = task.prompt(point, random.Random(point))
            enc = task.encode(prompt, 0, [])
            assert len(enc.clean_ids) == len(enc.corrupt_ids), prompt
            assert _text(tokenizer, enc.clean_ids) == prompt.clean
            assert _text(tokenizer, enc.corrupt_ids) == prompt.corrupt
            if task_name == "ioi":
                io, s = prompt.correct.strip(), prompt.wrong.strip()
                said = prompt.clean.replace(",", " ").replace(".", " ").split()
                assert said.count(io) == 1 and said.count(s) == 2, prompt.clean  # IO once, S twice
                fresh = prompt.corrupt.replace(",", " ").replace(".", " ").split()
                assert io not in fresh and s not in fresh  # ABC: three fresh names
                assert len({w for w in fresh if w in task.names}) == 3
            elif task_name == "gp":
                name = [
                    w
                    for w in prompt.clean.replace(",", " ").replace(".", " ").split()
                    if w in words.MALE_NAMES + words.FEMALE_NAMES
                ]
                assert len(name) == 1
                assert prompt.correct == (" he" if name[0] in words.MALE_NAMES else " she")
            else:
                assert f"{prompt.century}{prompt.start_year:02d}" in prompt.clean
                assert f"{prompt.century}01" in prompt.corrupt and prompt.clean.endswith(str(prompt.century))
            if prompt.correct is not None:
                assert _text(tokenizer, [enc.correct_id]) == prompt.correct
                assert _text(tokenizer, [enc.wrong_id]) == prompt.wrong


def test_ioi_has_both_orders_and_enough_templates_and_names(bpe2):
    task = make_task("ioi", bpe2)
    assert len(task.templates) >= 15 and len(task.names) >= 50
    import random

    orders = set()
    for point in range(0, task.space_size, task.space_size // 40):
        p = task.prompt(point, random.Random(0))
        first = p.clean.split(" and ")[0].split()[-1]
        orders.add("ABBA" if " " + first == p.correct else "BABA")
    assert orders == {"ABBA", "BABA"}


@pytest.mark.slow
def test_single_token_filtering_on_smollm2(smollm2_tokenizer):
    tok = smollm2_tokenizer
    kept = single_token_words(tok, words.MALE_NAMES + words.FEMALE_NAMES)
    dropped = set(words.MALE_NAMES + words.FEMALE_NAMES) - set(kept)
    assert {"Zachary", "Cynthia"} <= dropped  # known multi-token names in SmolLM2's vocabulary
    for name in kept:
        ids = tok.encode(" " + name, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids)[0] == "Ġ" + name
    for name in dropped:
        assert len(tok.encode(" " + name, add_special_tokens=False)) > 1
    assert make_task("ioi", tok).names == kept


def test_too_few_single_token_words_fails_with_one_line():
    tiny = gpt2_style_tokenizer(vocab_size=300)  # bytes only: no name is one token
    with pytest.raises(ValueError, match=r"task ioi: only 0 names are single tokens") as err:
        TaskDataModule("ioi", tiny, n_train=1, n_val=1, n_test=1)
    assert "\n" not in str(err.value)


def test_splits_are_seeded_reproducible_and_disjoint(bpe2):
    kwargs = dict(n_train=60, n_val=20, n_test=20, batch_size=16)
    for task in ("ioi", "gp", "gt"):
        a, b = TaskDataModule(task, bpe2, seed=3, **kwargs), TaskDataModule(task, bpe2, seed=3, **kwargs)
        other = TaskDataModule(task, bpe2, seed=4, **kwargs)
        texts = {}
        for split in ("train", "val", "test"):
            ea, eb = a.splits[split].examples, b.splits[split].examples
            assert [e.clean_ids for e in ea] == [e.clean_ids for e in eb]
            assert [e.corrupt_ids for e in ea] == [e.corrupt_ids for e in eb]
            texts[split] = {tuple(e.clean_ids) for e in ea}
            assert len(texts[split]) == len(ea)  # distinct within a split
        assert not (texts["train"] & texts["val"]) and not (texts["train"] & texts["test"])
        assert not (texts["val"] & texts["test"])
        assert [e.clean_ids for e in other.splits["test"].examples] != [e.clean_ids for e in a.splits["test"].examples]
        bigger = TaskDataModule(task, bpe2, seed=3, n_train=90, n_val=20, n_test=20)
        assert [e.clean_ids for e in bigger.splits["test"].examples] == [e.clean_ids for e in a.splits["test"].examples]


def test_batch_format_right_padding(bpe2):
    dm = TaskDataModule("ioi", bpe2, n_train=8, n_val=8, n_test=40, batch_size=40)
    batch = next(iter(dm.test_dataloader()))
    pad = bpe2.pad_token_id
    for i, e in enumerate(dm.splits["test"].examples):
        n = len(e.clean_ids)
        assert batch["clean_ids"][i, :n].tolist() == e.clean_ids and (batch["clean_ids"][i, n:] == pad).all()
        assert batch["corrupt_ids"][i, :n].tolist() == e.corrupt_ids
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (batch["clean_ids"].shape[1] - n)
        assert batch["answer_pos"][i] == n - 1 and batch["index"][i] == i
        assert batch["correct_id"][i] == e.correct_id and batch["wrong_id"][i] == e.wrong_id
    lengths = {len(e.clean_ids) for e in dm.splits["test"].examples}
    assert len(lengths) > 1  # padding really happened
    train = next(iter(dm.train_dataloader()))
    assert set(train) == set(batch)


def test_gt_two_digit_answers(bpe2):
    dm = TaskDataModule("gt", bpe2, n_train=0, n_val=0, n_test=30, batch_size=30)
    assert dm.task.mode == "two_digit"
    batch = next(iter(dm.test_dataloader()))
    assert batch["greater_mask"].shape == (30, len(bpe2))
    for i in range(30):
        xx = int(batch["start_year"][i])
        greater = [int(bpe2.decode([t])) for t in batch["greater_mask"][i].nonzero()[:, 0].tolist()]
        lesser = [int(bpe2.decode([t])) for t in batch["lesser_mask"][i].nonzero()[:, 0].tolist()]
        assert sorted(greater) == list(range(xx + 1, 100)) and sorted(lesser) == list(range(0, xx + 1))


@pytest.mark.slow
def test_gt_single_digit_answers_smollm2(smollm2_tokenizer):
    tok = smollm2_tokenizer
    dm = TaskDataModule("gt", tok, n_train=0, n_val=0, n_test=40, batch_size=40)
    assert dm.task.mode == "single_digit"
    batch = next(iter(dm.test_dataloader()))
    for i in range(40):
        xx = int(batch["start_year"][i])
        greater = sorted(int(tok.decode([t])) for t in batch["greater_mask"][i].nonzero()[:, 0].tolist())
        lesser = sorted(int(tok.decode([t])) for t in batch["lesser_mask"][i].nonzero()[:, 0].tolist())
        assert greater == [d for d in range(10) if 10 * d > xx]
        assert lesser == [d for d in range(10) if 10 * d + 9 <= xx]


def test_bad_inputs_fail_with_one_line(bpe2):
    cases = [
        (dict(task="ioii"), r"task='ioii' is unknown; choose one of ioi, gp, gt"),
        (dict(task="gp", n_train=10**6), r"exceeds the \d+ distinct gp prompts"),
        (dict(task="ioi", n_test=-1), r"n_test=-1 is invalid"),
        (dict(task="ioi", batch_size=0), r"batch_size=0 is invalid"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as err:
            TaskDataModule(tokenizer=bpe2, **kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="task='nope' is unknown"):  # before any tokenizer is loaded
        TaskDataModule("nope", tokenizer="/no/such/tokenizer")
    with pytest.raises(ValueError, match="prepend_bos=True but the tokenizer has no BOS"):
        no_bos = gpt2_style_tokenizer()
        saved, no_bos.bos_token = no_bos.bos_token, None
        try:
            TaskDataModule("gp", no_bos, n_train=1, n_val=1, n_test=1, prepend_bos=True)
        finally:
            no_bos.bos_token = saved


def test_prepend_bos(bpe2):
    dm = TaskDataModule("gp", bpe2, n_train=0, n_val=0, n_test=4, prepend_bos=True)
    plain = TaskDataModule("gp", bpe2, n_train=0, n_val=0, n_test=4)
    for e, p in zip(dm.splits["test"].examples, plain.splits["test"].examples):
        assert e.clean_ids == [bpe2.bos_token_id] + p.clean_ids
        assert e.corrupt_ids == [bpe2.bos_token_id] + p.corrupt_ids


@pytest.mark.slow
def test_smollm2_ioi_metrics_match_unpadded_hf_forward(smollm2):
    """The DataModule + metrics path (right-padded batches) equals one unpadded HF forward per prompt,
    and SmolLM2 solves IOI on these prompts (the 256-prompt figure is in docs/data.md)."""
    from lit_svd.metrics import evaluate_task

    model, tok = smollm2
    dm = TaskDataModule("ioi", tok, n_train=0, n_val=0, n_test=12, batch_size=12, seed=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several times faster on a shared, loaded machine; small cost on a free one
    try:
        per: dict = {}
        got = evaluate_task(model, dm.test_dataloader(), "ioi", progress=False, per_example=per)
        diffs, hits = [], []
        with torch.no_grad():
            for e in dm.splits["test"].examples:
                logits = model(input_ids=torch.tensor([e.clean_ids])).logits[0, -1]
                diffs.append(float(logits[e.correct_id] - logits[e.wrong_id]))
                hits.append(float(int(logits.argmax()) == e.correct_id))
    finally:
        torch.set_num_threads(threads)
    assert torch.allclose(torch.cat(per["clean"]), torch.tensor(diffs), atol=1e-3)  # padding does not leak
    assert abs(got["logit_diff"] - sum(diffs) / len(diffs)) < 1e-3
    assert abs(got["accuracy"] - sum(hits) / len(hits)) < 1e-6
    assert got["logit_diff"] > 2 and got["accuracy"] >= 0.75
    assert got["corrupt_accuracy"] < 0.2 and abs(got["corrupt_logit_diff"]) < 1.5


def test_order_seed_changes_only_the_training_order(bpe2):
    """The training seed reorders the training prompts and leaves every split as it was; the default is
    the split seed's order (what runs used before the option), drawn as a seeded shuffled loader does."""
    kwargs = dict(n_train=40, n_val=8, n_test=8, batch_size=8, seed=3)
    base, same = TaskDataModule("ioi", bpe2, **kwargs), TaskDataModule("ioi", bpe2, order_seed=3, **kwargs)
    other = TaskDataModule("ioi", bpe2, order_seed=4, **kwargs)

    def order(dm):
        return torch.cat([b["index"] for b in dm.train_dataloader()]).tolist()

    for split in ("train", "val", "test"):
        assert [e.clean_ids for e in other.splits[split].examples] == [e.clean_ids for e in base.splits[split].examples]
    # independent: DataLoader(shuffle=True) with a generator seeded by the split seed, first epoch
    loader = torch.utils.data.DataLoader(
        range(40), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    assert order(base) == torch.cat(list(loader)).tolist() == order(same)
    assert order(other) != order(base) and sorted(order(other)) == list(range(40))
