"""Edge pruning (``analysis.edge_pruning``) and the soft blocks of the edge ablation it trains under:

* soft blocks of weight 0 / 1 run exactly the circuit of those whole blocks (``block_keep``; float64 tiny models of
  every architecture, 1e-9);
* the metric's gradient in the blocks' keep weights equals central finite differences (float64, norms and eager
  softmax exact: ``exact_rms_norms``, ``exact_softmax``), within 1e-6 of the largest;
* ``warm_start`` keeps the order of its scores and exactly the top ``keep`` fraction positive; ``recentre`` too;
* on the planted two-step circuit, from EAP-IG start scores with one link of the chain moved to the bottom, pruning
  finds the link back: the learned ranking's curve beats random by more than 0.3 CPR, the start ranking's does not.
"""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.edge_ablation import AllEdges, EdgeAblation, NoEdges
from lit_svd.analysis.edge_attribution import attribute
from lit_svd.analysis.edge_curves import edge_curves, random_spec, ranked_spec
from lit_svd.analysis.edge_pruning import (
    PruneOptions,
    SoftBlocks,
    prune_blocks,
    pruned_ranking,
    recentre,
    warm_start,
)
from lit_svd.analysis.edges import EdgeUniverse
from lit_svd.metrics import forward_answer_logits
from lit_svd.models import view as make_view
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm
from tests.helpers import exact_rms_norms, exact_softmax
from tests.planted import planted_batch, planted_model
from tests.test_edge_ablation import VOCAB, Setup, close


class Weights:
    """Soft blocks of given weights (``{reader index: [n_up]}``)."""

    def __init__(self, weights):
        self.weights = weights

    def block_weights(self, r):
        return self.weights[r.index]


@pytest.mark.parametrize("arch", ARCHITECTURES + HEAD_NORM_ARCHITECTURES)
def test_soft_blocks_of_zero_and_one_are_whole_blocks(arch):
    model = tiny_causal_lm(arch, vocab_size=VOCAB).double()
    with exact_rms_norms(model):
        s = Setup(model)
        g = torch.Generator().manual_seed(3)
        blocks = {r.index: torch.rand(r.n_up, generator=g) < 0.5 for r in s.universe.readers}

        class Blocks:
            def block_keep(self, r):
                return blocks[r.index]

        hard = s.run_edges(Blocks())
        assert (hard - s.clean).abs().max() > 1e-6 and (hard - s.corrupt).abs().max() > 1e-6
        close(s.run_edges(Weights({i: b.double() for i, b in blocks.items()})), hard, "soft blocks of 0 / 1")
        close(s.run_edges(Weights({i: torch.ones(len(b)) for i, b in blocks.items()})), s.clean, "all weights 1")


@pytest.mark.parametrize("arch", ARCHITECTURES + HEAD_NORM_ARCHITECTURES)
def test_gradient_in_the_keep_weights_equals_finite_differences(arch):
    model = tiny_causal_lm(arch, vocab_size=VOCAB).double()
    with exact_rms_norms(model), exact_softmax():
        s = Setup(model)
        u, b = s.universe, s.batch
        g = torch.Generator().manual_seed(5)
        w = {r.index: torch.rand(r.n_up, generator=g, dtype=torch.float64) for r in u.readers}

        def metric():
            with s.ablation.patched(b, Weights(w), s.ref):
                out = forward_answer_logits(model, b["clean_ids"], b["attention_mask"], b["answer_pos"])
            return s.ablation.task.metric(out, b).sum()

        for x in w.values():
            x.requires_grad_(True)
        metric().backward()
        grads = {i: x.grad.clone() for i, x in w.items()}
        largest = max(float(x.abs().max()) for x in grads.values())
        assert largest > 1e-4
        picks = [u.readers[0], u.readers[len(u.readers) // 2], u.readers[-2], u.readers[-1]]
        eps = 1e-4
        with torch.no_grad():
            for r in picks:
                for j in {0, r.n_up // 2, r.n_up - 1}:
                    w[r.index][j] += eps
                    up = metric()
                    w[r.index][j] -= 2 * eps
                    down = metric()
                    w[r.index][j] += eps
                    fd = float(up - down) / (2 * eps)
                    assert abs(fd - float(grads[r.index][j])) <= 1e-6 * largest, (str(r), j, fd, grads[r.index][j])


def test_warm_start_and_recentre():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(1000, generator=g, dtype=torch.float64)
    logits = warm_start(scores, 0.2)
    assert int((logits > 0).sum()) == 200
    assert torch.equal(torch.argsort(logits, descending=True), torch.argsort(scores.float(), descending=True))
    assert float(logits.max()) == pytest.approx(3.0) and float(logits.min()) == pytest.approx(-3.0)
    moved = logits + torch.randn(1000, generator=g)
    recentre(moved, 0.2)
    assert int((moved > 0).sum()) == 200
    with pytest.raises(ValueError, match="objective='kl'"):
        PruneOptions("kl")
    with pytest.raises(ValueError, match="keep=1"):
        PruneOptions(keep=1)


def test_soft_blocks_are_the_positive_logits():
    model = tiny_causal_lm("gpt2", vocab_size=VOCAB).double()
    u = EdgeUniverse(make_view(model))
    logits = torch.linspace(-1, 1, u.n_blocks, dtype=torch.float64)
    blocks = SoftBlocks(u, logits)
    for r in u.readers:
        part = logits[int(u.block_offsets[r.index]) : int(u.block_offsets[r.index + 1])]
        assert torch.equal(blocks.block_weights(r), (part > 0).double())


def test_planted_circuit_is_found_back():
    """Start scores with the planted key edge (L0.h0 -> L1 head 0's key) moved to the bottom: the start ranking's
    circuit lacks one link of the chain, and its curve does not beat random by 0.3 CPR (the control); pruning toward
    the full model's metric on other prompts finds the link back: its curve beats random by more than 0.3."""
    model, _, _ = planted_model()
    u = EdgeUniverse(make_view(model))
    ablation = EdgeAblation(u, "ioi")
    train, test = planted_batch(16, seed=0), planted_batch(16, seed=1)
    ref = ablation.reference(train)
    full, empty = ablation.metric(train, AllEdges(), ref), ablation.metric(train, NoEdges(u), ref)
    start = attribute(u, [train], "ioi").units.abs()
    key = next(r for r in u.readers if r.kind == "k" and r.layer == 1 and r.group == 0)
    assert str(u.writers[1]) == "L0.h0"
    start[int(u.block_offsets[key.index]) + 1] = 0.0
    keep = 4 / u.n_blocks  # the planted circuit's four blocks
    options = PruneOptions("faithful", steps=20, lr=0.2, keep=keep)
    logits, log = prune_blocks(ablation, [train], [ref], [full], [empty], start, options)
    assert min(log.objective) < log.objective[0]
    specs = {
        "pruned": ranked_spec(pruned_ranking(u, logits), "raw"),
        "start": ranked_spec(pruned_ranking(u, warm_start(start, keep)), "raw"),
        "random": random_spec(u, "units", 0),
    }
    curves, _ = edge_curves(ablation, [test], specs)
    cpr = {n: round(c.cpr, 3) for n, c in curves.items()}
    assert curves["pruned"].cpr > curves["random"].cpr + 0.3, cpr
    assert curves["start"].cpr < curves["random"].cpr + 0.3, cpr
