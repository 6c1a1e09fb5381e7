"""bench/edge_compare.py: CPR / CMD of stored edge curves on a slice of their prompts equal the areas computed by
hand from the per-prompt metrics (numpy, 1e-12), the paired difference is the difference of the points and its
interval the one ``area_intervals`` gives on the same slice; runs of other prompts are refused; its figure (the
module's ``curves_figure``) draws each curve in one colour in both panels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_svd.analysis.area_intervals import area_intervals
from tests.bench_script import load_bench

SIZES = [0.01, 0.1, 0.5, 1.0]


@pytest.fixture(scope="module")
def bench():
    return load_bench("edge_compare")


def stored_run(path: Path, curves: dict, full, empty) -> str:
    rows = {n: {"sizes": SIZES, "prompt_metric": m.tolist()} for n, m in curves.items()}
    info = {"prompt_full": full.tolist(), "prompt_empty": empty.tolist()}
    path.write_text(json.dumps({"curves": rows, "info": info}))
    return str(path)


def by_hand(metric, full, empty):
    f = (metric.mean(1) - empty.mean()) / (full.mean() - empty.mean())
    return np.trapezoid(f, SIZES), np.trapezoid(np.abs(1 - f), SIZES)


def test_areas_on_a_slice_equal_the_hand_computed_ones(bench, tmp_path):
    rng = np.random.default_rng(0)
    full, empty = 3 + rng.normal(size=40), -3 + rng.normal(size=40)
    a = empty + (full - empty) * rng.uniform(0.2, 1.1, size=(len(SIZES), 40))
    b = empty + (full - empty) * rng.uniform(0.0, 1.0, size=(len(SIZES), 40))
    one = stored_run(tmp_path / "one.json", {"a": a}, full, empty)
    two = stored_run(tmp_path / "two.json", {"b": b}, full, empty)  # another run, the same prompts
    out = bench.main([f"{one}:a", f"{two}:b", "--prompts", "10:30"])
    keep = slice(10, 30)
    assert out["prompts"] == [10, 30]
    want = {s: by_hand(m[:, keep], full[keep], empty[keep]) for s, m in ((f"{one}:a", a), (f"{two}:b", b))}
    for spec, (cpr, cmd) in want.items():
        assert out["curves"][spec]["cpr"] == pytest.approx(cpr, abs=1e-12)
        assert out["curves"][spec]["cmd"] == pytest.approx(cmd, abs=1e-12)
    diff = out["differences"][f"{one}:a - {two}:b"]
    assert diff["cmd"] == pytest.approx(want[f"{one}:a"][1] - want[f"{two}:b"][1], abs=1e-12)
    t = lambda x: torch.tensor(x[..., keep])  # noqa: E731
    ci = area_intervals(SIZES, {"a": t(a), "b": t(b)}, t(full), t(empty), [("a", "b")])
    assert diff["cmd_ci"] == ci["pairs"]["a - b"]["cmd"]
    assert out["curves"][f"{one}:a"]["cpr_ci"] == ci["curves"]["a"]["cpr"]
    f_a = (a[:, keep].mean(1) - empty[keep].mean()) / (full[keep].mean() - empty[keep].mean())
    assert np.allclose(out["curves"][f"{one}:a"]["values"], f_a, atol=1e-12)
    lo, hi = np.array(out["curves"][f"{one}:a"]["values_ci"])
    assert np.all(lo <= f_a + 1e-12) and np.all(f_a <= hi + 1e-12) and np.all(lo < hi)
    everything = bench.main([f"{one}:a", f"{two}:b"])  # the default: all prompts
    assert everything["prompts"] == [0, 40]
    assert everything["curves"][f"{one}:a"]["cmd"] == pytest.approx(by_hand(a, full, empty)[1], abs=1e-12)


def test_runs_of_other_prompts_and_unknown_curves_are_refused(bench, tmp_path):
    rng = np.random.default_rng(1)
    full, empty, m = rng.normal(size=8) + 3, rng.normal(size=8) - 3, rng.normal(size=(len(SIZES), 8))
    one = stored_run(tmp_path / "one.json", {"a": m}, full, empty)
    other = stored_run(tmp_path / "other.json", {"b": m}, full + 0.5, empty)
    with pytest.raises(SystemExit, match="curved other prompts"):
        bench.main([f"{one}:a", f"{other}:b"])
    with pytest.raises(SystemExit, match="no curve 'c'"):
        bench.main([f"{one}:a", f"{one}:c"])
    shorter = stored_run(tmp_path / "shorter.json", {"b": m[:, :5]}, full[:5], empty[:5])  # its first 5 prompts
    out = bench.main([f"{one}:a", f"{shorter}:b", "--prompts", ":5"])
    assert out["curves"][f"{shorter}:b"]["cmd"] == pytest.approx(by_hand(m[:, :5], full[:5], empty[:5])[1], abs=1e-12)
    with pytest.raises(SystemExit, match="curved other prompts"):  # all prompts: 8 against 5
        bench.main([f"{one}:a", f"{shorter}:b"])


def test_the_figure_draws_the_curves_and_needs_distinct_names(bench, tmp_path):
    rng = np.random.default_rng(2)
    full, empty = 3 + rng.normal(size=16), -3 + rng.normal(size=16)
    m = empty + (full - empty) * rng.uniform(0.3, 1.0, size=(len(SIZES), 16))
    one = stored_run(tmp_path / "one.json", {"units_abs_raw": m, "directions_abs_fair": m[::-1]}, full, empty)
    png = tmp_path / "curves.png"
    bench.main([f"{one}:directions_abs_fair", f"{one}:units_abs_raw", "--figure", str(png), "--title", "t"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    other = stored_run(tmp_path / "other.json", {"units_abs_raw": m}, full, empty)
    with pytest.raises(SystemExit, match="distinct"):
        bench.main([f"{one}:units_abs_raw", f"{other}:units_abs_raw", "--figure", str(png)])


def test_a_curve_drawn_in_both_panels_has_one_colour():
    """``curves_figure``: a head-level curve (both panels) keeps its colour across them; each curve its own."""
    from lit_svd.figures.edge_circuits import curves_figure

    row = {"sizes": SIZES, "values": [0.2, 0.5, 0.9, 1.0], "cpr": 0.5, "cmd": 0.3}
    fig = curves_figure({"units_abs_raw": row, "directions_abs_fair": row, "directions_abs_raw": row}, "t")
    raw, fair = ({ln.get_label().split(" ")[0]: ln.get_color() for ln in ax.get_lines() if ln.get_marker() == "o"}
                 for ax in fig.axes)  # fmt: skip
    assert set(raw) == {"units_abs_raw", "directions_abs_raw"} and set(fair) == {"units_abs_raw", "directions_abs_fair"}
    assert raw["units_abs_raw"] == fair["units_abs_raw"]
    assert len({raw["units_abs_raw"], raw["directions_abs_raw"], fair["directions_abs_fair"]}) == 3
