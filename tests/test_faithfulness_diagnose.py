"""bench/faithfulness_diagnose.py: the circuit comparison's pieces against hand-written loops and a linear stand-in for
``f``, and the whole bench end to end on a tiny model, where its ``compare`` and ``positions`` parts must give the
``candidates`` part's curves (``faithfulness_curves``, another code path) for the same rankings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from lit_svd.analysis.attribution import Attributions
from lit_svd.analysis.faithfulness import MIB_SIZES, Universe, fair_weights, universe_components
from lit_svd.analysis.rankings import random_ranking
from lit_svd.models import view as make_view
from lit_svd.models.tiny import tiny_causal_lm
from tests.bench_script import load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def diagnose(monkeypatch_module):
    monkeypatch_module.syspath_prepend(str(ROOT / "bench"))  # the bench imports its sibling faithfulness_setup
    return load_bench("faithfulness_diagnose")


@pytest.fixture(scope="module")
def llama():
    view = make_view(tiny_causal_lm("llama", seed=0))
    universe = Universe(universe_components(view))
    return view, universe, fair_weights(universe)


def unit_name(address) -> str:
    kind = {"q": "h", "ov": "h", "k": "kv"}.get(address.kind)
    return f"L{address.layer}.mlp" if kind is None else f"L{address.layer}.{kind}{address.group}"


def test_composition_splits_the_fair_size_and_counts_each_unit(diagnose, llama):
    view, universe, weights = llama
    keep = torch.rand(len(universe), generator=torch.Generator().manual_seed(1)) < 0.3
    got = diagnose.composition(universe, weights, keep, view.n_layers)
    size = float(weights[keep].sum())
    assert got["fair_size"] == pytest.approx(size, abs=1e-12)
    assert sum(got["by_kind"].values()) == pytest.approx(size, abs=1e-12)
    assert sum(map(sum, got["by_layer"].values())) == pytest.approx(size, abs=1e-12)
    kept: dict[str, list[int]] = {}
    for flat in range(len(universe)):
        counts = kept.setdefault(unit_name(universe.address(flat)), [0, 0])
        counts[0] += int(keep[flat])
        counts[1] += 1
    assert got["units"] == {u: pytest.approx(k / n, abs=1e-4) for u, (k, n) in kept.items() if k}


def test_the_parts_cover_the_model(diagnose, llama):
    view, universe, _ = llama
    parts = diagnose.model_parts(universe, view.n_layers)
    assert bool((parts["mlp"] ^ parts["attention"]).all())
    thirds = [p for name, p in parts.items() if name.startswith("L")]
    assert torch.equal(torch.stack(thirds).sum(0), torch.ones(len(universe), dtype=torch.long))
    mlp = [universe.address(i).kind.startswith("mlp") for i in range(len(universe))]
    assert parts["mlp"].tolist() == mlp


def test_compare_scores_each_circuit_and_each_swap(diagnose, llama):
    """With ``f`` linear in the kept directions, a swap's ``f`` is A's part outside plus B's part inside; A and B are
    the fair-axis prefixes (checked against a loop over the ranking)."""
    view, universe, weights = llama
    value = torch.randn(len(universe), generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def linear(keep):
        return float(value[keep].sum())

    a, b = random_ranking(len(universe), 3), random_ranking(len(universe), 4)
    got = diagnose.compare_circuits(universe, weights, a, b, linear, view.n_layers)
    parts = diagnose.model_parts(universe, view.n_layers)
    assert got["sizes"] == list(MIB_SIZES)
    for i, size in enumerate(MIB_SIZES):
        prefix = {}
        for name, ranking in (("a", a), ("b", b)):
            keep, total = torch.zeros(len(universe), dtype=torch.bool), 0.0
            for flat in ranking.tolist():
                if total + float(weights[flat]) > size + 1e-9:
                    break
                total += float(weights[flat])
                keep[flat] = True
            prefix[name] = keep
            assert got["f"][name][i] == pytest.approx(linear(keep), abs=1e-9)
            assert got["fair_size"][name][i] == pytest.approx(total, abs=1e-9)
        for part, inside in parts.items():
            expected = linear(prefix["a"] & ~inside) + linear(prefix["b"] & inside)
            assert got["f"][f"a+b:{part}"][i] == pytest.approx(expected, abs=1e-9)
        only_a = got["kept"][i]["a"]["only"]
        assert all(u not in got["kept"][i]["b"]["units"] for u in only_a)
    same = diagnose.compare_circuits(universe, weights, a, a, linear, view.n_layers)
    assert all(same["f"][name] == same["f"]["a"] for name in same["f"])
    assert same["forwards"] == len(set(same["f"]["a"]))


def test_the_bench_runs_end_to_end_and_agrees_with_the_curves(diagnose, tiny_dirs, tmp_path, monkeypatch):
    data = {"task": "ioi", "tokenizer": tiny_dirs["llama"], "n_train": 1000, "n_val": 8, "n_test": 64}
    (tmp_path / "config.yaml").write_text(json.dumps({"data": {"init_args": {**data, "test_last": True}}}))
    argv = ["faithfulness_diagnose.py", "--model", tiny_dirs["llama"], "--n-train", "8", "--n-val", "8"]
    argv += ["--data-config", str(tmp_path / "config.yaml")]
    argv += ["--steps", "5", "--parts", "compare", "candidates", "positions", "unit_scores", "--layer-path"]
    argv += ["--candidates", "units_by_score", "hybrid", "eap_ig_heads"]
    argv += ["--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    threads = torch.get_num_threads()
    try:
        diagnose.main()
    finally:
        torch.set_num_threads(threads)
    out = json.loads((tmp_path / "faithfulness_diagnose.json").read_text())
    assert out["data"]["n_val"] == 8 and out["data"]["tokenizer"] == tiny_dirs["llama"]
    cand, compare = out["candidates"], out["compare"]
    assert {"units_by_score", "hybrid", "eap_ig_heads"} <= set(cand) and "mixed_all" not in cand
    assert cand["hybrid"]["signed"][-1] == pytest.approx(1.0, abs=1e-6)
    for variant in ("signed", "absolute"):
        assert compare[variant]["f"]["a"] == pytest.approx(cand["units_by_score"][variant], abs=1e-5)
        assert compare[variant]["f"]["b"] == pytest.approx(cand["eap_ig_heads"][variant], abs=1e-5)
        assert compare[variant]["f"]["a"][-1] == pytest.approx(1.0, abs=1e-6)
    at = [MIB_SIZES.index(s) for s in out["positions"]["sizes"]]
    every = out["positions"]["all"]
    units, heads = cand["units_by_score"]["absolute"], cand["eap_ig_heads"]["signed"]
    assert every["eap_ig_units/absolute"] == pytest.approx([units[i] for i in at], abs=1e-5)
    assert every["eap_ig_heads/signed"] == pytest.approx([heads[i] for i in at], abs=1e-5)
    assert set(out["unit_scores"]) >= {"L0.mlp", "L0.h0", "L0.kv0"}
    sources = ("layer5", "joint5", "joint10")
    assert set(out["layer_path"]) == {f"{s}/{v}" for s in sources for v in ("signed", "absolute")}


def test_unit_scores_sum_each_units_directions(diagnose, llama):
    view, universe, weights = llama
    scores = torch.randn(len(universe), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    heads = torch.randn(view.n_layers, view.n_heads, dtype=torch.float64)
    mlps = torch.randn(view.n_layers, dtype=torch.float64)
    got = diagnose.unit_scores(universe, weights, scores, Attributions(heads, mlps, 1))
    sums: dict[str, dict[str, float]] = {}
    size: dict[str, float] = {}
    for flat in range(len(universe)):
        a = universe.address(flat)
        u = unit_name(a)
        sums.setdefault(u, {}).setdefault(a.kind, 0.0)
        sums[u][a.kind] += float(scores[flat])
        size[u] = size.get(u, 0.0) + float(weights[flat])
    assert set(got) == set(sums)
    for u, row in got.items():
        assert row["joint"] == pytest.approx(sums[u], abs=1e-9)
        assert row["per_fair_size"] == pytest.approx(sum(sums[u].values()) / size[u], rel=1e-9)
        layer = int(u.split(".")[0][1:])
        if u.endswith("mlp"):
            assert row["writer"] == float(mlps[layer])
        elif ".h" in u:
            assert row["writer"] == float(heads[layer, int(u.split(".h")[1])])
        else:
            assert "writer" not in row
