"""Faithfulness curves (lit_svd.analysis.faithfulness) against independent computations: the plain HF forward on
the clean and on the corrupted prompts, and a hand-written patch of one head's mixed value. Float64 tiny models
with float64 RMS norms (tests/helpers.exact_rms_norms). Tolerances, relative to the metric's scale: 1e-10 where
nothing is patched; 1e-7 where directions are patched (``intervene`` keeps every component's SVD in float32, the
float64 SVD cast down, so a patched coefficient is exact to float32 rounding of the singular vectors)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_svd.analysis.faithfulness import (
    MIB_SIZES,
    Universe,
    areas,
    by_length,
    check_ranking,
    check_same_length,
    check_sizes,
    faithfulness_curves,
    n_kept,
    universe_components,
)
from lit_svd.analysis.rankings import random_ranking, score_ranking
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.metrics import task_scorer
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, hooks
from lit_svd.models.tiny import tiny_causal_lm
from tests.helpers import exact_rms_norms

TOL = 1e-10
TOL_PATCH = 1e-7


def ioi_batches(tokenizer, n=8, batch_size=8):
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=n, batch_size=batch_size, seed=0)
    return list(dm.test_dataloader())


def plain_metric(model, batch, ids_key):
    logits = model(input_ids=batch[ids_key], attention_mask=batch["attention_mask"]).logits
    rows = torch.arange(len(batch["answer_pos"]))
    return task_scorer("ioi").metric(logits[rows, batch["answer_pos"]], batch).double()


@pytest.fixture(scope="module")
def llama64():
    return tiny_causal_lm("llama", seed=1).double()


@torch.no_grad()
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_full_circuit_is_the_clean_forward_and_empty_the_corrupted(tokenizer, arch):
    model = tiny_causal_lm(arch, seed=1).double()
    view = make_view(model)
    comps = universe_components(view)
    (batch,) = ioi_batches(tokenizer)
    n = len(Universe(comps))
    with exact_rms_norms(model):
        clean, corrupt = plain_metric(model, batch, "clean_ids"), plain_metric(model, batch, "corrupt_ids")
        # 0.01 % of the universe is < 1 direction (on both axes): the empty circuit; 100 %: the full one
        curves, info = faithfulness_curves(view, comps, [batch], {"r": random_ranking(n, 0)}, "ioi", [1e-4, 0.5, 1.0])
    scale = clean.abs().max()
    assert n_kept(1e-4, n) == 0
    assert abs(info["m_full"] - float(clean.mean())) <= TOL * scale
    assert abs(info["m_empty"] - float(corrupt.mean())) <= TOL_PATCH * scale
    assert abs(info["m_full"] - info["m_empty"]) > 1e-3  # the tiny model separates clean from corrupted
    for axis in ("raw", "fair"):  # no unit's directions are 0.1 % of the fair size either
        f = curves["r"][axis].values
        assert curves["r"][axis].n_kept[0] == 0 and curves["r"][axis].n_kept[2] == n
        assert abs(f[0]) <= 1e-8 and abs(f[2] - 1) <= 1e-8
        assert abs(f[1]) > 1e-4 and abs(f[1] - 1) > 1e-4  # half the directions is neither


@torch.no_grad()
def test_patching_one_heads_directions_equals_patching_its_mixed_value(tokenizer, llama64):
    """Every direction kept but one head's OV directions = that head's o-projection input replaced by its value on
    the corrupted prompt (an independent hook), per prompt."""
    from lit_svd.analysis.faithfulness import circuit_metric, corrupted_reference
    from lit_svd.models.patching import CircuitPatch

    model, layer, head = llama64, 1, 2
    view = make_view(model)
    comps = universe_components(view)
    universe = Universe(comps)
    (batch,) = ioi_batches(tokenizer)
    keep = torch.ones(len(universe), dtype=torch.bool)
    keep[universe.slice(f"L{layer}.ov")] = False
    keep[universe.slice(f"L{layer}.ov")] = (
        torch.arange(len(keep[universe.slice(f"L{layer}.ov")])) // view.d_head != head
    )
    # the OV map of a head has d_head + 1 rows but rank d_head: K = d_head directions per head
    assert universe.shapes[universe.names.index(f"L{layer}.ov")][1] == view.d_head
    dh, o = view.d_head, view.site_module(layer, "o")
    with exact_rms_norms(model):
        patch = CircuitPatch(view, comps)
        got = circuit_metric(patch, universe, batch, keep, corrupted_reference(patch, batch), task_scorer("ioi"))
        with capture({"z": o}, "pre") as z:
            model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])

        def pre(mod, args, kwargs):
            x = args[0].clone()
            x[..., head * dh : (head + 1) * dh] = z["z"][..., head * dh : (head + 1) * dh]
            return (x, *args[1:]), kwargs

        with hooks(Hook(o, pre, "pre")):
            want = plain_metric(model, batch, "clean_ids")
        clean = plain_metric(model, batch, "clean_ids")
    assert (got - want).abs().max() <= TOL_PATCH * want.abs().max()
    assert (want - clean).abs().max() > 1e-4  # the head matters on these prompts


@torch.no_grad()
def test_per_prompt_metrics_average_to_the_sums_and_give_the_intervals(tokenizer, llama64):
    """The curves keep every prompt's metric: their means equal the old per-batch sums over the prompts (a separate
    loop over ``circuit_metric``, summed batch by batch; 1e-12), the intervals equal ``area_intervals`` on those
    per-prompt metrics, and the prompts are listed in their split order whatever the order of the batches (the
    batches reversed give the same intervals; the reversed arrival order would give others)."""
    from lit_svd.analysis.area_intervals import area_intervals, paired_differences
    from lit_svd.analysis.faithfulness import circuit_metric, corrupted_reference, fair_weights, kept_counts
    from lit_svd.models.patching import CircuitPatch

    view = make_view(llama64)
    comps = universe_components(view)
    universe = Universe(comps)
    n = len(universe)
    rank = {"a": random_ranking(n, 0), "b": score_ranking(torch.linspace(1, 0, n))}
    sizes = [0.05, 0.2, 0.5, 1.0]
    batches = ioi_batches(tokenizer, 8, 3)
    weights = fair_weights(universe)
    task = task_scorer("ioi")
    with exact_rms_norms(llama64):
        curves, info = faithfulness_curves(view, comps, batches, rank, "ioi", sizes)
        back, back_info = faithfulness_curves(view, comps, batches[::-1], rank, "ioi", sizes)
        patch = CircuitPatch(view, comps)
        sums: dict = {}
        per_prompt: dict = {}
        for b in batches:
            ref = corrupted_reference(patch, b)
            for key, keep in (("full", torch.ones(n, dtype=torch.bool)), ("empty", torch.zeros(n, dtype=torch.bool))):
                m = circuit_metric(patch, universe, b, keep, ref, task)
                sums[key] = sums.get(key, 0.0) + float(m.sum())
                per_prompt.setdefault(key, []).append(m)
            for name, r in rank.items():
                for axis in ("raw", "fair"):
                    rows = []
                    for k in kept_counts(r, sizes, axis, weights):
                        keep = torch.zeros(n, dtype=torch.bool)
                        keep[r[:k]] = True
                        rows.append(circuit_metric(patch, universe, b, keep, ref, task))
                    t = torch.stack(rows)
                    key = f"{name}@{axis}"
                    sums[key] = sums.get(key, 0.0) + t.sum(1)
                    per_prompt.setdefault(key, []).append(t)
    P = 8
    assert info["n_prompts"] == P and info["prompt_index"] == list(range(P)) == back_info["prompt_index"]
    scale = abs(sums["full"] / P)
    assert abs(info["m_full"] - sums["full"] / P) <= 1e-12 * scale
    assert abs(info["m_empty"] - sums["empty"] / P) <= 1e-12 * scale
    full, empty = torch.cat(per_prompt["full"]), torch.cat(per_prompt["empty"])
    metrics = {key: torch.cat(per_prompt[key], 1) for key in sums if "@" in key}
    want = area_intervals(sizes, metrics, full, empty, [("a@fair", "b@fair")])
    for key, t in metrics.items():
        name, axis = key.split("@")
        c = curves[name][axis]
        assert max(abs(a - b) for a, b in zip(c.metric, (sums[key] / P).tolist())) <= 1e-12 * scale, key
        assert (torch.tensor(c.prompt_metric, dtype=torch.float64) - t).abs().max() <= 1e-12 * scale
        w = want["curves"][key]
        for got, exp in ((c.cpr_ci, w["cpr"]), (c.cmd_ci, w["cmd"]), *zip(c.values_ci, w["f"])):
            assert max(abs(a - b) for a, b in zip(got, exp)) <= 1e-9, (key, got, exp)
        other = back[name][axis]
        assert max(abs(a - b) for a, b in zip(other.cpr_ci + other.cmd_ci, c.cpr_ci + c.cmd_ci)) <= 1e-9
        assert c.cpr_ci[0] <= c.cpr <= c.cpr_ci[1]
    rows = {f"{name}@{axis}": c.row() for name, by_axis in curves.items() for axis, c in by_axis.items()}
    diff = paired_differences(rows, info)
    assert diff("a@fair", "b@fair", "cpr")["cpr_diff_ci"] == want["pairs"]["a@fair - b@fair"]["cpr"]
    # the arrival order of the reversed batches, not sorted back, draws other prompts: other intervals
    arrival = torch.cat([torch.arange(6, 8), torch.arange(3, 6), torch.arange(0, 3)])
    shuffled = area_intervals(sizes, {"a@raw": metrics["a@raw"][:, arrival]}, full[arrival], empty[arrival])
    assert shuffled["curves"]["a@raw"]["cpr"] != want["curves"]["a@raw"]["cpr"]


@torch.no_grad()
def test_ratio_of_means_does_not_depend_on_batching(tokenizer, llama64):
    view = make_view(llama64)
    comps = universe_components(view)
    rank = {"r": random_ranking(len(Universe(comps)), 3)}
    sizes = [0.05, 0.2, 1.0]
    with exact_rms_norms(llama64):
        one, _ = faithfulness_curves(view, comps, ioi_batches(tokenizer, 8, 8), rank, "ioi", sizes)
        two, info = faithfulness_curves(view, comps, ioi_batches(tokenizer, 8, 3), rank, "ioi", sizes)
    assert info["n_prompts"] == 8
    # 1e-6: HF's eager softmax computes in float32, and batches of other widths round it differently
    for axis in ("raw", "fair"):
        assert max(abs(a - b) for a, b in zip(one["r"][axis].values, two["r"][axis].values)) <= 1e-6


def test_by_length_keeps_every_prompt_and_trims_padding(tokenizer):
    """``by_length``: the same prompts (every entry, tokens up to their length), batches of the same sizes in length
    order, each as wide as its longest prompt; anything but task batches passes unchanged."""
    batches = ioi_batches(tokenizer, 10, 4)
    packed = by_length(batches)
    assert [len(b["answer_pos"]) for b in packed] == [len(b["answer_pos"]) for b in batches]
    lengths = [int(n) for b in packed for n in b["attention_mask"].sum(1)]
    assert lengths == sorted(lengths) and all(b["clean_ids"].shape[1] == int(b["attention_mask"].sum(1).max())
                                             for b in packed)  # fmt: skip

    def rows(bs):
        out = {}
        for b in bs:
            for i, idx in enumerate(b["index"].tolist()):
                n = int(b["attention_mask"][i].sum())
                out[idx] = (b["clean_ids"][i, :n].tolist(), b["corrupt_ids"][i, :n].tolist(), int(b["answer_pos"][i]),
                            int(b["correct_id"][i]), int(b["wrong_id"][i]))  # fmt: skip
        return out

    assert rows(packed) == rows(batches) and len(rows(batches)) == 10
    assert any(b["clean_ids"].shape[1] < max(c["clean_ids"].shape[1] for c in batches) for b in packed)
    odd = [{**batches[0], "note": "x"}, batches[1]]
    assert by_length(odd) == odd


def test_areas_are_trapezoids_over_the_grid():
    sizes = [0.1, 0.5, 1.0]
    cpr, cmd = areas(sizes, [0.0, 0.5, 1.5])
    assert cpr == pytest.approx(0.4 * 0.25 + 0.5 * 1.0)
    assert cmd == pytest.approx(0.4 * (1 + 0.5) / 2 + 0.5 * (0.5 + 0.5) / 2)
    assert areas(MIB_SIZES, [1.0] * 10) == pytest.approx((0.999, 0.0))


def test_sizes_and_rankings_are_checked():
    assert n_kept(0.29, 100) == 29 and n_kept(0.001, 999) == 0 and n_kept(1.0, 7) == 7
    for bad in ([], [0.0, 0.5], [0.5, 0.2], [0.5, 1.5]):
        with pytest.raises(ValueError, match="sizes="):
            check_sizes(bad)
    with pytest.raises(ValueError, match="exactly once"):
        check_ranking(torch.tensor([0, 1, 1]), 3)
    with pytest.raises(ValueError, match="exactly once"):
        check_ranking(torch.tensor([0, 1]), 3)
    with pytest.raises(ValueError, match="same token length"):
        check_same_length({"clean_ids": torch.zeros(2, 5), "corrupt_ids": torch.zeros(2, 6)})


def test_score_ranking_orders_by_score_with_a_seeded_tail():
    scores = torch.tensor([0.5, math.nan, 2.0, 0.5, math.nan, -1.0])
    r = score_ranking(scores)
    assert r[0] == 2 and set(r[1:3].tolist()) == {0, 3} and r[3] == 5 and set(r[4:].tolist()) == {1, 4}
    assert torch.equal(r, score_ranking(scores))  # seeded
    flat = score_ranking(torch.zeros(50))  # a featureless score is a random order
    assert not torch.equal(flat, torch.arange(50))


def test_universe_addresses_round_trip(llama64):
    view = make_view(llama64)
    universe = Universe(universe_components(view))
    kinds = {n.split(".")[1] for n in universe.names}
    assert kinds == {"q", "k", "ov", "mlp_in", "mlp_gate", "mlp_out"}
    for flat in (0, 17, len(universe) // 2, len(universe) - 1):
        assert universe.index(universe.address(flat)) == flat
    with pytest.raises(ValueError, match="joint qk"):
        from lit_svd.models.intervene import build_components

        Universe(build_components(make_view(tiny_causal_lm("gpt2")), ["qk"]))


def _units(universe, H, H_kv):
    """Brute force: every unit as its list of (flat index, share), by a loop over addresses."""
    units = {}
    for flat in range(len(universe)):
        a = universe.address(flat)
        if a.kind in ("q", "ov"):
            units.setdefault(("head", a.layer, a.group), []).append((flat, 1.0))
        elif a.kind == "k":
            for h in range(a.group * (H // H_kv), (a.group + 1) * (H // H_kv)):
                units.setdefault(("head", a.layer, h), []).append((flat, H_kv / H))
        else:
            units.setdefault(("mlp", a.layer, 0), []).append((flat, 1.0))
    return units


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma3"])
def test_fair_size_is_the_mean_kept_fraction_of_units(arch):
    """``fair_weights`` against a loop over addresses; a circuit of whole units has the unit count's size (exactly
    on MHA GPT-2; with grouped keys plus its KV heads' shares of the other query heads) under a head ranking and
    under a direction ranking holding the same directions in another order."""
    from lit_svd.analysis.attribution import Attributions
    from lit_svd.analysis.faithfulness import fair_weights, kept_counts
    from lit_svd.analysis.rankings import eap_ranking

    view = make_view(tiny_causal_lm(arch, seed=1))
    universe = Universe(universe_components(view))
    H, H_kv = view.n_heads, view.n_kv_heads
    units = _units(universe, H, H_kv)
    w = fair_weights(universe)
    want = torch.zeros(len(universe), dtype=torch.float64)
    for members in units.values():
        total = sum(share for _, share in members)
        for flat, share in members:
            want[flat] += share / total / len(units)
    assert torch.allclose(w, want, rtol=1e-12, atol=0) and abs(float(w.sum()) - 1) < 1e-12

    g = torch.Generator().manual_seed(0)
    attr = Attributions(torch.randn(view.n_layers, H, generator=g, dtype=torch.float64),
                        torch.randn(view.n_layers, generator=g, dtype=torch.float64), 4)  # fmt: skip
    heads, _ = eap_ranking(universe, attr, H_kv, signed=True)
    order = sorted(units, key=lambda u: -float(attr.heads[u[1], u[2]] if u[0] == "head" else attr.mlps[u[1]]))
    for m in (1, 3, len(order) // 2):
        circuit = {flat for u in order[:m] for flat, _ in units[u]}
        size = float(w[sorted(circuit)].sum())
        if H == H_kv:
            assert size == pytest.approx(m / len(units), rel=1e-12)
        assert size >= m / len(units) - 1e-12
        shuffled = torch.tensor(sorted(circuit, key=lambda _: torch.rand(1, generator=g).item()))
        rest = torch.tensor(sorted(set(range(len(universe))) - circuit))
        directions = torch.cat([shuffled, rest])
        if set(heads[: len(circuit)].tolist()) == circuit:  # the head ranking reaches this circuit whole
            assert kept_counts(heads, [size], "fair", w) == [len(circuit)]
        assert kept_counts(directions, [size], "fair", w) == [len(circuit)]


def test_prefix_counts_against_a_loop():
    from lit_svd.analysis.faithfulness import prefix_counts

    g = torch.Generator().manual_seed(1)
    w = torch.rand(200, generator=g, dtype=torch.float64)
    w /= w.sum()
    for s in (0.0005, 0.01, 0.3, 0.77, 1.0):
        total, count = 0.0, 0
        for x in w.tolist():
            if total + x > s * (1 + 1e-9):
                break
            total, count = total + x, count + 1
        assert prefix_counts(w, [s]) == [count]
