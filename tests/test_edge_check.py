"""The causal check per edge (``analysis/edge_check.py``) on tiny float64 models.

* planted two-step circuit (``tests/planted.py``): the planted edge ``L0.ov.h0.d0 -> L1.qk.h0.d0`` (key side)
  passes (z and the gap fraction), while random edges of the same writer (random readers of the same head's QK
  space, drawn apart from the null) pass at most 1 in 20;
* a patch whose writer is the same on the clean and the corrupted prompt changes nothing, for every reader kind
  (exact up to float64 rounding of a differently batched forward, 1e-10 of the metric);
* patching every upstream writer into an OV reader moves the reader's coefficient to its value with the
  corrupted residual read through the clean norm factor and pattern, computed by hand from the two caches
  (``resid_pre``, folded value / output maps; 1e-10), and the patched forward equals a forward with that change
  added by hand along the direction's write at the o projection (1e-10).
"""

from __future__ import annotations

import pytest
import torch

from lit_svd.addresses import Address
from lit_svd.analysis.causal import Z_PASS, summarize
from lit_svd.analysis.circuit_graph import GraphOptions, build_graph
from lit_svd.analysis.decompose import Decomposer, ov_reads
from lit_svd.analysis.edge_check import (
    MIN_GAP_FRACTION,
    Edge,
    check_batch,
    check_context,
    judge_edge,
    patched_changes,
    plan_edge,
    read_changes,
)
from lit_svd.metrics import forward_answer_logits, task_scorer
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, hooks
from lit_svd.models.points import eager_attention
from tests.planted import planted_batch, planted_model

PLANTED = Edge((Address(0, "ov", 0, 0),), Address(1, "qk", 0, 0), "qk_key")


@pytest.fixture(scope="module")
def planted():
    model, _, _ = planted_model()
    dec = Decomposer(make_view(model))
    batch = planted_batch(12)
    _, sums, per = build_graph(dec, "ioi", [batch], GraphOptions(threshold=0.05, depth=2))
    return model, dec, batch, sums, per[0]


def test_planted_edge_passes_and_random_edges_rarely_do(planted):
    _, dec, batch, sums, graphs = planted
    ctx = check_context(dec, batch, "ioi")
    row = judge_edge(PLANTED, check_batch(dec, ctx, graphs, [PLANTED], "ioi")[PLANTED])
    assert row["passes"] and row["z"] >= Z_PASS and row["gap_fraction"] >= 0.5, row
    # random edges of the same writer: 32 draws form the null (as in the check), 400 more are judged against it
    # (the null is heavy-tailed: over 10 null draws the rate ranged 0.25 % .. 3.25 %)
    plan = plan_edge(dec, ctx, graphs, PLANTED, "ioi", n_random=432, seed=1)
    change = patched_changes(dec, ctx, plan, "ioi").mean(0)
    null, others = change[1:33], change[33:]
    gap = float((ctx.m_clean - ctx.m_corrupt).mean())
    passed = [summarize(float(e), null)["passes"] and abs(float(e)) / gap >= MIN_GAP_FRACTION for e in others.tolist()]
    rate = sum(passed) / len(passed)
    print(f"random edges of L0.ov.h0.d0 into L1H0's QK space passing: {sum(passed)} / {len(passed)} = {rate:.3f}")
    assert rate <= 1 / 20


def test_checked_edges_of_the_graph_include_the_planted_one(planted):
    _, dec, batch, sums, graphs = planted
    ctx = check_context(dec, batch, "ioi")
    edges = [Edge.of(e) for e in sums.edges()[:4]]
    rows = [judge_edge(e, t) for e, t in check_batch(dec, ctx, graphs, edges, "ioi").items()]
    by = {(r["writer"], r["reader"], r["reader_kind"]): r for r in rows}
    assert by[("L0.ov.h0.d0", "L1.qk.h0.d0", "qk_key")]["passes"]
    # the query side's writer (the embedding of Q, the same token on both prompts) changes nothing
    q = by[("embed", "L1.qk.h0.d0", "qk_query")]
    assert abs(q["effect"]) <= 1e-12 * q["gap"] and not q["passes"] and not q["passes_z"]


@pytest.mark.parametrize("kind", ["logit", "ov", "qk_query", "qk_key"])
def test_identical_writer_changes_nothing(planted, kind):
    _, dec, batch, sums, graphs = planted
    same = {**batch, "corrupt_ids": batch["clean_ids"].clone()}
    ctx = check_context(dec, same, "ioi")
    first = next(Edge.of(e) for e in sums.edges() if e["reader_kind"] == kind)
    edge = Edge((Address(0, "ov", 0, 0), Address(-1, "embed")), first.reader, kind)  # writers that can change
    plan = plan_edge(dec, ctx, graphs, edge, "ioi", n_random=4)
    change = patched_changes(dec, ctx, plan, "ioi")
    assert change.abs().max() <= 1e-10 * ctx.m_clean.abs().max(), (edge, change)


def test_all_writers_into_an_ov_reader_equal_the_hand_computed_patch(planted):
    model, dec, batch, sums, graphs = planted
    view = dec.view
    l, h, k = 1, 0, 0
    reader = Address(l, "ov", h, k)
    ctx = check_context(dec, batch, "ioi")
    writers = tuple(dec.nodes[: 1 + dec.upstream("attn", l)])  # the embedding and every layer-0 node
    edge = Edge(writers, reader, "ov")
    B, T = batch["clean_ids"].shape
    d = int(batch["answer_pos"][0])
    # by hand: the mixed OV coefficient z_h(d) W_O v_k with the corrupted residual through the clean factor
    attn, svd_V = view.attn(l), dec.layers[l].ov_V[h][:, k]
    W_V, b_V, W_O = attn.W_V[h].double(), attn.b_V[h].double(), attn.W_O[h].double()

    def coefficient(resid):
        centred = resid - resid.mean(-1, keepdim=True)  # GPT-2: LayerNorm
        x = centred * ctx.clean["attn_factor", l]
        values = x @ W_V + b_V  # [B, T, d_head]
        z = torch.einsum("bs,bsc->bc", ctx.clean["pattern", l][:, h, d], values)
        return z @ W_O @ svd_V  # [B]

    resid = {
        key: view.run_with_cache([("resid_pre", l)], batch[key], batch["attention_mask"])["resid_pre", l]
        for key in ("clean_ids", "corrupt_ids")
    }
    by_hand = coefficient(resid["corrupt_ids"]) - coefficient(resid["clean_ids"])
    reads = ov_reads(dec, ctx.clean, l, h, torch.arange(B), torch.full((B,), d), [k], mix=True)
    ours = read_changes(dec, ctx, reads, writers)
    assert (ours - by_hand).abs().max() <= 1e-10 * by_hand.abs().max(), (ours, by_hand)
    assert by_hand.abs().max() > 1.0  # the corrupted prompt does change this read
    # the patched forward: add by_hand * v_k at d to the o projection's output, by hand
    graphs.entries.update({(b, reader, "ov"): {(d, -1): 1.0} for b in range(B)})
    plan = plan_edge(dec, ctx, graphs, edge, "ioi", n_random=2)
    got = patched_changes(dec, ctx, plan, "ioi")[:, 0]

    def add(module, args, kwargs, out):
        extra = torch.zeros_like(out)
        extra[:, d] = by_hand[:, None] * dec.layers[l].ov_V[h][:, k]
        return out + extra

    task = task_scorer("ioi")
    with torch.no_grad(), eager_attention(model), hooks(Hook(view.site_module(l, "o"), add, "post")):
        logits = forward_answer_logits(model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])
    ref = task.metric(logits, batch).double() - ctx.m_clean
    assert (got - ref).abs().max() <= 1e-10 * ctx.m_clean.abs().max(), (got, ref)
    assert ref.abs().max() > 1.0


def test_bad_edges_fail_in_one_line():
    for edge in (
        Edge((Address(0, "ov", 0, 0),), None, "ov"),
        Edge((Address(0, "ov", 0, 0),), Address(1, "qk", 0, 0), "mlp"),
        Edge((Address(0, "ov", 0, 0),), Address(1, "ov", 0, 0), "qk_key"),
    ):
        with pytest.raises(ValueError) as err:
            edge.check()
        assert "\n" not in str(err.value)
