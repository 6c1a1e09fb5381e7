"""Rankings of the faithfulness universe (lit_svd.analysis.rankings), and the planted-circuit control: on a tiny
model whose task metric can only flow through one head, the planted ranking and head-level attribution patching
beat three random rankings by a wide margin, and a ranking that puts the dead directions first loses to them."""

from __future__ import annotations

import math

import pytest
import torch

from lit_svd.addresses import Address
from lit_svd.analysis.attribution import Attributions, attributions
from lit_svd.analysis.faithfulness import MIB_SIZES, Universe, fair_weights, faithfulness_curves, universe_components
from lit_svd.analysis.rankings import (
    UNIT_TYPES,
    address_scores,
    eap_ranking,
    graph_node_scores,
    graph_ranking,
    mask_ranking,
    qk_to_map_scores,
    random_ranking,
    score_ranking,
    unit_directions,
    unit_rankings,
    writer_unit_scores,
)
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.models import view as make_view
from lit_svd.models.intervene import build_components
from lit_svd.models.tiny import tiny_causal_lm
from lit_svd.runs import load_run
from tests.planted import planted_llama


@pytest.fixture(scope="module")
def universe():
    view = make_view(tiny_causal_lm("llama", seed=1))  # 2 layers, 4 heads of 16 on 2 KV heads, d_mlp 128
    return Universe(universe_components(view))


def test_eap_ranking_expands_units_into_their_directions(universe):
    heads = torch.zeros(2, 4, dtype=torch.float64)
    heads[1, 3], heads[0, 2], heads[1, 2] = -5.0, 3.0, 2.0
    mlps = torch.tensor([1.0, 0.5], dtype=torch.float64)
    ranking, info = eap_ranking(universe, Attributions(heads, mlps, 4), n_kv_heads=2)
    assert sorted(ranking.tolist()) == list(range(len(universe)))
    first = [universe.address(int(i)) for i in ranking[:48]]
    # head L1.h3 (|-5| is the largest): its q, its KV head 1's k, its ov, interleaved by singular index
    assert [str(a) for a in first[:3]] == ["L1.q.h3.d0", "L1.k.h1.d0", "L1.ov.h3.d0"]
    assert {(a.kind, a.group) for a in first} == {("q", 3), ("k", 1), ("ov", 3)} and {a.layer for a in first} == {1}
    nxt = [universe.address(int(i)) for i in ranking[48 : 48 + 48]]  # L0.h2 brings L0's KV head 1
    assert {(a.layer, a.kind, a.group) for a in nxt} == {(0, "q", 2), (0, "k", 1), (0, "ov", 2)}
    then = [universe.address(int(i)) for i in ranking[96 : 96 + 32]]  # L1.h2 shares KV head 1 with L1.h3: no k
    assert {(a.layer, a.kind, a.group) for a in then} == {(1, "q", 2), (1, "ov", 2)}
    mlp = [universe.address(int(i)) for i in ranking[128 : 128 + 3]]  # then the MLP of layer 0
    assert [str(a) for a in mlp] == ["L0.mlp_in.d0", "L0.mlp_gate.d0", "L0.mlp_out.d0"]
    assert info["top_units"][:2] == ["L1.head.h3", "L0.head.h2"]


def test_mask_ranking_orders_by_lambda_from_a_run_folder(universe, tmp_path):
    g = torch.Generator().manual_seed(0)
    lambdas = {n: torch.rand(universe.shapes[i], generator=g) for i, n in enumerate(universe.names) if "L1" in n}
    torch.save({"lambdas": lambdas, "threshold": 0.5}, tmp_path / "masks.pt")
    state = load_run(tmp_path, need=("masks",)).masks
    ranking, info = mask_ranking(universe, state)
    flat = universe.flatten(lambdas)
    scored = int((~flat.isnan()).sum())
    assert info["directions_scored"] == scored == sum(t.numel() for t in lambdas.values())
    assert info["kept"] == int((flat >= 0.5).sum())
    top = flat[ranking[:scored]]
    assert torch.all(top[:-1] >= top[1:]) and not top.isnan().any()  # by lambda, descending
    assert flat[ranking[scored:]].isnan().all()  # the unmasked layer 0 after, in the seeded random order
    with pytest.raises(ValueError, match="joint qk"):
        mask_ranking(universe, {"lambdas": {"L0.qk": torch.ones(4, 16)}})


def test_mask_ranking_of_a_run_with_null_directions_leaves_them_out(universe):
    """A mask run built without ``drop_null`` masks the null directions too (bias-free MLP in / gate maps: one each
    per layer of the tiny Llama): they are the trailing singular indices, left out of the ranking."""
    view = make_view(tiny_causal_lm("llama", seed=1))
    comps = build_components(view, ["qk", "ov", "mlp"])
    g = torch.Generator().manual_seed(0)
    lambdas = {c.name: torch.rand(c.shape, generator=g) for c in comps}
    ranking, info = mask_ranking(universe, {"lambdas": lambdas, "threshold": 0.5})
    cut = {n: lam[:, : universe.shapes[universe.names.index(n)][1]] for n, lam in lambdas.items()}
    assert info["null_left_out"] == 2 * view.n_layers == sum(c.n_directions for c in comps) - len(universe)
    assert torch.equal(ranking, mask_ranking(universe, {"lambdas": cut, "threshold": 0.5})[0])


def test_graph_ranking_sums_edge_weights_per_node(universe):
    nx = pytest.importorskip("networkx")
    graph = nx.DiGraph()
    graph.add_edge("embed", "L0.q.h1.d2", weight=-3.0, abs_weight=3.0)
    graph.add_edge("L0.ov.h2.d0", "L1.q.h0.d0-1", weight=2.0, abs_weight=2.0)  # a block of two directions
    graph.add_edge("L0.ov.h2.d0", "L1.mlp_in.d5", weight=-0.5, abs_weight=0.5)
    graph.add_node("L1.b_O")
    scores = graph_node_scores(graph)
    assert scores[Address.parse("L0.ov.h2.d0")] == 2.5 and scores[Address.parse("L1.b_O")] == 0.0
    flat, info = address_scores(universe, scores)
    assert info == {"nodes_used": 4, "nodes_skipped": 2, "directions_scored": 5}  # embed and b_O are not directions
    graph.add_edge("L1.mlp_in.d5", "metric", weight=0.1, abs_weight=0.1)  # the root is not an address
    ranking, _ = graph_ranking(universe, graph)
    top = [str(universe.address(int(i))) for i in ranking[:5]]
    assert top[0] == "L0.q.h1.d2" and top[1] == "L0.ov.h2.d0" and set(top[2:4]) == {"L1.q.h0.d0", "L1.q.h0.d1"}
    assert top[4] == "L1.mlp_in.d5"


def test_graph_mlp_ranks_an_mlp_layers_inputs_at_its_strongest_output_direction(universe):
    edges = [
        {"writer": "L0.mlp_out.d3", "reader": "L1.ov.h0.d0", "abs_weight": 2.0},
        {"writer": "L0.mlp_out.d7", "reader": "metric", "abs_weight": 0.5},
        {"writer": "L1.ov.h0.d0", "reader": "metric", "abs_weight": 1.0},
    ]
    plain, _ = graph_ranking(universe, edges)
    ranking, info = graph_ranking(universe, edges, mlp_inputs=True)
    K = universe.shapes[universe.names.index("L0.mlp_in")][1]
    assert info["directions_scored"] == 3 + 2 * K  # layer 0's in and gate directions; layer 1 has no MLP node
    top = [str(universe.address(int(i))) for i in ranking[: 2 + 2 * K]]
    # L1.ov.h0.d0 (2 + 1) first, then L0.mlp_out.d3 (2), then layer 0's inputs at 2 by singular index
    assert top[:2] == ["L1.ov.h0.d0", "L0.mlp_out.d3"]
    assert [a.split(".")[-1] for a in top[2::2]] == [f"d{k}" for k in range(K)]
    assert {a.rsplit(".", 1)[0] for a in top[2:]} == {"L0.mlp_in", "L0.mlp_gate"}
    assert str(universe.address(int(ranking[2 + 2 * K]))) == "L0.mlp_out.d7"  # 0.5 after the inputs
    assert [str(universe.address(int(i))) for i in plain[:3]] == ["L1.ov.h0.d0", "L0.mlp_out.d3", "L0.mlp_out.d7"]


def test_qk_nodes_spread_over_the_q_and_k_maps_conserving_their_score():
    view = make_view(tiny_causal_lm("llama", seed=1))
    universe = Universe(universe_components(view))
    node = Address(1, "qk", 3, 2)  # head 3 reads KV head 1
    spread = qk_to_map_scores(view, universe, {node: 2.0, Address.parse("L0.ov.h1.d0"): 1.0})
    q = {a: v for a, v in spread.items() if a.kind == "q"}
    k = {a: v for a, v in spread.items() if a.kind == "k"}
    assert {(a.layer, a.group) for a in q} == {(1, 3)} and {(a.layer, a.group) for a in k} == {(1, 1)}
    assert sum(q.values()) == pytest.approx(2.0, rel=1e-5) and sum(k.values()) == pytest.approx(2.0, rel=1e-5)
    assert spread[Address.parse("L0.ov.h1.d0")] == 1.0
    edges = [{"writer": "L0.ov.h1.d0", "reader": str(node), "weight": -2.0, "abs_weight": 2.0}]
    ranking, info = graph_ranking(universe, edges, view)
    assert info["qk_nodes"] == 1 and str(universe.address(int(ranking[0]))) == "L0.ov.h1.d0"
    with pytest.raises(ValueError, match="qk nodes"):
        graph_ranking(universe, edges)


def test_planted_circuit_beats_random_and_the_reversed_ranking_loses(tokenizer):
    """On both size axes: the planted ranking, head-level EAP and direction EAP-IG beat three random rankings by more
    than 0.2 CPR, and so do the merged unit / direction orders (whole MLPs; whole units; whole units with the MLPs
    by head-level EAP-IG, ``eap_ig_hybrid``); direction EAP-IG gives every dead direction exactly 0 and ranks only
    live ones before them; the reversed ranking (live directions last) and the hybrid's order reversed lose to every
    random one."""
    from lit_svd.analysis.direction_attribution import WRITER_KINDS, direction_attributions, unit_attributions
    from lit_svd.models.patching import CircuitPatch

    model = planted_llama()
    view = make_view(model)
    comps = universe_components(view)
    universe = Universe(comps)
    live = torch.zeros(len(universe), dtype=torch.bool)
    for name in ("L1.q", "L1.k", "L1.ov"):
        sl = universe.slice(name)
        live[sl.start : sl.start + 16] = True  # head 0 / KV head 0 are the first group of each map
    planted = torch.where(live, 1.0, math.nan).double()
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=16, batch_size=16, seed=0)
    batches = list(dm.test_dataloader())
    attr = attributions(view, batches, "ioi")
    dead = torch.ones_like(attr.heads, dtype=torch.bool)
    dead[1, 0] = False
    assert attr.heads[dead].abs().max() == 0 and attr.mlps.abs().max() == 0 and attr.heads[1, 0] != 0
    patch = CircuitPatch(view, comps)
    ig = direction_attributions(patch, universe, batches, "ioi", steps=5).scores
    writers = direction_attributions(patch, universe, batches, "ioi", steps=5, kinds=WRITER_KINDS).scores
    head_ig = unit_attributions(universe, writers, view.n_layers, view.n_heads, len(batches[0]["answer_pos"]))
    mlp_scores = writer_unit_scores(universe, head_ig, view.n_kv_heads)
    weights = fair_weights(universe)
    hybrid = unit_rankings(universe, ig, weights, UNIT_TYPES, mlp_scores, "score")  # eap_ig_hybrid's order
    assert ig[~live].abs().max() == 0 and (ig[live] != 0).sum() > 24
    ig_rank = score_ranking(ig)  # signed, as CPR is scored
    assert live[score_ranking(ig.abs())[: int((ig != 0).sum())]].all() and live[ig_rank[: int((ig > 0).sum())]].all()
    rankings = {
        "planted": score_ranking(planted),
        "reversed": score_ranking(torch.nan_to_num(-planted, nan=0.0)),  # the 48 live directions last
        "eap_heads": eap_ranking(universe, attr, view.n_kv_heads)[0],
        "eap_ig": ig_rank,
        "mlps_whole": unit_rankings(universe, ig, weights)["signed"],  # eap_ig_mixed's order
        "units_whole": unit_rankings(universe, ig, weights, UNIT_TYPES, within="score")["signed"],  # eap_ig_units'
        "hybrid": hybrid["signed"],
        "hybrid_reversed": hybrid["signed"].flip(0),
        **{f"random_{s}": random_ranking(len(universe), s) for s in range(3)},
    }
    with torch.no_grad():
        curves, info = faithfulness_curves(view, comps, batches, rankings, "ioi", MIB_SIZES)
    assert abs(info["m_full"] - info["m_empty"]) > 1e-2
    for axis in ("raw", "fair"):
        cpr = {name: c[axis].cpr for name, c in curves.items()}
        print(axis, {k: round(v, 3) for k, v in cpr.items()})
        randoms = [cpr[f"random_{s}"] for s in range(3)]
        for name in ("planted", "eap_heads", "eap_ig", "mlps_whole", "units_whole", "hybrid"):
            assert cpr[name] > max(randoms) + 0.2, (axis, cpr)
        for name in ("reversed", "hybrid_reversed"):
            assert cpr[name] < min(randoms) - 0.05, (axis, cpr)
        assert curves["reversed"][axis].values[:9] == pytest.approx([0.0] * 9, abs=1e-9)  # nothing live until 100 %
    # 10 % keeps all 48 live directions (1e-6: the kept route adds their float32-projected change to the reference)
    assert curves["planted"]["raw"].values[6:] == pytest.approx([1.0] * 4, abs=1e-6)


def _unit_of(a: Address) -> tuple[str, str]:
    """(unit name, unit type) of a direction, written out from its address."""
    if a.kind.startswith("mlp"):
        return f"L{a.layer}.mlp", "mlp"
    return (f"L{a.layer}.kv{a.group}", "kv") if a.kind == "k" else (f"L{a.layer}.h{a.group}", "head")


def _loop_unit_ranking(universe, scores, weights, whole, within, signed, unit_scores=None):
    """The merged order written as a loop over addresses: items (whole units, single directions) sorted by their
    score (``unit_scores[unit]`` where given, else the sum of its directions') per fair weight; a whole unit expanded
    by singular index (eap_ranking's ``unit_directions``) or by its directions' own score per weight."""
    fn = (lambda v: v) if signed else abs  # noqa: E731
    units: dict[str, list[int]] = {}
    items = []
    for i in range(len(universe)):
        a = universe.address(i)
        unit, kind = _unit_of(a)
        if kind in whole:
            units.setdefault(unit, []).append(i)
        else:
            items.append((fn(float(scores[i] / weights[i])), [i]))
    for unit, flats in units.items():
        total = (unit_scores or {}).get(unit, sum(float(scores[i]) for i in flats))
        key = fn(total / sum(float(weights[i]) for i in flats))
        if within == "score":
            flats = sorted(flats, key=lambda i: -fn(float(scores[i] / weights[i])))
        else:
            a = universe.address(flats[0])
            maps = {"mlp": ("mlp_in", "mlp_gate", "mlp_out"), "kv": ("k",), "head": ("q", "ov")}[_unit_of(a)[1]]
            flats = unit_directions(universe, [(f"L{a.layer}.{m}", a.group) for m in maps])
        items.append((key, flats))
    items.sort(key=lambda item: -item[0])
    return [i for _, flats in items for i in flats]


@pytest.mark.parametrize("whole, within", [(("mlp",), "singular"), (("head", "kv", "mlp"), "score")])
def test_unit_rankings_equal_a_loop_over_addresses(universe, whole, within):
    """Random scores (no ties): the merged order of whole units and single directions per unit of fair size equals
    a loop over addresses, signed and absolute."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(len(universe), generator=g, dtype=torch.float64)
    weights = fair_weights(universe)
    got = unit_rankings(universe, scores, weights, whole=whole, within=within)
    for variant in ("signed", "absolute"):
        want = _loop_unit_ranking(universe, scores, weights, whole, within, variant == "signed")
        assert got[variant].tolist() == want, variant


@pytest.mark.parametrize("writer", [("mlp",), ("head", "mlp"), UNIT_TYPES])
def test_hybrid_ranking_equals_a_loop_with_the_writer_paths_unit_scores(universe, writer):
    """``eap_ig_hybrid`` (``writer=("mlp",)``) and the bench's variants: every unit whole, the units of ``writer``
    scored by head-level attribution, written out per unit (an MLP's, a head's, a KV head's as the sum of its query
    heads': exactly these floats), the others by their directions' sum; the merged order equals the loop's, signed
    and absolute."""
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(len(universe), generator=g, dtype=torch.float64)
    heads = Attributions(torch.randn(2, 4, generator=g, dtype=torch.float64), torch.randn(2, generator=g).double(), 4)
    weights = fair_weights(universe)
    unit_scores = writer_unit_scores(universe, heads, n_kv_heads=2, types=writer)
    want = {}
    for layer in (0, 1):
        if "mlp" in writer:
            want[f"L{layer}.mlp"] = float(heads.mlps[layer])
        for h in range(4) if "head" in writer else ():
            want[f"L{layer}.h{h}"] = float(heads.heads[layer, h])
        for kv in range(2) if "kv" in writer else ():  # 4 query heads on 2 KV heads: heads 2 kv, 2 kv + 1
            want[f"L{layer}.kv{kv}"] = float(heads.heads[layer, 2 * kv]) + float(heads.heads[layer, 2 * kv + 1])
    assert unit_scores.keys() == want.keys()
    assert all(unit_scores[u] == pytest.approx(v, abs=1e-15) for u, v in want.items())
    assert all(unit_scores[u] == v for u, v in want.items() if u.endswith("mlp"))  # exactly head-level EAP-IG's
    got = unit_rankings(universe, scores, weights, UNIT_TYPES, unit_scores, within="score")
    for variant in ("signed", "absolute"):
        expected = _loop_unit_ranking(universe, scores, weights, UNIT_TYPES, "score", variant == "signed", want)
        assert got[variant].tolist() == expected, variant
    with pytest.raises(ValueError, match="unit types are"):
        writer_unit_scores(universe, heads, 2, ("heads",))


def test_mixed_ranking_keeps_mlp_layers_whole_in_head_eap_order(universe):
    """MLP layers kept whole come as contiguous blocks, in the order and expansion head-level EAP gives MLPs with the
    same unit scores; each block costs one unit on the fair axis (1 / (L * H + L)), as a head circuit's MLP does;
    bad options fail in one line."""
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(len(universe), generator=g, dtype=torch.float64)
    weights = fair_weights(universe)
    layer_of = torch.tensor([universe.address(i).layer for i in range(len(universe))])
    mlp = torch.tensor([universe.address(i).kind.startswith("mlp") for i in range(len(universe))])
    for mlp_scores in ([0.7, -2.0], [-0.1, 0.3]):
        heads = Attributions(torch.randn(2, 4, generator=g, dtype=torch.float64), torch.tensor(mlp_scores), 4)
        got = unit_rankings(universe, scores, weights, unit_scores={"L0.mlp": mlp_scores[0], "L1.mlp": mlp_scores[1]})
        for variant in ("signed", "absolute"):
            ranking = got[variant]
            for layer in (0, 1):
                at = torch.nonzero(mlp[ranking] & (layer_of[ranking] == layer)).flatten()
                assert int(at[-1] - at[0]) == len(at) - 1  # one contiguous block
                assert float(weights[ranking[at]].sum()) == pytest.approx(1 / (2 * 4 + 2), abs=1e-12)
            head_order = eap_ranking(universe, heads, n_kv_heads=2, signed=variant == "signed")[0]
            assert torch.equal(ranking[mlp[ranking]], head_order[mlp[head_order]]), variant
    with pytest.raises(ValueError, match="whole=\\['mlps'\\]"):
        unit_rankings(universe, scores, weights, whole=["mlps"])
    with pytest.raises(KeyError, match="'L2.mlp' is not a unit"):
        unit_rankings(universe, scores, weights, unit_scores={"L2.mlp": 1.0})
