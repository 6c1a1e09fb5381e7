"""The circuit graph builder (``analysis/circuit_graph.py``) on tiny float64 models.

* a planted two-step circuit (``tests/planted.py``: an earlier head's OV writes ``f``, a later head's QK reads
  it): the planted edge is the strongest into that reader, kept on every prompt;
* edge weights are an independent recount: for every edge, the mean over prompts of a fresh ``Decomposer.split``
  per prompt and reader (no coefficient table, no concatenation, no accumulator), 0 where the reader was not
  expanded (tolerance 1e-10 relative);
* ``unit="head"`` equals summing the direction-level sums that map to each head edge (1e-10);
* bad options fail in one line.
"""

from __future__ import annotations

import pytest
import torch

from lit_svd.addresses import Address
from lit_svd.analysis.circuit_graph import (
    METRIC,
    EdgeSums,
    GraphBuilder,
    GraphOptions,
    Units,
    build_graph,
    graph_edges,
    metric_weights,
)
from lit_svd.analysis.decompose import Decomposer, logit_reads, ov_reads, qk_reads
from lit_svd.models import view as make_view
from lit_svd.models.tiny import tiny_causal_lm
from tests.helpers import exact_rms_norms
from tests.planted import planted_batch, planted_model

TOL = 1e-10


@pytest.fixture(scope="module")
def planted():
    model, _, _ = planted_model()
    dec = Decomposer(make_view(model))
    batch = planted_batch(12)
    G, sums, per = build_graph(dec, "ioi", [batch], GraphOptions(threshold=0.05, depth=2))
    return dec, batch, G, sums, per


@pytest.fixture(scope="module")
def llama():
    """A random tiny Llama on IOI-style prompts of two lengths (padding), float64 end to end."""
    model = tiny_causal_lm("llama", vocab_size=64).double()
    dec = Decomposer(make_view(model))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 64, (6, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[3:, 7:] = 0
    batch = {
        "clean_ids": ids,
        "corrupt_ids": torch.randint(1, 64, (6, 9), generator=g),
        "attention_mask": mask,
        "answer_pos": mask.sum(1) - 1,
        "index": torch.arange(6),
        "correct_id": torch.randint(1, 64, (6,), generator=g),
        "wrong_id": torch.randint(1, 64, (6,), generator=g),
    }
    return model, dec, batch


def test_planted_edge_is_the_strongest_into_its_reader(planted):
    _, _, G, sums, _ = planted
    into = [e for e in sums.edges() if e["reader"] == "L1.qk.h0.d0" and e["reader_kind"] == "qk_key"]
    assert into, "the planted reader L1.qk.h0.d0 (key side) was not expanded"
    top = max(into, key=lambda e: e["abs_weight"])
    assert top["writer"] == "L0.ov.h0.d0", into[:3]
    assert top["kept_in"] == top["n_prompts"] == 12
    second = sorted(e["abs_weight"] for e in into)[-2] if len(into) > 1 else 0.0
    assert top["abs_weight"] > 10 * second
    # the graph: nodes keyed by str(Address), the edge with its attributes, the metric at the root
    data = G.get_edge_data("L0.ov.h0.d0", "L1.qk.h0.d0")["qk_key"]
    assert data["weight"] == pytest.approx(top["weight"]) and G.nodes["L0.ov.h0.d0"]["kind"] == "ov"
    assert G.nodes[METRIC]["kind"] == METRIC and G.has_edge("L1.ov.h0.d0", METRIC)
    assert len(graph_edges(G)) == len(sums.edges())


def _recount(dec, batch, per, n_prompts):
    """``{(writer, reader, kind): mean contribution}`` from a fresh split per prompt, reader and entry."""
    cache = dec.view.run_with_cache(dec.points(mix=True), batch["clean_ids"], batch["attention_mask"])
    weights = metric_weights(dec, cache, batch, "ioi")
    totals: dict = {}
    for (b, reader, kind), entries in per.entries.items():
        for (d, s), w in entries.items():
            if kind == "logit":
                reads = logit_reads(dec, cache, [b], [d], weights[b : b + 1])
            elif kind == "ov":
                reads = ov_reads(dec, cache, reader.layer, reader.group, [b], [d], [reader.index], mix=True)
            else:
                side = kind[3:]
                reads = qk_reads(
                    dec, cache, reader.layer, reader.group, [b], [d], [s], batch["attention_mask"], [reader.index],
                    side, relative=True,
                )  # fmt: skip
            split = dec.split(cache, reads)
            for node, value in zip(split.nodes, split.values[0].tolist()):
                key = (str(node), METRIC if reader is None else str(reader), kind)
                totals[key] = totals.get(key, 0.0) + w * value
    return {k: v / n_prompts for k, v in totals.items()}


def test_edge_weights_are_the_mean_of_per_prompt_contributions(llama):
    model, dec, batch = llama
    with exact_rms_norms(model):
        G, sums, per = build_graph(dec, "ioi", [batch], GraphOptions(threshold=0.03, depth=2))
        ref = _recount(dec, batch, per[0], len(batch["answer_pos"]))
    edges = sums.edges()
    kinds = {e["reader_kind"] for e in edges}
    assert {"logit", "ov", "qk_query", "qk_key"} <= kinds, kinds
    assert len(edges) > 30
    scale = max(abs(v) for v in ref.values())
    for e in edges:
        got = ref[(e["writer"], e["reader"], e["reader_kind"])]
        assert abs(e["weight"] - got) <= TOL * scale, (e, got)
    # an edge not kept on every prompt still counts its actual contribution where its reader was expanded
    partial = [e for e in edges if e["kept_in"] < e["expanded_in"]]
    assert partial and any(abs(e["weight"]) > 0 for e in partial)


def test_head_unit_sums_direction_edges(llama):
    model, dec, batch = llama
    opts = dict(threshold=0.03, depth=2)
    with exact_rms_norms(model):
        _, by_dir, _ = build_graph(dec, "ioi", [batch], GraphOptions(**opts))
        _, by_head, _ = build_graph(dec, "ioi", [batch], GraphOptions(unit="head", **opts))
    units = Units(dec, "head")
    expect: dict = {}
    for (reader, kind), r in by_dir.readers.items():
        for c in torch.nonzero(r["sum"]).flatten().tolist():
            key = (str(units(by_dir.nodes[c])), METRIC if reader is None else str(units(reader)), kind)
            expect[key] = expect.get(key, 0.0) + float(r["sum"][c]) / by_dir.n_prompts
    head_edges = by_head.edges()
    assert any(Address.parse(e["writer"]).size > 1 for e in head_edges if e["writer"] != "embed")
    assert len(head_edges) < len(by_dir.edges())
    scale = max(abs(v) for v in expect.values())
    for e in head_edges:
        assert abs(e["weight"] - expect[(e["writer"], e["reader"], e["reader_kind"])]) <= TOL * scale, e
        assert e["abs_weight"] >= abs(e["weight"]) - TOL * scale


def test_depth_one_is_the_metric_split(planted):
    dec, batch, _, _, _ = planted
    _, sums, per = build_graph(dec, "ioi", [batch], GraphOptions(threshold=0.05, depth=1))
    assert {e["reader"] for e in sums.edges()} == {METRIC}
    assert set(per[0].entries) == {(b, None, "logit") for b in range(12)}


def test_accumulators_merge_like_one_pass(llama):
    """Two halves of the prompts merged (what DDP ranks do) equal one pass over all of them."""
    model, dec, batch = llama
    opts = GraphOptions(threshold=0.03, depth=2)
    halves = [{k: v[i : i + 3] for k, v in batch.items()} for i in (0, 3)]
    with exact_rms_norms(model):
        _, whole, _ = build_graph(dec, "ioi", [batch], opts)
        parts = [build_graph(dec, "ioi", [h], opts)[1] for h in halves]
    merged = EdgeSums().merge(parts[0]).merge(parts[1])
    a = {(e["writer"], e["reader"], e["reader_kind"]): e for e in whole.edges()}
    b = {(e["writer"], e["reader"], e["reader_kind"]): e for e in merged.edges()}
    assert a.keys() == b.keys()
    for k in a:
        assert a[k]["kept_in"] == b[k]["kept_in"] and a[k]["expanded_in"] == b[k]["expanded_in"]
        assert a[k]["weight"] == pytest.approx(b[k]["weight"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"threshold": 0.0}, "threshold"),
        ({"threshold": 1.0}, "threshold"),
        ({"threshold": -0.2}, "threshold"),
        ({"depth": 0}, "depth"),
        ({"depth": 3}, "depth"),
        ({"readers": ("qk", "mlp")}, "readers"),
        ({"readers": ("attn",)}, "readers"),
        ({"unit": "layer"}, "unit"),
        ({"qk_top": 0}, "qk_top"),
    ],
)
def test_bad_options_fail_in_one_line(planted, kwargs, key):
    dec = planted[0]
    with pytest.raises(ValueError) as err:
        GraphBuilder(dec, "ioi", GraphOptions(**kwargs))
    msg = str(err.value)
    assert key in msg and "\n" not in msg
