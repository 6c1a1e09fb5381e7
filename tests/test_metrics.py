"""Task metrics against brute-force loops over examples and hand-made distributions."""

from __future__ import annotations

import math

import pytest
import torch

from lit_svd.metrics import (
    AnswerAccuracy,
    AnswerKL,
    GreaterThanProbDiff,
    LogitDifference,
    answer_logits,
    gt_prob_diff,
    task_scorer,
)

TOL = 1e-5


def _batch(n=12, vocab=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 3
    correct = torch.randint(0, vocab, (n,), generator=g)
    wrong = (correct + 1 + torch.randint(0, vocab - 1, (n,), generator=g)) % vocab
    return logits, dict(correct_id=correct, wrong_id=wrong)


def test_logit_diff_and_accuracy_match_loops():
    logits, batch = _batch()
    for i in range(4):  # a few clear winners, so that accuracy is neither 0 nor 1
        logits[i, batch["correct_id"][i]] = 100.0
    diffs, hits = [], []
    for i in range(logits.shape[0]):
        row = logits[i].tolist()
        diffs.append(row[batch["correct_id"][i]] - row[batch["wrong_id"][i]])
        hits.append(float(max(range(len(row)), key=row.__getitem__) == batch["correct_id"][i]))
    ld, acc = LogitDifference(), AnswerAccuracy()
    for part in (slice(0, 5), slice(5, 12)):  # two updates: the mean is over all examples
        sub = {k: v[part] for k, v in batch.items()}
        ld.update(logits[part], sub)
        acc.update(logits[part], sub)
    assert abs(float(ld.compute()) - sum(diffs) / len(diffs)) < TOL
    assert abs(float(acc.compute()) - sum(hits) / len(hits)) < TOL
    assert 0 < float(acc.compute()) < 1


def test_kl_matches_scipy():
    from scipy.special import rel_entr, softmax

    logits, _ = _batch(seed=1)
    reference, _ = _batch(seed=2)
    p, q = softmax(reference.double().numpy(), axis=-1), softmax(logits.double().numpy(), axis=-1)
    expected = rel_entr(p, q).sum(-1).mean()
    kl = AnswerKL()
    kl.update(logits, reference)
    assert abs(float(kl.compute()) - expected) < 1e-4
    same = AnswerKL()
    same.update(logits, logits)
    assert abs(float(same.compute())) < 1e-6


def _years_two_digit(start: int, probs: dict[int, float]) -> float:
    """Brute force: mass on end years above ``start`` minus mass at or below, one token per year."""
    return sum(p for y, p in probs.items() if y > start) - sum(p for y, p in probs.items() if y <= start)


def _years_single_digit(start: int, digit_probs: dict[int, float]) -> float:
    """Brute force for digit tokens: a digit is 'greater' when ALL ten years it begins are above
    ``start``, 'lesser' when all ten are at or below, else neither (enumerating the years)."""
    total = 0.0
    for d, p in digit_probs.items():
        years = [10 * d + u for u in range(10)]
        if all(y > start for y in years):
            total += p
        elif all(y <= start for y in years):
            total -= p
    return total


@pytest.mark.parametrize("mode", ["two_digit", "single_digit"])
def test_gt_prob_diff_matches_brute_force_on_hand_made_distribution(mode):
    from lit_svd.datamodules.tasks import GreaterThanTask

    n_values = 100 if mode == "two_digit" else 10
    vocab = n_values + 7  # 7 non-number tokens take mass too
    token_of = {v: 3 + v for v in range(n_values)}  # value -> token id (offset so ids != values)
    # a hand-made distribution: mass rising with the value, some on non-number tokens
    weights = torch.tensor([0.5] * 3 + [1.0 + v for v in range(n_values)] + [2.0] * 4, dtype=torch.float64)
    probs = weights / weights.sum()
    logits = probs.log().float()[None].repeat(4, 1)
    starts = [2, 39, 45, 98]

    class Stub(GreaterThanTask):  # reuse only the answer-set rule, with a hand-made token table
        def __init__(self):
            self.mode, self.answer_ids = mode, {17: token_of}

    greater = torch.zeros(4, vocab, dtype=torch.bool)
    lesser = torch.zeros(4, vocab, dtype=torch.bool)
    for row, start in enumerate(starts):
        g, l = Stub().answer_sets(17, start)
        greater[row, g], lesser[row, l] = True, True
    got = gt_prob_diff(logits, greater, lesser)
    value_probs = {v: float(probs[t]) for v, t in token_of.items()}
    brute = _years_two_digit if mode == "two_digit" else _years_single_digit
    for row, start in enumerate(starts):
        assert abs(float(got[row]) - brute(start, value_probs)) < TOL, (mode, start)
    metric = GreaterThanProbDiff()
    metric.update(logits, dict(greater_mask=greater, lesser_mask=lesser))
    assert abs(float(metric.compute()) - sum(brute(s, value_probs) for s in starts) / 4) < TOL


def test_gt_mask_narrower_than_logits():
    """A model vocabulary larger than the tokenizer's: extra logits take mass but count in no set."""
    logits = torch.zeros(1, 6)  # uniform over 6
    greater = torch.tensor([[True, True, False, False]])
    lesser = torch.tensor([[False, False, True, False]])
    assert abs(float(gt_prob_diff(logits, greater, lesser)[0]) - (2 / 6 - 1 / 6)) < TOL


def test_answer_logits_gathers_the_answer_position():
    logits = torch.randn(3, 5, 7)
    pos = torch.tensor([4, 0, 2])
    got = answer_logits(logits, pos)
    for i in range(3):
        assert torch.equal(got[i], logits[i, pos[i]])


def test_collection_and_bad_input():
    logits, batch = _batch()
    coll = task_scorer("ioi").metrics(with_kl=True)
    coll.update(logits=logits, batch=batch, reference=logits)
    out = coll.compute()
    assert set(out) == {"logit_diff", "accuracy", "kl"} and abs(float(out["kl"])) < 1e-6
    assert set(task_scorer("greater_than").metrics().keys()) == {"prob_diff"}
    with pytest.raises(ValueError, match="task='nope' is unknown"):
        task_scorer("nope")
    with pytest.raises(ValueError, match="before any update"):
        LogitDifference().compute()
    bad = logits.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        LogitDifference().update(bad, {**batch, "correct_id": torch.zeros_like(batch["correct_id"])})


def test_forward_answer_logits_equals_full_forward(tiny_model):
    """Projecting only the answer positions gives the full forward's logits there, for every
    architecture (Gemma-2's final soft-capping included), with right padding."""
    from lit_svd.metrics import forward_answer_logits

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tiny_model.config.vocab_size, (5, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:], mask[3, 4:] = 0, 0
    pos = mask.sum(1) - 1
    with torch.no_grad():
        full = answer_logits(tiny_model(input_ids=ids, attention_mask=mask).logits, pos)
        fast = forward_answer_logits(tiny_model, ids, mask, pos)
    assert torch.allclose(full, fast, atol=1e-5)


def _gt_batch(n=6, vocab=30, seed=1):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 2
    greater = torch.rand(n, vocab - 4, generator=g) < 0.3  # narrower than the logits, as tokenizer < model
    lesser = ~greater & (torch.rand(n, vocab - 4, generator=g) < 0.5)
    return logits, dict(greater_mask=greater, lesser_mask=lesser)


@pytest.mark.parametrize("task", ["ioi", "gp", "gt"])
def test_task_scorer_against_direct_computation(task):
    """Metric, correct, agreement and KL against hand-written formulas; ``column_metric`` on the metric's
    columns equals the metric on all logits; ``logit_weights`` against central finite differences of the metric
    (exact one-hot pairs for the linear logit difference)."""
    logits, batch = _gt_batch() if task == "gt" else _batch()
    ref = logits + 0.3 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(5))
    sc = task_scorer(task)
    got = sc.scores(logits, ref, batch)
    rows = torch.arange(len(logits))
    if task == "gt":
        p = logits.softmax(-1)[:, : batch["greater_mask"].shape[1]]
        want = (p * batch["greater_mask"]).sum(-1) - (p * batch["lesser_mask"]).sum(-1)
        assert torch.equal(got["correct"], (want > 0).float()) and sc.columns(batch) is None
        cols = logits
    else:
        want = logits[rows, batch["correct_id"]] - logits[rows, batch["wrong_id"]]
        assert torch.equal(got["correct"], (logits.argmax(-1) == batch["correct_id"]).float())
        cols = logits.gather(1, sc.columns(batch))
    assert (got["metric"] - want).abs().max() < 1e-6 and sc.metric_name in ("logit_diff", "prob_diff")
    assert torch.equal(got["agree"], (logits.argmax(-1) == ref.argmax(-1)).float())
    lp, lq = ref.log_softmax(-1), logits.log_softmax(-1)
    assert (got["kl"] - (lp.exp() * (lp - lq)).sum(-1)).abs().max() < 1e-6
    assert (sc.column_metric(cols[1:4], batch, rows[1:4]) - want[1:4]).abs().max() < 1e-6
    w = sc.logit_weights(logits.double(), batch)
    h, i, j = 1e-5, 2, 7
    bump = torch.zeros_like(logits, dtype=torch.float64)
    bump[i, j] = h
    fd = (sc.metric(logits.double() + bump, batch) - sc.metric(logits.double() - bump, batch))[i] / (2 * h)
    assert abs(float(w[i, j]) - float(fd)) < 1e-7
    if task != "gt":
        assert sc.linear and float(w[i, batch["correct_id"][i]]) == 1.0 and float(w.abs().sum()) == 2 * len(w)
