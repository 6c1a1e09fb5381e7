"""Cross-method agreement (``analysis/agreement.py``): block-aware overlap against a brute-force count, the
hypergeometric chance level against an exact sum, random sets at chance (a control that can lose: a planted
set is far above it), and the two sources (a mask run's kept directions, the top SAD terms)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lit_svd.addresses import Address
from lit_svd.analysis.agreement import (
    agreement_rows,
    mask_kept,
    mask_universe,
    overlap_row,
    sad_top_terms,
    units,
)
from lit_svd.analysis.masks import hard_masks

UNIVERSE = {(0, "ov", 0): 8, (0, "ov", 1): 8, (1, "ov", 0): 8, (1, "ov", 1): 8}
PARTITION = {  # blocks (first, size); directions not listed are their own block
    (0, "ov", 0): [(0, 1), (1, 3), (4, 1), (5, 3)],
    (1, "ov", 1): [(0, 2), (2, 2), (4, 4)],
}


def brute_block(layer, kind, group, d):
    """The block of one direction, by scanning the partition's lists directly."""
    for first, size in PARTITION.get((layer, kind, group), []):
        if d in range(first, first + size):
            return (layer, kind, group, first)
    return (layer, kind, group, d)


def brute_overlap(graph, source):
    """Overlap by enumerating every direction of the universe: a block counts once if both sets touch it."""
    blocks_g, blocks_s, all_blocks = set(), set(), set()
    for (layer, kind, group), n in UNIVERSE.items():
        for d in range(n):
            b = brute_block(layer, kind, group, d)
            all_blocks.add(b)
            if any(a.layer == layer and a.kind == kind and a.group == group and d in a.directions for a in graph):
                blocks_g.add(b)
            if any(a.layer == layer and a.kind == kind and a.group == group and d in a.directions for a in source):
                blocks_s.add(b)
    return len(all_blocks), len(blocks_g), len(blocks_s), len(blocks_g & blocks_s)


def random_addresses(rng, n, blocks=True):
    out = []
    comps = list(UNIVERSE)
    for _ in range(n):
        layer, kind, group = rng.choice(comps)
        first = rng.randrange(8)
        size = rng.choice([1, 1, 2, 3]) if blocks else 1
        out.append(Address(layer, kind, group, first, min(size, 8 - first)))
    return out


def exact_p(N, K, n, k):
    """P(X >= k) for X ~ hypergeometric(N, K, n), summed from the definition."""
    total = math.comb(N, n)
    return sum(math.comb(K, j) * math.comb(N - K, n - j) for j in range(k, min(K, n) + 1)) / total


@pytest.mark.parametrize("seed", range(20))
def test_overlap_against_a_brute_force_count_and_the_exact_chance(seed):
    rng = random.Random(seed)
    graph = random_addresses(rng, rng.randrange(1, 10)) + [Address(0, "b_O"), Address(2, "ov", 0, 1)]  # outside
    source = random_addresses(rng, rng.randrange(1, 10))
    for partition in (PARTITION, None):
        row = overlap_row(graph, source, UNIVERSE, partition)
        if partition is None:  # every direction its own unit: count directions
            dirs = lambda s: {(a.layer, a.kind, a.group, d) for a in s for d in a.directions if a.is_direction}  # noqa: E731
            space = {(*c, d) for c, n in UNIVERSE.items() for d in range(n)}
            g, s = dirs(graph) & space, dirs(source) & space
            N, n, K, k = len(space), len(g), len(s), len(g & s)
        else:
            N, n, K, k = brute_overlap(graph, source)
        assert (row["units"], row["n_graph"], row["n_source"], row["overlap"]) == (N, n, K, k)
        assert row["n_graph_outside"] == 1  # L2.ov.h0.d1 (the bias has no unit)
        assert row["expected"] == pytest.approx(n * K / N, rel=1e-12)
        assert row["p_value"] == pytest.approx(exact_p(N, K, n, k), rel=1e-9, abs=1e-15)
    assert len(units([Address(0, "ov", 0, 2)], PARTITION)) == 1  # inside block 1-3
    assert units([Address(0, "ov", 0, 0, 8)], PARTITION) == {(0, "ov", 0, f) for f in (0, 1, 4, 5)}


def test_random_sets_overlap_at_chance_and_a_planted_set_does_not():
    """Random graph sets against a fixed source: the mean overlap is the hypergeometric expectation (within 3
    standard errors) and p < 0.05 about 5 % of the time at most; the source itself as the graph is far beyond."""
    rng = random.Random(0)
    space = [(*c, d) for c, n in UNIVERSE.items() for d in range(n)]
    source = [Address(layer, kind, group, d) for layer, kind, group, d in rng.sample(space, 6)]
    overlaps, low_p = [], 0
    for _ in range(2000):
        graph = [Address(layer, kind, group, d) for layer, kind, group, d in rng.sample(space, 5)]
        row = overlap_row(graph, source, UNIVERSE)
        overlaps.append(row["overlap"])
        low_p += row["p_value"] < 0.05
    expected = 5 * 6 / 32
    var = 5 * (6 / 32) * (26 / 32) * (27 / 31)
    assert abs(sum(overlaps) / len(overlaps) - expected) < 3 * math.sqrt(var / len(overlaps))
    assert low_p / 2000 <= 0.06  # a discrete test: at most its level, up to noise
    planted = overlap_row(source[:5], source, UNIVERSE)
    assert planted["overlap"] == 5 and planted["p_value"] < 1e-4 and planted["ratio"] > 5


def test_mask_source_reads_kept_directions_as_hard_masks_does():
    g = torch.Generator().manual_seed(0)
    lambdas = {"L0.ov": torch.rand(2, 8, generator=g), "L1.ov": torch.rand(2, 8, generator=g),
               "L1.mlp_out": torch.rand(1, 5, generator=g)}  # fmt: skip
    kept = mask_kept(lambdas, 0.5)
    hard = hard_masks(lambdas, 0.5)
    assert len(kept) == int(sum(h.sum() for h in hard.values()))
    assert all(hard[a.component][a.group, a.index] == 1 for a in kept)
    assert mask_universe(lambdas, ["ov"]) == {(0, "ov", 0): 8, (0, "ov", 1): 8, (1, "ov", 0): 8, (1, "ov", 1): 8}
    graph = [a for a in kept if a.kind == "ov"][:3] + [Address(2, "qk", 0, 0)]
    (row,) = agreement_rows("ioi", graph, mask=(lambdas, 0.5), mask_kinds=["ov"])
    assert row["source"] == "mask" and row["overlap"] == 3 and row["n_graph_outside"] == 1
    assert row["n_source"] == sum(int(hard[n].sum()) for n in ("L0.ov", "L1.ov")) and row["units"] == 32


def test_sad_source_takes_the_top_terms_of_the_graphs_heads():
    terms = {(2, 0): [0.1, -3.0, 0.2, 0.05], (2, 1): [1.0, 0.0, 0.0, 0.5], (5, 0): [9.0, 9.0, 9.0, 9.0]}
    assert sad_top_terms(terms, 2) == [
        Address(2, "qk", 0, 1), Address(2, "qk", 0, 2), Address(2, "qk", 1, 0), Address(2, "qk", 1, 3),
        Address(5, "qk", 0, 0), Address(5, "qk", 0, 1),
    ]  # fmt: skip
    graph = [Address(2, "qk", 0, 1), Address(2, "qk", 1, 2), Address(2, "ov", 1, 0)]
    (row,) = agreement_rows("gp", graph, sad_terms=terms, sad_top=2)
    # only the graph's heads (2, 0) and (2, 1) count: 8 units, top-2 each = 4, graph 2 units, 1 shared
    assert (row["units"], row["n_source"], row["n_graph"], row["overlap"]) == (8, 4, 2, 1)
    assert row["expected"] == pytest.approx(1.0) and row["n_graph_outside"] == 1
    with pytest.raises(ValueError, match="top=0"):
        sad_top_terms(terms, 0)
