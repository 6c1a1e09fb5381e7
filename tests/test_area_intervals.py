"""Bootstrap intervals of CPR / CMD (lit_svd.analysis.area_intervals) against independent computations: the
statistic on explicit prompt lists against ``faithfulness.faithfulness_of`` on those prompts, nulls that must (and
must not) resolve a difference, and the coverage of a known population's CMD where the percentile interval leans."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_svd.analysis.area_intervals import area_intervals, area_samples, area_statistic
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


def point(metric: torch.Tensor, full: torch.Tensor, empty: torch.Tensor) -> tuple[list[float], float, float]:
    return faithfulness_of(MIB_SIZES, metric.mean(1).tolist(), float(full.mean()), float(empty.mean()))


def test_statistic_equals_the_curves_of_the_prompts_drawn():
    """On explicit prompt lists (every prompt once; draws with repeats; one prompt left out, as BCa's jackknife) each
    curve's areas and f, and a pair's differences, equal ``faithfulness_of`` on the prompts listed one by one."""
    (a, full, empty), (b, _, _) = curve(1), curve(5)
    names, statistic = area_statistic(MIB_SIZES, {"a": a, "b": b}, full, empty, [("a", "b")])
    g = np.random.default_rng(3)
    samples = [np.arange(P), g.integers(P, size=P), g.integers(P, size=P), np.delete(np.arange(P), 7)]
    for idx in samples:
        got = dict(zip(names, statistic(idx[None])[:, 0]))
        drawn = torch.as_tensor(idx)
        want = {c: point(m[:, drawn], full[drawn], empty[drawn]) for c, m in (("a", a), ("b", b))}
        for c, (f, cpr, cmd) in want.items():
            assert got[f"{c}/cpr"] == pytest.approx(cpr, abs=1e-12) and got[f"{c}/cmd"] == pytest.approx(cmd, abs=1e-12)
            assert [got[f"{c}/f{i}"] for i in range(S)] == pytest.approx(f, abs=1e-12)
        assert got["a - b/cpr"] == pytest.approx(want["a"][1] - want["b"][1], abs=1e-12)
        assert got["a - b/cmd"] == pytest.approx(want["a"][2] - want["b"][2], abs=1e-12)
    batch = np.stack(samples[:3])  # the vectorized form: samples along the leading axes
    assert statistic(batch).shape == (len(names), 3)
    assert np.allclose(statistic(batch)[:, 1], statistic(samples[1][None])[:, 0], rtol=0, atol=1e-12)


def test_intervals_hold_the_estimate_and_a_curve_against_itself_is_zero():
    metric, full, empty = curve(2)
    f, cpr, cmd = point(metric, full, empty)
    out = area_intervals(MIB_SIZES, {"a": metric, "b": metric.clone()}, full, empty, [("a", "b")])
    assert out["method"] == "BCa" and out["percentile_fallback"] == []
    lo, hi = out["curves"]["a"]["cpr"]
    assert lo < cpr < hi and hi - lo > 0.01  # prompt noise gives the interval a width
    assert out["curves"]["a"]["cmd"][0] < cmd < out["curves"]["a"]["cmd"][1]
    f_lo, f_hi = out["curves"]["a"]["f"]
    assert all(lo < v < hi for lo, v, hi in zip(f_lo, f, f_hi))
    assert out["pairs"]["a - b"] == {"cpr": [0.0, 0.0], "cmd": [0.0, 0.0]}  # no draw moves it


@pytest.mark.parametrize("method", ["BCa", "percentile"])
def test_paired_difference_resolves_a_shift_and_not_a_null(method):
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
                             n_resamples=500, seed=seed, method=method)  # fmt: skip
        lo, hi = out["pairs"]["a - b"]["cpr"]
        holds += lo <= 0 <= hi
        lo, hi = out["pairs"]["s - a"]["cpr"]
        excludes += lo > 0
    assert holds >= 34 and excludes == 40


def near_one(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A population whose ``f`` is within 0.03 of 1 from the 5 % size on (CMD small, its estimate biased up)."""
    g = torch.Generator().manual_seed(seed)
    full = 4 + torch.randn(n, generator=g, dtype=torch.float64)
    empty = 0.5 + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    frac = torch.tensor([0.5, 0.7, 0.85, 0.93, 0.97, 0.99, 1.0, 1.01, 1.005, 1.0], dtype=torch.float64)[:, None]
    return empty + frac * (full - empty) + 0.7 * torch.randn(S, n, generator=g, dtype=torch.float64), full, empty


def test_bca_covers_a_small_cmd_that_the_percentile_interval_misses():
    """40 samples of 64 prompts from ``near_one``: the population's CMD (from 200,000 prompts) lies inside the BCa
    interval in 19 and inside the percentile interval in none (the resamples' CMD lies above the sample's, which lies
    above the population's); CPR, without the lean, is covered by both about 95 % of the time."""
    _, cpr_true, cmd_true = point(*near_one(999, 200_000))
    covered = {"BCa": [0, 0], "percentile": [0, 0]}
    for seed in range(40):
        metric, full, empty = near_one(seed, P)
        for method, count in covered.items():
            out = area_intervals(MIB_SIZES, {"c": metric}, full, empty, method=method)["curves"]["c"]
            count[0] += out["cpr"][0] <= cpr_true <= out["cpr"][1]
            count[1] += out["cmd"][0] <= cmd_true <= out["cmd"][1]
    assert covered["BCa"][0] >= 34 and covered["percentile"][0] >= 34
    assert covered["percentile"][1] <= 4 and covered["BCa"][1] >= 12


def test_a_value_below_every_draw_falls_back_to_the_percentile_interval():
    """A curve whose f is 1 at every size in the sample but not in any resample: BCa is undefined for its CMD (the
    sample's 0 is below every draw), so that output gets the percentile interval and is named."""
    _, full, empty = curve(6)
    g = torch.Generator().manual_seed(0)
    exact = full + torch.randn(S, P, generator=g, dtype=torch.float64)
    exact = exact - (exact - full).mean(1, keepdim=True)  # each size's mean metric is the mean of full: f = 1
    out = area_intervals(MIB_SIZES, {"c": exact}, full, empty, n_resamples=300)
    assert out["percentile_fallback"] == ["c/cmd"]
    lo, hi = out["curves"]["c"]["cmd"]
    assert 0 < lo < hi
    _, _, cmd = point(exact, full, empty)
    assert cmd == pytest.approx(0, abs=1e-12)


def test_area_samples_are_numpys_trapezoids():
    """Each column's areas equal numpy's trapezoid rule over the grid's points (of ``f`` and of ``|1 - f|``)."""
    f = np.random.default_rng(7).normal(1, 0.8, (len(MIB_SIZES), 5))
    cpr, cmd = area_samples(MIB_SIZES, torch.tensor(f))
    for r in range(5):
        assert float(cpr[r]) == pytest.approx(np.trapezoid(f[:, r], MIB_SIZES), abs=1e-12)
        assert float(cmd[r]) == pytest.approx(np.trapezoid(np.abs(1 - f[:, r]), MIB_SIZES), abs=1e-12)


def test_errors_name_the_problem():
    metric, full, empty = curve(4)
    with pytest.raises(ValueError, match="curve 'a'.*shape"):
        area_intervals(MIB_SIZES, {"a": metric[:, :10]}, full, empty)
    with pytest.raises(ValueError, match="no per-prompt metric for \\['c'\\]"):
        area_intervals(MIB_SIZES, {"a": metric}, full, empty, [("a", "c")])
    with pytest.raises(ValueError, match="at least 2 prompts"):
        area_intervals(MIB_SIZES, {"a": metric[:, :1]}, full[:1], empty[:1])
