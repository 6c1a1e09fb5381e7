"""Edge rankings, cuts and curves (``analysis/edge_curves.py``).

* ``select`` against a brute-force sort of every edge (key descending, then reader unit, then flat index) on a tiny
  universe: the kept set of each target is the longest prefix whose count (raw) or weighted count (fair) is at most
  the target, with scores drawn from a few values (ties everywhere), in float32 and float64, at every level, and
  with 4-bit buckets and scores read a few rows at a time; float32 and float64 scores spread over many buckets;
* a head-level circuit's weighted count is its edge count; a direction ranking's cut at a fraction of the blocks
  has that weighted count at most;
* random circuits are nested over the fractions and keep about that fraction;
* ``BlockRanking`` (whole blocks, or tiers of each block) against a brute-force sort of every direction edge by
  (tier, block score, own score, flat index), raw and weighted targets, ties between blocks and between edges;
  ``block_sums`` against a loop; on the planted circuit the block rankings against random and reversed orders;
* the curve ends: every edge kept is ``m(full)``, none ``m(empty)``;
* the **planted two-step circuit** (``tests/planted.py``): scored on one prompt set and curved on another, the
  planted edge ``L0 head 0's OV -> L1 head 0's key`` is the strongest edge into that reader (> 10x the next) and
  the four strongest edges of the model's 42k are the planted circuit's four (the embedding into both heads' value
  reads, the planted edge, L1 head 0 into the logits). The absolute ranking's curve beats random by more than 0.3
  CPR, the ranking of the smallest |score| first does not beat random; the signed ranking beats random by less
  (0.18 measured): the L0 value read's integrated gradient is negative (-10.9) although dropping that edge alone
  costs 32 of the 40.5 gap (its write of f also dilutes the M token in layer 1's LayerNorm: the gradient is
  negative from alpha = 0.4 on, clean end included), so the signed ranking puts it last (docs/circuits.md).
"""

from __future__ import annotations

import functools
import math
import os
import signal
import time
from types import SimpleNamespace

import pytest
import torch

from lit_svd.analysis import edge_curves
from lit_svd.analysis.edge_ablation import EdgeAblation
from lit_svd.analysis.edge_attribution import attribute
from lit_svd.analysis.edge_curves import (
    EdgeRanking,
    LeveledCircuit,
    RandomCircuit,
    RankedCircuit,
    ScoreFile,
    absolute,
    cut_levels,
    exit_on_sigterm,
    keys,
    random_spec,
    ranked_spec,
    ranking_shape,
    select,
)
from lit_svd.analysis.edge_curves import (
    edge_curves as curves_of_specs,
)
from lit_svd.analysis.edges import EdgeUniverse
from lit_svd.models import view as make_view
from lit_svd.models.tiny import tiny_causal_lm
from tests.planted import planted_batch, planted_model


@pytest.fixture(scope="module")
def universe():
    return EdgeUniverse(make_view(tiny_causal_lm("llama", vocab_size=64).double()))


def random_ranking(universe, level, dtype, seed=0, values=7):
    g = torch.Generator().manual_seed(seed)
    shapes = {r.index: ranking_shape(EdgeRanking(universe, level, None), r) for r in universe.readers}
    table = {i: (torch.randint(-values, values + 1, s, generator=g) * 0.37).to(dtype) for i, s in shapes.items()}
    return EdgeRanking(universe, level, lambda r: table[r.index])


def brute_force(ranking, target, weighted):
    """The kept set of a full sort of every edge: key descending, then reader unit, then flat index."""
    key, unit, index, weight = [], [], [], []
    for r in ranking.universe.readers:
        S = ranking.scores(r)
        key.append(keys(S).reshape(-1))
        unit.append(torch.full((S.numel(),), r.index))
        index.append(torch.arange(S.numel()))
        w = ranking.weights(r).expand(S.shape).reshape(-1)
        weight.append(w if weighted else torch.ones_like(w))
    key, unit, index, weight = (torch.cat(t) for t in (key, unit, index, weight))
    order = torch.argsort(key, descending=True, stable=True)  # units and indices are already ascending
    cum = weight[order].cumsum(0)
    n = int((cum <= target + 1e-9 * max(1.0, target)).sum())
    return set(zip(unit[order][:n].tolist(), index[order][:n].tolist()))


def kept_set(ranking, cut):
    out = set()
    for r in ranking.universe.readers:
        m = cut.mask(r, keys(ranking.scores(r))).reshape(-1)
        assert torch.equal(cut.mask_of(r, ranking.scores(r)).reshape(-1), m)  # 32-bit keys for float32 scores
        out |= {(r.index, int(i)) for i in torch.nonzero(m).flatten()}
    return out


@pytest.mark.parametrize("level", ["directions", "writer_units", "units"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bits", [16, 4])
def test_select_is_the_prefix_of_a_full_sort(universe, level, dtype, bits, monkeypatch):
    monkeypatch.setattr(edge_curves, "BUCKET_BITS", bits)
    if bits == 4:  # also read the scores in chunks of a few rows
        monkeypatch.setattr(edge_curves, "_score_rows", functools.partial(edge_curves._score_rows, elements=200))
    ranking = random_ranking(universe, level, dtype)
    n = ranking.count()
    for weighted in (False, True):
        total = n if not weighted else float(universe.n_blocks)
        targets = [0.0, 1.0, 0.013 * total, 0.5 * total, total - 1, total]
        for target, cut in zip(targets, select(ranking, targets, weighted)):
            want = brute_force(ranking, target, weighted)
            got = kept_set(ranking, cut)
            assert got == want, f"{level} {dtype} weighted={weighted} target {target}: {len(got)} vs {len(want)}"
            assert cut.kept == len(want)


def test_weighted_counts(universe):
    blocks = random_ranking(universe, "units", torch.float64)
    for cut in select(blocks, [10.0, 40.0], weighted=False):
        assert cut.weight == pytest.approx(cut.kept, abs=1e-9)  # a block weighs 1
    dirs = random_ranking(universe, "directions", torch.float64, values=1000)
    for s, cut in zip([0.01, 0.3], select(dirs, [0.01 * universe.n_blocks, 0.3 * universe.n_blocks], True)):
        assert cut.weight <= s * universe.n_blocks + 1e-9
        circuit = RankedCircuit(dirs, cut)
        weight = sum(
            float((circuit.keep(r).double() * universe.block_weights(r)[universe.col_unit[: r.n_cols]]).sum())
            if circuit.keep(r) is not None
            else float(universe.block_weights(r)[universe.col_unit[: r.n_cols]].sum() * r.size)
            for r in universe.readers
        )
        assert weight == pytest.approx(cut.weight, rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bits", [16, 4])
def test_cut_levels_give_each_cut_its_mask(universe, dtype, bits, monkeypatch):
    """``cut_levels``: its cuts are ``select``'s, and the mask of each cut read from the levels (``LeveledCircuit``)
    equals the cut's own (``RankedCircuit``), with ties everywhere, targets in any order and repeated (``bits`` 4:
    several cuts end in one bucket); ``ranked_spec`` gives them for direction rankings."""
    monkeypatch.setattr(edge_curves, "BUCKET_BITS", bits)
    ranking = random_ranking(universe, "directions", dtype, seed=4)
    total = float(universe.n_blocks)
    targets = [0.3 * total, 0.0, 0.013 * total, 0.3 * total, total - 1, total, 0.7 * total, 0.31 * total]
    levels = cut_levels(ranking, targets, weighted=True)
    cuts = levels.cuts
    assert cuts == select(ranking, targets, weighted=True)
    for cut in cuts:
        ours, theirs = LeveledCircuit(levels, levels.need(cut)), RankedCircuit(ranking, cut)
        for r in universe.readers:
            a, b = ours.keep(r), theirs.keep(r)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), f"unit {r.index}, {cut.kept}"
            L = ours.levels(r)
            assert torch.equal(L.low, L.level.amin(0)) and torch.equal(L.high, L.level.amax(0))
    circuits = ranked_spec(ranking, "fair").circuits([0.01, 0.3])
    assert all(isinstance(c, LeveledCircuit) for c, _, _ in circuits)


def test_random_circuits_are_nested_and_of_their_size(universe):
    small, large = (RandomCircuit(universe, "directions", s, seed=3) for s in (0.1, 0.4))
    for r in universe.readers:
        a, b = small.keep(r), large.keep(r)
        assert not bool((a & ~b).any())
    kept, weight = large.sizes()
    n = universe.counts()["directions"]
    assert abs(kept / n - 0.4) < 0.01 and abs(weight / universe.n_blocks - 0.4) < 0.05


@pytest.fixture(scope="module")
def planted():
    model, _, _ = planted_model()
    universe = EdgeUniverse(make_view(model))
    train, test = planted_batch(16, seed=0), planted_batch(16, seed=1)
    scores = attribute(universe, [train], "ioi")
    return universe, scores, test


def _unit_scores(universe, scores):
    offsets = universe.block_offsets
    return lambda r: scores.units[int(offsets[r.index]) : int(offsets[r.index + 1])][None]


def test_planted_edge_ranks_first(planted):
    universe, scores, _ = planted
    key = next(r for r in universe.readers if r.kind == "k" and r.layer == 1 and r.group == 0)
    S = scores.directions(key)
    k, col = divmod(int(S.abs().argmax()), S.shape[1])
    assert str(universe.writer_address(col)).startswith("L0.ov.h0."), universe.writer_address(col)
    top = S.abs().flatten().sort(descending=True).values
    assert float(top[0]) > 10 * float(top[1])  # far above the next edge into that reader
    edges = []
    for r in universe.readers:
        S = scores.directions(r)
        for i, value in enumerate(S.abs().flatten().tolist()):
            k, col = divmod(i, S.shape[1])
            edges.append((value, str(r), str(universe.writers[int(universe.col_unit[col])])))
    strongest = {(reader, writer) for _, reader, writer in sorted(edges, reverse=True)[:4]}
    planted_edges = {("L0.v.h0", "embed"), ("L1.k.h0", "L0.h0"), ("L1.v.h0", "embed"), ("logits", "L1.h0")}
    assert strongest == planted_edges


def test_planted_curve_beats_random(planted):
    universe, scores, test = planted
    ablation = EdgeAblation(universe, "ioi")
    directions = EdgeRanking(universe, "directions", scores.directions)
    smallest = EdgeRanking(universe, "directions", lambda r: -scores.directions(r).abs())
    specs = {
        "signed": ranked_spec(directions, "raw"),
        "absolute": ranked_spec(absolute(directions), "raw"),
        "absolute_fair": ranked_spec(absolute(directions), "fair"),
        "smallest": ranked_spec(smallest, "raw"),
        "random": random_spec(universe, "directions", 0),
    }
    curves, info = curves_of_specs(ablation, [test], specs)
    cpr = {n: round(c.cpr, 3) for n, c in curves.items()}
    assert info["m_full"] - info["m_empty"] > 1.0
    assert info["intervals"]["method"] == "BCa" and info["intervals"]["percentile_fallback"] == []  # 16 prompts
    assert all(c.cpr_ci[0] <= c.cpr <= c.cpr_ci[1] for c in curves.values()), [c.cpr_ci for c in curves.values()]
    for c in curves.values():
        assert c.values[-1] == pytest.approx(1.0, abs=1e-9)
    assert curves["absolute"].cpr > curves["random"].cpr + 0.3, cpr
    assert curves["absolute_fair"].cpr > curves["random"].cpr + 0.3, cpr
    assert curves["signed"].cpr > curves["random"].cpr + 0.1, cpr
    assert curves["smallest"].cpr < curves["random"].cpr + 0.05, cpr


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keys_keep_the_order_of_the_floats(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(1000, generator=g, dtype=dtype) * 10.0 ** torch.randint(-30, 30, (1000,), generator=g),
                   torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45], dtype=dtype)])  # fmt: skip
    k = keys(x)
    order = torch.argsort(k)
    assert bool((x[order][1:] >= x[order][:-1]).all())
    assert len(k.unique()) == len(x.unique()) + 1  # -0.0 and +0.0 differ as keys only


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bits", [16, 4])
def test_buckets_are_the_top_bits_of_the_keys(dtype, bits, monkeypatch):
    """``_bucket`` reads the floats' bits: the top ``BUCKET_BITS`` of their keys, offset to be non-negative."""
    monkeypatch.setattr(edge_curves, "BUCKET_BITS", bits)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(1000, generator=g, dtype=dtype) * 10.0 ** torch.randint(-30, 30, (1000,), generator=g),
                   torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45], dtype=dtype)])  # fmt: skip
    want = (keys(x) >> (64 - bits)) + (1 << (bits - 1))
    got = edge_curves._bucket(x.reshape(2, -1))
    assert got.dtype == torch.int32 and got.shape == (2, len(x) // 2)
    assert torch.equal(got.reshape(-1).long(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_spread_over_the_buckets(dtype):
    """Scores of one sign and a few orders of magnitude fall into many buckets of ``select`` (not into the two of
    the key's sign bits): the buckets are what keeps the candidate read small."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(100_000, generator=g, dtype=torch.float64).to(dtype) * 1e-3
    assert len(edge_curves._bucket(x).unique()) > 100


def test_sigterm_unwinds_and_the_score_file_goes(universe, tmp_path):
    """Under ``exit_on_sigterm`` a SIGTERM raises SystemExit where the run is, so a ``finally`` removes the score
    file; the previous handler is back afterwards. Without it the default handler would kill the process here."""
    previous = signal.getsignal(signal.SIGTERM)
    store = ScoreFile(universe, tmp_path)
    r = universe.readers[0]
    store[r.index] = torch.ones(r.size, r.n_cols)
    assert store.path.exists()
    with pytest.raises(SystemExit) as info:
        with exit_on_sigterm():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises long before this ends
            finally:
                store.close()
    assert info.value.code == 128 + signal.SIGTERM
    assert not store.path.exists() and not any(tmp_path.iterdir())
    assert signal.getsignal(signal.SIGTERM) is previous


def block_brute_force(ranking, block_scores, target, weighted, tiers=(1.0,)):
    """The kept set of a full sort of every direction edge: by tier (an edge at place ``p`` of its block's own order
    is in the first tier ``t`` with ``p < max(1, ceil(t x edges))``), then block score descending (ties: block index),
    then the edge's own score descending (ties: flat index); the longest prefix of count (weight) at most
    ``target``."""
    u = ranking.universe
    blocks: dict[int, list] = {}
    for r in u.readers:
        S, w = ranking.scores(r), ranking.weights(r)
        for flat, value in enumerate(S.reshape(-1).tolist()):
            col = flat % r.n_cols
            block = int(u.block_offsets[r.index]) + int(u.col_unit[col])
            blocks.setdefault(block, []).append((-value, flat, r.index, float(w[col])))
    rows = []
    for block, edges in blocks.items():
        edges.sort()
        ends = [max(1, math.ceil(t * len(edges) - 1e-9)) for t in tiers]
        for place, (value, flat, unit, w) in enumerate(edges):
            tier = next(i for i, end in enumerate(ends) if place < end)
            rows.append((tier, -float(block_scores[block]), block, value, flat, unit, w))
    rows.sort(key=lambda t: t[:5])
    kept, total = set(), 0.0
    for *_, flat, unit, w in rows:
        total += w if weighted else 1.0
        if total > target + 1e-9 * max(1.0, target):
            break
        kept.add((unit, flat))
    return kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tiers", [(1.0,), (0.1, 1.0), (0.05, 0.5, 1.0)])
def test_block_ranking_is_the_prefix_of_a_full_sort(universe, dtype, tiers):
    within = random_ranking(universe, "directions", dtype, seed=1, values=3)
    g = torch.Generator().manual_seed(2)
    block_scores = torch.randint(-4, 5, (universe.n_blocks,), generator=g).double()  # ties between blocks too
    ranking = edge_curves.BlockRanking(within, block_scores, tiers)
    n = within.count()
    for weighted in (False, True):
        total = float(universe.n_blocks) if weighted else n
        targets = [0.0, 0.7, 3.0, 0.013 * total, 0.37 * total, total - 0.5, total]
        for target, circuit in zip(targets, ranking.cuts(targets, weighted)):
            got = set()
            for r in universe.readers:
                m = circuit.keep(r).cpu()
                blocks = circuit.block_keep(r)
                if blocks is not None:  # whole blocks: the same mask
                    assert torch.equal(blocks[universe.col_unit[: r.n_cols]].expand(r.size, -1), m)
                got |= {(r.index, int(i)) for i in torch.nonzero(m.reshape(-1)).flatten()}
            want = block_brute_force(within, block_scores, target, weighted, tiers)
            assert got == want, f"weighted={weighted} target {target}: {len(got)} vs {len(want)}"
            assert circuit.kept_edges == len(want)
            weight = sum(float(universe.block_weights(r)[universe.col_unit[i % r.n_cols]]) for r in universe.readers
                         for j, i in got if j == r.index)  # fmt: skip
            assert circuit.weight == pytest.approx(weight, rel=1e-9, abs=1e-9)


def test_block_ranking_options(universe):
    within = random_ranking(universe, "directions", torch.float64)
    with pytest.raises(ValueError, match="tiers"):
        edge_curves.BlockRanking(within, torch.zeros(universe.n_blocks, dtype=torch.float64), (0.5, 0.2, 1.0))
    with pytest.raises(ValueError, match="block scores"):
        edge_curves.BlockRanking(within, torch.zeros(3, dtype=torch.float64))


def test_block_sums_equal_a_loop(planted):
    universe, scores, _ = planted
    sums = edge_curves.block_sums(scores)
    for r in universe.readers[::3]:
        S = scores.directions(r).double()
        for w in universe.writers[: r.n_up]:
            want = float(S[:, w.offset : w.offset + w.size].sum())
            assert float(sums[int(universe.block_offsets[r.index]) + w.index]) == pytest.approx(want, abs=1e-9)


def test_planted_block_ranking_beats_random(planted):
    """The block rankings on the planted circuit: ``coreblocks_signed_fair`` (blocks by head-level EAP-IG, the top
    tenth of every block by |score| first) beats random by more than 0.3 CPR; ``blocks`` / ``headblocks`` (blocks
    whole by summed / head-level score) by more than 0.1 only: the embedding -> L0 value block, needed by every
    circuit, has a negative score (module docstring), so they keep it last; the reversed orders (lowest block and
    edge first; for the cores: each block's weakest nine tenths first) do not beat random."""
    universe, scores, test = planted
    ablation = EdgeAblation(universe, "ioi")
    sums = edge_curves.block_sums(scores)
    lowest = EdgeRanking(universe, "directions", lambda r: -scores.directions(r))
    weakest = EdgeRanking(universe, "directions", lambda r: -scores.directions(r).abs())
    specs = {
        **edge_curves.curve_specs(universe, scores, [f"{o}_signed_fair" for o in edge_curves.BLOCK_ORDERS]),
        "reversed": edge_curves.block_spec(edge_curves.BlockRanking(lowest, -sums), "fair"),
        "core_reversed": edge_curves.block_spec(edge_curves.BlockRanking(weakest, -scores.units, (0.9, 1.0)), "fair"),
        "random": random_spec(universe, "directions", 0),
    }
    curves, _ = curves_of_specs(ablation, [test], specs)
    cpr = {n: round(c.cpr, 3) for n, c in curves.items()}
    for c in curves.values():
        assert c.values[-1] == pytest.approx(1.0, abs=1e-9)
    random = curves["random"].cpr
    assert curves["coreblocks_signed_fair"].cpr > random + 0.3, cpr
    assert curves["blocks_signed_fair"].cpr > random + 0.1, cpr
    assert curves["headblocks_signed_fair"].cpr > random + 0.1, cpr
    assert curves["reversed"].cpr < random + 0.01, cpr
    assert curves["core_reversed"].cpr < random + 0.01, cpr


def _loop_net_over_gross(universe, directions):
    """Each block's ``|sum s| / sum |s|`` by a loop over readers and writers (0 for an all-zero block)."""
    out = {}
    for r in universe.readers:
        S = directions(r).double()
        for w in universe.writers[: r.n_up]:
            block = S[:, w.offset : w.offset + w.size]
            gross = float(block.abs().sum())
            out[(r.index, w.index)] = abs(float(block.sum())) / gross if gross > 0 else 0.0
    return out


def assert_sorts_its_keys(ranking, want_keys):
    """``ranking``'s scores equal ``want_keys`` (per reader unit) and ``select``'s cuts of it, raw and weighted, are
    the prefixes of a full sort of those keys."""
    universe = ranking.universe
    for r in universe.readers:
        torch.testing.assert_close(ranking.scores(r), want_keys[r.index], rtol=1e-12, atol=1e-15)
    brute = EdgeRanking(universe, "directions", lambda r: want_keys[r.index])
    for weighted in (False, True):
        total = float(universe.n_blocks) if weighted else ranking.count()
        targets = [1.0, 0.013 * total, 0.4 * total, total]
        for target, cut in zip(targets, select(ranking, targets, weighted)):
            assert kept_set(ranking, cut) == brute_force(brute, target, weighted), (weighted, target)


@pytest.mark.parametrize("sign", ["abs", "signed"])
def test_netblock_ranking_is_a_sort_of_its_keys(universe, sign):
    """``netblocks``: each edge's key ``|s_e| rho_b`` (signed: ``s_e rho_b``) equals the key computed here by a
    loop over the blocks, and ``select``'s cuts of it are the prefixes of a full sort of those keys; one block
    cancels exactly (rho 0), one is all zeros."""
    g = torch.Generator().manual_seed(5)
    table = {r.index: torch.randn(r.size, r.n_cols, generator=g, dtype=torch.float64) for r in universe.readers}
    r0 = next(r for r in universe.readers if r.n_up >= 3 and r.size % 2 == 0)
    w0, w1 = universe.writers[1], universe.writers[2]
    table[r0.index][:, w0.offset : w0.offset + w0.size] = 0.0
    half = torch.randn(r0.size // 2, w1.size, generator=g, dtype=torch.float64)
    table[r0.index][:, w1.offset : w1.offset + w1.size] = torch.cat([half, -half])
    scores = SimpleNamespace(universe=universe, directions=lambda r: table[r.index])
    rho = _loop_net_over_gross(universe, scores.directions)
    assert rho[(r0.index, w0.index)] == 0.0 and rho[(r0.index, w1.index)] < 1e-12
    want_keys = {}
    for r in universe.readers:
        S = table[r.index]
        factor = torch.tensor([rho[(r.index, int(universe.col_unit[c]))] for c in range(r.n_cols)], dtype=S.dtype)
        want_keys[r.index] = (S.abs() if sign == "abs" else S) * factor
    ranking = edge_curves.factor_ranking(scores, sign, edge_curves.block_factor(scores, "netblocks"))
    assert_sorts_its_keys(ranking, want_keys)


@pytest.mark.parametrize("sign", ["abs", "signed"])
def test_perweight_ranking_is_a_sort_of_its_keys(universe, sign):
    """``perweight``: each edge's key ``|s_e| K_w K_r`` (signed: ``s_e K_w K_r``, the directions of its writer unit
    and reader unit, counted here from the units) equals the ranking's, and ``select``'s cuts of it are the prefixes
    of a full sort of those keys."""
    g = torch.Generator().manual_seed(6)
    table = {r.index: torch.randn(r.size, r.n_cols, generator=g, dtype=torch.float64) for r in universe.readers}
    scores = SimpleNamespace(universe=universe, directions=lambda r: table[r.index])
    want_keys = {}
    for r in universe.readers:
        S = table[r.index]
        sizes = torch.cat([torch.full((w.size,), float(w.size * r.size)) for w in universe.writers[: r.n_up]])
        want_keys[r.index] = (S.abs() if sign == "abs" else S) * sizes.to(S.dtype)
    ranking = edge_curves.factor_ranking(scores, sign, edge_curves.block_factor(scores, "perweight"))
    assert_sorts_its_keys(ranking, want_keys)


def test_perweight_keeps_the_most_score_per_weighted_count(universe):
    """On the fair axis a ``perweight`` prefix holds at least the summed ``|s_e|`` of any ``|s_e|`` prefix of no
    more weighted count (greedy by score per weight: the knapsack's optimum for its own weight), and more on skewed
    scores; the ``|s_e|`` order, ranked the same way, does not keep as much (so the check can fail)."""
    g = torch.Generator().manual_seed(7)
    table = {r.index: torch.randn(r.size, r.n_cols, generator=g, dtype=torch.float64) ** 3 for r in universe.readers}
    scores = SimpleNamespace(universe=universe, directions=lambda r: table[r.index])
    per = edge_curves.factor_ranking(scores, "abs", edge_curves.block_factor(scores, "perweight"))
    plain = edge_curves.absolute(EdgeRanking(universe, "directions", scores.directions))

    def kept(ranking, target):
        edges = brute_force(ranking, target, weighted=True)
        flat = {
            r.index: (table[r.index].abs().reshape(-1), ranking.weights(r).expand(r.size, -1).reshape(-1))
            for r in universe.readers
        }
        return (sum(float(flat[u][0][i]) for u, i in edges), sum(float(flat[u][1][i]) for u, i in edges))

    gains = []
    for frac in (0.01, 0.05, 0.2, 0.5):
        score, weight = kept(per, frac * universe.n_blocks)
        other, _ = kept(plain, weight)  # the |s_e| prefix of at most the same weighted count
        assert score >= other - 1e-9, (frac, score, other)
        gains.append(score - other)
    assert max(gains) > 0.1, gains


@pytest.mark.parametrize("order", edge_curves.FACTOR_ORDERS)
def test_planted_factor_ranking_beats_random(planted, order):
    """On the planted circuit a factor order (``netblocks``, ``perweight``) with absolute scores beats random by more
    than 0.3 CPR (raw and fair axes); the control, the same ranking of the scores shuffled over every edge of the
    model (no structure left), does not."""
    universe, scores, test = planted
    ablation = EdgeAblation(universe, "ioi")
    flat = torch.cat([scores.directions(r).reshape(-1) for r in universe.readers])
    shuffled = flat[torch.randperm(len(flat), generator=torch.Generator().manual_seed(0))]
    sizes = [r.size * r.n_cols for r in universe.readers]
    parts = dict(zip([r.index for r in universe.readers], shuffled.split(sizes)))
    control = SimpleNamespace(universe=universe, directions=lambda r: parts[r.index].reshape(r.size, r.n_cols))
    specs = {
        **edge_curves.curve_specs(universe, scores, [f"{order}_abs_raw", f"{order}_abs_fair"]),
        "control": ranked_spec(
            edge_curves.factor_ranking(control, "abs", edge_curves.block_factor(control, order)), "raw"
        ),
        "random": random_spec(universe, "directions", 0),
    }
    curves, _ = curves_of_specs(ablation, [test], specs)
    cpr = {n: round(c.cpr, 3) for n, c in curves.items()}
    random = curves["random"].cpr
    assert curves[f"{order}_abs_raw"].cpr > random + 0.3, cpr
    assert curves[f"{order}_abs_fair"].cpr > random + 0.3, cpr
    assert curves["control"].cpr < random + 0.3, cpr
