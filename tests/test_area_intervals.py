"""Bootstrap intervals of CPR / CMD (lit_svd.analysis.area_intervals) against independent computations: the
point estimate of ``faithfulness.faithfulness_of`` when every prompt is drawn once, resamples drawn as explicit
prompt lists, and nulls that must (and must not) resolve a difference."""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.area_intervals import area_intervals, area_samples, f_samples, resample_weights
from lit_svd.analysis.faithfulness import MIB_SIZES, faithfulness_of

S, P = len(MIB_SIZES), 64


def curve(seed: int, shift: float = 0.0, noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A curve's per-prompt metric ``[S, P]`` rising from the corrupted to the clean metric with the size, prompt
    noise, and its ends ``[P]``; ``shift`` moves every size's metric by that fraction of the mean gap."""
    g = torch.Generator().manual_seed(seed)
    full = 4 + torch.randn(P, generator=g, dtype=torch.float64)
    empty = 0.5 + 0.5 * torch.randn(P, generator=g, dtype=torch.float64)
    frac = torch.tensor(MIB_SIZES, dtype=torch.float64).sqrt()[:, None]
    metric = empty + frac * (full - empty) + noise * torch.randn(S, P, generator=g, dtype=torch.float64)
    return metric + shift * float((full - empty).mean()), full, empty


def test_every_prompt_once_gives_the_point_estimate():
    metric, full, empty = curve(0)
    _, cpr, cmd = faithfulness_of(MIB_SIZES, metric.mean(1).tolist(), float(full.mean()), float(empty.mean()))
    once = torch.full((1, P), 1.0 / P, dtype=torch.float64)
    got_cpr, got_cmd = area_samples(MIB_SIZES, f_samples(metric, full, empty, once))
    assert float(got_cpr[0]) == pytest.approx(cpr, abs=1e-12) and float(got_cmd[0]) == pytest.approx(cmd, abs=1e-12)


def test_resamples_equal_the_curves_of_the_drawn_prompts():
    """Each resample's areas equal ``faithfulness_of`` on the prompts it draws (with repeats), listed one by one."""
    metric, full, empty = curve(1)
    weights = resample_weights(P, 5, seed=3)
    f = f_samples(metric, full, empty, weights)
    cpr, cmd = area_samples(MIB_SIZES, f)
    assert torch.allclose(weights.sum(1), torch.ones(5, dtype=torch.float64))
    for r in range(5):
        drawn = torch.repeat_interleave(torch.arange(P), (weights[r] * P).round().long())
        assert len(drawn) == P
        want_f, want_cpr, want_cmd = faithfulness_of(
            MIB_SIZES, metric[:, drawn].mean(1).tolist(), float(full[drawn].mean()), float(empty[drawn].mean())
        )
        assert f[:, r].tolist() == pytest.approx(want_f, abs=1e-12)
        assert float(cpr[r]) == pytest.approx(want_cpr, abs=1e-12)
        assert float(cmd[r]) == pytest.approx(want_cmd, abs=1e-12)


def test_intervals_hold_the_estimate_and_a_curve_against_itself_is_zero():
    metric, full, empty = curve(2)
    _, cpr, cmd = faithfulness_of(MIB_SIZES, metric.mean(1).tolist(), float(full.mean()), float(empty.mean()))
    out = area_intervals(MIB_SIZES, {"a": metric, "b": metric.clone()}, full, empty, [("a", "b")])
    lo, hi = out["curves"]["a"]["cpr"]
    assert lo < cpr < hi and hi - lo > 0.01  # prompt noise gives the interval a width
    assert out["curves"]["a"]["cmd"][0] < cmd < out["curves"]["a"]["cmd"][1]
    f_lo, f_hi = out["curves"]["a"]["f"]
    point = ((metric.mean(1) - empty.mean()) / (full.mean() - empty.mean())).tolist()
    assert all(lo < v < hi for lo, v, hi in zip(f_lo, point, f_hi))
    assert out["pairs"]["a - b"] == {"cpr": [0.0, 0.0], "cmd": [0.0, 0.0]}


def test_paired_difference_resolves_a_shift_and_not_a_null():
    """Two curves of the same expected metric on the same prompts (the second with noise of its own): the difference's
    interval holds 0 in most of 40 draws (a 95 % interval: at least 34, allowing for chance); shifted by 0.1 of the
    gap at every size, it excludes 0 in every draw: the test can fail both ways."""
    holds, excludes = 0, 0
    for seed in range(40):
        a, full, empty = curve(100 + seed)
        g = torch.Generator().manual_seed(200 + seed)
        b = a + torch.randn(S, P, generator=g, dtype=torch.float64)  # the same expected metric, more noise
        shifted = b + 0.1 * float((full - empty).mean())
        out = area_intervals(MIB_SIZES, {"a": a, "b": b, "s": shifted}, full, empty, [("a", "b"), ("s", "a")],
                             n_resamples=500, seed=seed)  # fmt: skip
        lo, hi = out["pairs"]["a - b"]["cpr"]
        holds += lo <= 0 <= hi
        lo, hi = out["pairs"]["s - a"]["cpr"]
        excludes += lo > 0
    assert holds >= 34 and excludes == 40


def test_errors_name_the_problem():
    metric, full, empty = curve(4)
    with pytest.raises(ValueError, match="curve 'a'.*shape"):
        area_intervals(MIB_SIZES, {"a": metric[:, :10]}, full, empty)
    with pytest.raises(ValueError, match="no per-prompt metric for \\['c'\\]"):
        area_intervals(MIB_SIZES, {"a": metric}, full, empty, [("a", "c")])
    with pytest.raises(ValueError, match="at least 2 prompts"):
        resample_weights(1)
