"""Edge pruning (``analysis.edge_pruning``) and the soft blocks of the edge ablation it trains under:

* soft blocks of weight 0 / 1 run exactly the circuit of those whole blocks (``block_keep``; float64 tiny models of
  every architecture, 1e-9);
* the metric's gradient in the blocks' keep weights equals central finite differences (float64, norms and eager
  softmax exact: ``exact_rms_norms``, ``exact_softmax``), within 1e-6 of the largest;
* ``warm_start`` keeps the order of its scores and exactly the top ``keep`` fraction positive; ``cut`` too;
* on the planted two-step circuit, from EAP-IG start scores with one link of the chain moved to the bottom, pruning
  finds the link back: the learned ranking's curve beats random by more than 0.3 CPR, the start ranking's does not.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lit_svd.analysis.edge_ablation import AllEdges, EdgeAblation, NoEdges, UnitMasks
from lit_svd.analysis.edge_attribution import attribute
from lit_svd.analysis.edge_curves import edge_curves, random_spec, ranked_spec
from lit_svd.analysis.edge_options import PruneOptions
from lit_svd.analysis.edge_pruning import (
    DirectionSizes,
    SoftBlocks,
    SoftDirections,
    _Circuits,
    _optimizer,
    cut,
    direction_cut,
    direction_spec,
    prune_blocks,
    pruned_curves,
    pruned_ranking,
    single_directions,
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
        u = s.universe
        g = torch.Generator().manual_seed(5)
        w = {r.index: torch.rand(r.n_up, generator=g, dtype=torch.float64) for r in u.readers}

        picks = [u.readers[0], u.readers[len(u.readers) // 2], u.readers[-2], u.readers[-1]]
        at = {r.index: sorted({0, r.n_up // 2, r.n_up - 1}) for r in picks}
        assert_gradient_is_finite_differences(s, Weights(w), w, lambda grads: at)


def assert_gradient_is_finite_differences(s, circuit, weights, picks, eps=1e-4):
    """The metric's gradient in ``weights`` (``{key: tensor}``, read by ``circuit``) against central finite
    differences at ``picks(grads)`` (``{key: [indices]}``), within 1e-6 of the largest gradient."""
    b = s.batch

    def metric():
        with s.ablation.patched(b, circuit, s.ref):
            out = forward_answer_logits(s.model, b["clean_ids"], b["attention_mask"], b["answer_pos"])
        return s.ablation.task.metric(out, b).sum()

    for x in weights.values():
        x.requires_grad_(True)
    metric().backward()
    grads = {k: x.grad.clone() for k, x in weights.items()}
    largest = max(float(x.abs().max()) for x in grads.values())
    assert largest > 1e-4
    with torch.no_grad():
        for k, indices in picks(grads).items():
            x = weights[k]
            for j in indices:
                x[j] += eps
                up = metric()
                x[j] -= 2 * eps
                down = metric()
                x[j] += eps
                fd = float(up - down) / (2 * eps)
                assert abs(fd - float(grads[k][j])) <= 1e-6 * largest, (k, j, fd, grads[k][j])


def test_warm_start_and_cut():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(1000, generator=g, dtype=torch.float64)
    logits = warm_start(scores, 0.2)
    assert int((logits > 0).sum()) == 200
    assert torch.equal(torch.argsort(logits, descending=True), torch.argsort(scores.float(), descending=True))
    assert float(logits.max()) == pytest.approx(3.0) and float(logits.min()) == pytest.approx(-3.0)
    moved = logits + torch.randn(1000, generator=g)
    assert int((moved > cut(moved, 0.2)).sum()) == 200
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


def _direction_logits(u, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randn(u.n_blocks, generator=g, dtype=dtype) + 0.8
    writers = torch.randn(u.n_writer_cols, generator=g, dtype=dtype) + 0.8
    readers = torch.randn(u.n_reader_directions, generator=g, dtype=dtype) + 0.8
    readers[-1] = writers[0] = 2.0  # the logits' one direction and the embedding kept (else the corrupted run)
    return blocks, writers, readers


@pytest.mark.parametrize("arch", ARCHITECTURES + HEAD_NORM_ARCHITECTURES)
def test_soft_directions_of_zero_and_one_are_their_direction_circuit(arch):
    """Soft directions (weights ``y_k w_U x_i`` of 0 / 1) run exactly the direction circuit of that mask through the
    hard path (its own code: partial blocks, mixed columns, the unit's norm factor); all logits positive give the
    clean forward."""
    model = tiny_causal_lm(arch, vocab_size=VOCAB).double()
    with exact_rms_norms(model):
        s = Setup(model)
        u = s.universe
        soft = SoftDirections(u, *_direction_logits(u, 7))
        masks = {r.index: soft.keep(r) for r in u.readers}
        partial = [r for r in u.readers if 0 < int(masks[r.index].sum()) < masks[r.index].numel()]
        assert len(partial) > len(u.readers) // 2
        hard = s.run_edges(UnitMasks(masks))
        assert (hard - s.clean).abs().max() > 1e-6 and (hard - s.corrupt).abs().max() > 1e-6
        close(s.run_edges(soft), hard, "soft directions of 0 / 1")
        everything = SoftDirections(u, *(x.abs() + 1 for x in _direction_logits(u, 7)))
        close(s.run_edges(everything), s.clean, "all logits positive")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_gradient_in_the_direction_weights_equals_finite_differences(arch):
    """The metric's gradient in the block, writer and reader weights of soft directions (weights in (0, 1)) equals
    central finite differences within 1e-6 of the largest."""
    model = tiny_causal_lm(arch, vocab_size=VOCAB).double()
    with exact_rms_norms(model), exact_softmax():
        s = Setup(model)
        u = s.universe
        g = torch.Generator().manual_seed(11)
        w = {"blocks": torch.rand(u.n_blocks, generator=g, dtype=torch.float64),
             "writers": torch.rand(u.n_writer_cols, generator=g, dtype=torch.float64),
             "readers": torch.rand(u.n_reader_directions, generator=g, dtype=torch.float64)}  # fmt: skip

        class Weights:
            def block_weights(self, r):
                return w["blocks"][u.blocks(r)]

            def writer_weights(self):
                return w["writers"]

            def reader_weights(self, r):
                return w["readers"][r.offset : r.offset + r.size]

        def picks(grads):
            return {k: torch.topk(grads[k].abs(), 3).indices.tolist() + [0, len(w[k]) - 1] for k in w}

        assert_gradient_is_finite_differences(s, Weights(), w, picks)


def test_direction_cut_is_the_largest_circuit_within_the_weighted_count():
    """``direction_cut`` against brute force over every distinct logit: the weighted count (by ``SoftDirections``'
    masks and the universe's edge weights) of its circuit is at most the target and the next larger circuit's is
    above it."""
    model = tiny_causal_lm("llama", vocab_size=VOCAB).double()
    u = EdgeUniverse(make_view(model))
    sizes = DirectionSizes(u)
    logits = _direction_logits(u, 3, torch.float32)

    def weighted(t):
        c = SoftDirections(u, *logits, threshold=t)
        return sum(float((c.keep(r).double() * u.block_weights(r)[u.col_unit[: r.n_cols]]).sum()) for r in u.readers)

    for keep in (0.05, 0.2, 0.5):
        t = direction_cut(sizes, *logits, keep)
        assert weighted(t) == pytest.approx(sizes(*logits, t), rel=1e-9)
        assert weighted(t) <= keep * u.n_blocks + 1e-9
        below = torch.cat(logits)[torch.cat(logits) < t].max()
        assert weighted(float(below) - 1e-7) > keep * u.n_blocks


def test_direction_cut_holds_pinned_logits_kept():
    """Logits pinned at +inf (``single_directions``) are in every cut's circuit and never the cut: the circuit is still
    the largest within the weighted count, by brute force over the finite logits."""
    model = tiny_causal_lm("llama", vocab_size=VOCAB).double()
    u = EdgeUniverse(make_view(model))
    sizes = DirectionSizes(u)
    blocks, writers, readers = _direction_logits(u, 4, torch.float32)
    one_writer, one_reader = single_directions(u)
    writers[one_writer], readers[one_reader] = torch.inf, torch.inf
    finite = torch.cat([blocks, writers[~one_writer], readers[~one_reader]])
    for keep in (0.05, 0.2, 0.5):
        t = direction_cut(sizes, blocks, writers, readers, keep)
        assert torch.isfinite(torch.tensor(t))
        c = SoftDirections(u, blocks, writers, readers, threshold=t)
        assert bool(c.keep(u.readers[-1]).any())  # the logits' one direction, kept
        assert sizes(blocks, writers, readers, t) <= keep * u.n_blocks + 1e-9
        below = finite[finite < t].max()
        assert sizes(blocks, writers, readers, float(below) - 1e-7) > keep * u.n_blocks


def test_units_of_one_direction_are_pinned_and_a_run_that_never_cut_them_is_unchanged(monkeypatch):
    """The embedding's and the logits' one direction (units of one direction) are pinned: their logits +inf for the
    whole run, never cut. On the planted model with them free (the old code) the ``metric`` run cuts one at step 6:
    every block at once, the objective exactly the empty circuit's (0), before the next step restores it; pinned, the
    same run goes on from step 5's circuit. The ``faithful`` run, which never cuts them free, trains the same logits
    pinned, step by step: pinning only removes the steps that cut such a unit."""
    import lit_svd.analysis.edge_pruning as edge_pruning

    model, _, _ = planted_model()
    u = EdgeUniverse(make_view(model))
    one_writer, one_reader = single_directions(u)
    assert bool(one_writer[0]) and int(one_writer.sum()) == sum(w.size == 1 for w in u.writers)
    assert bool(one_reader[u.readers[-1].offset]) and int(one_reader.sum()) == sum(r.size == 1 for r in u.readers)
    ablation = EdgeAblation(u, "ioi")
    train = planted_batch(16, seed=0)
    ref = ablation.reference(train)
    full, empty = ablation.metric(train, AllEdges(), ref), ablation.metric(train, NoEdges(u), ref)
    start = attribute(u, [train], "ioi").units
    runs = {}
    for pinned in (True, False):
        if not pinned:  # the old code: every direction logit free
            free = (torch.zeros_like(one_writer), torch.zeros_like(one_reader))
            monkeypatch.setattr(edge_pruning, "single_directions", lambda universe: free)
        for objective in ("metric", "faithful"):
            options = PruneOptions(objective, steps=15, lr=0.1, keep=6 / u.n_blocks, level="directions")
            runs[pinned, objective] = prune_blocks(ablation, [train], [ref], [full], [empty], start, options)
    for objective in ("metric", "faithful"):
        (_, writers, readers), _ = runs[True, objective]
        assert bool(torch.isinf(writers[one_writer]).all()) and bool(torch.isinf(readers[one_reader]).all())
        assert bool(torch.isfinite(writers[~one_writer]).all()) and bool(torch.isfinite(readers[~one_reader]).all())
    pinned, free = runs[True, "metric"][1].objective, runs[False, "metric"][1].objective
    assert free[:6] == pytest.approx(pinned[:6], rel=1e-6) and pinned[5] < -0.1
    assert free[6] == pytest.approx(0.0, abs=1e-9) and pinned[6] < pinned[5]  # free: the empty circuit
    (b1, w1, r1), log1 = runs[True, "faithful"]
    (b0, w0, r0), log0 = runs[False, "faithful"]
    assert bool((w0[one_writer] > 0).all()) and bool((r0[one_reader] > 0).all()) and max(log0.objective) > 0.1
    assert log0.objective == pytest.approx(log1.objective, rel=1e-6, abs=1e-9)
    assert torch.allclose(b0, b1, atol=1e-5)
    assert torch.allclose(w0[~one_writer], w1[~one_writer], atol=1e-5)
    assert torch.allclose(r0[~one_reader], r1[~one_reader], atol=1e-5)


def test_proportional_direction_steps_follow_the_gradient_and_adam_steps_do_not():
    """``direction_step="proportional"``: each writer / reader logit moves ``lr`` times its gradient over the largest of
    them (step 1), then by a moving average (``MOMENTUM``) of those; a pinned (+inf) logit stays pinned; the block
    logits take Adam's step either way. With ``adam`` a gradient 1,000 times smaller moves its logit as far (the
    reason for the option). ``direction_lr`` scales the direction logits' steps only. Hand-computed steps,
    float64."""
    from lit_svd.analysis.edge_pruning import MOMENTUM

    lr, inf = 0.1, float("inf")
    g1 = tuple(torch.tensor(g, dtype=torch.float64) for g in ([1e-3, -2e-3], [2.0, 0.002, 0.0], [-1.0, 0.0]))
    g2 = tuple(torch.tensor(g, dtype=torch.float64) for g in ([1e-3, -2e-3], [0.5, -0.01, 0.0], [0.25, 0.1]))
    moved = {}
    for how in ("proportional", "adam"):
        params = [torch.zeros(2, dtype=torch.float64), torch.tensor([0.5, 0.5, inf], dtype=torch.float64),
                  torch.full((2,), 0.5, dtype=torch.float64)]  # fmt: skip
        params = [p.requires_grad_() for p in params]
        step = _optimizer(params, PruneOptions(lr=lr, level="directions", direction_step=how))
        for grads in (g1, g2):
            for p, g in zip(params, grads):
                p.grad = g.to(p.dtype).clone()
            step()
            if grads is g1:
                moved[how] = [p.detach().clone() for p in params]
        moved[how, 2] = [p.detach() for p in params]
    (b, w, r), (_, w2, r2) = moved["proportional"], moved["proportional", 2]
    assert torch.allclose(
        b, torch.tensor([-lr, lr], dtype=torch.float64), rtol=0, atol=2e-6
    )  # Adam: lr g / (|g| + eps)
    assert torch.allclose(w[:2], torch.tensor([0.5 - lr, 0.5 - lr * 1e-3], dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.allclose(r, torch.tensor([0.5 + lr / 2, 0.5], dtype=torch.float64), rtol=0, atol=1e-12)
    scaled = [torch.tensor([0.5 / 0.5, -0.01 / 0.5]), torch.tensor([0.25 / 0.5, 0.1 / 0.5])]  # g2 over its largest
    first = [torch.tensor([1.0, 1e-3]), torch.tensor([-0.5, 0.0])]
    for before, after, s1, s2 in zip((w[:2], r), (w2[:2], r2), first, scaled):
        average = MOMENTUM * s1 + (1 - MOMENTUM) * s2
        assert torch.allclose(after, before - lr * average.double(), rtol=0, atol=1e-7)  # the tensors' float32
    assert bool(torch.isinf(w[2])) and bool(torch.isinf(w2[2])) and float(w2[2]) > 0
    _, wa, ra = moved["adam"]
    assert torch.allclose(wa[:2], torch.tensor([0.5 - lr, 0.5 - lr], dtype=torch.float64), rtol=0, atol=2e-6)
    assert float(ra[1]) == 0.5  # no gradient, no step
    for how in ("proportional", "adam"):  # direction_lr: the direction logits' own rate, the blocks' unchanged
        params = [torch.zeros(2, dtype=torch.float64, requires_grad=True) for _ in range(3)]
        step = _optimizer(params, PruneOptions(lr=lr, level="directions", direction_step=how, direction_lr=3 * lr))
        for p, g in zip(params, g1):
            p.grad = g[:2].clone()
        step()
        want = {"proportional": -3 * lr * g1[1][:2] / 2.0, "adam": torch.tensor([-3 * lr, -3 * lr])}[how]
        assert torch.allclose(params[1].detach(), want.double(), rtol=0, atol=2e-5)
        assert torch.allclose(params[0].detach(), b, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="direction_step='sgd'"):
        PruneOptions(direction_step="sgd")
    with pytest.raises(ValueError, match="direction_lr=0"):
        PruneOptions(direction_lr=0)


def _planted_pruning(n: int):
    """The planted model's universe, ablation, ``n`` training prompts, their corrupted recording, full and empty
    metrics, and EAP-IG's head-level start scores."""
    model, _, _ = planted_model()
    u = EdgeUniverse(make_view(model))
    ablation = EdgeAblation(u, "ioi")
    train = planted_batch(n, seed=0)
    ref = ablation.reference(train)
    full, empty = ablation.metric(train, AllEdges(), ref), ablation.metric(train, NoEdges(u), ref)
    return u, ablation, train, ref, full, empty, attribute(u, [train], "ioi").units


def test_the_log_ends_with_the_objective_of_the_learned_logits():
    """``PruneLog.final`` is the objective of the logits returned (after the last step, which no step's objective
    sees): the faithful objective of their circuit (the positive logits) computed here through
    ``EdgeAblation.metric``, at both levels (float64 planted model, 1e-9)."""
    u, ablation, train, ref, full, empty, start = _planted_pruning(8)
    gap = float(full.mean() - empty.mean())
    for level in ("units", "directions"):
        options = PruneOptions("faithful", steps=4, lr=0.3, keep=6 / u.n_blocks, level=level)
        logits, log = prune_blocks(ablation, [train], [ref], [full], [empty], start, options)
        circuit = SoftDirections(u, *logits) if level == "directions" else SoftBlocks(u, logits)
        want = float((((ablation.metric(train, circuit, ref) - full) / gap) ** 2).mean())
        assert log.final == pytest.approx(want, rel=1e-9, abs=1e-12), level
        assert len(log.objective) == 4
    assert abs(log.final - log.objective[-1]) > 1e-3  # directions: the last step moved the circuit (0.634 vs 0.645)


def test_pruning_in_chunks_of_prompts_is_the_same_run():
    """``pruned_curves(chunk=3)`` on 8 prompts (three forwards and backwards a step) trains the same circuits as one
    batch of 8: the gradient is the sum over prompts either way, so every step's objective agrees to 1e-5 and the
    learned circuit is the same. (Not the logits to 1e-5: Adam turns the rounding of a near-zero gradient into a step
    of up to ``lr``.)"""
    model, _, _ = planted_model()
    u = EdgeUniverse(make_view(model))
    ablation = EdgeAblation(u, "ioi")
    batch = planted_batch(8, seed=0)
    start = attribute(u, [batch], "ioi").units
    options = PruneOptions("faithful", steps=6, lr=0.1, keep=6 / u.n_blocks, level="directions")
    runs, logits = {}, {}
    for chunk in (None, 3):
        keep = lambda name, x, c=chunk: logits.__setitem__(c, x)  # noqa: E731
        _, runs[chunk] = pruned_curves(
            ablation, batch, start, ["prunedirs_abs_fair"], options, keep_logits=keep, chunk=chunk
        )
    one, chunked = runs[None]["prunedirs_abs_fair"], runs[3]["prunedirs_abs_fair"]
    assert (one["chunk"], chunked["chunk"], chunked["prompts"]) == (8, 3, 8)
    assert chunked["objective"] == pytest.approx(one["objective"], rel=1e-5, abs=1e-9)
    assert max(one["objective"]) > 0
    for a, b in zip(logits[None], logits[3]):
        assert torch.equal(a > 0, b > 0) and torch.equal(a.isinf(), b.isinf())  # the same circuit, the same pins
    with pytest.raises(ValueError, match="chunk=0"):
        pruned_curves(ablation, batch, start, ["prunedirs_abs_fair"], options, chunk=0)


def test_each_step_goes_to_on_step_and_words_to_progress():
    """``pruned_curves``: with ``on_step`` every step's objective goes there (the run's log, in order) and
    ``progress`` gets only words, no step line; without it the steps are lines of ``progress``."""
    model, _, _ = planted_model()
    u = EdgeUniverse(make_view(model))
    ablation = EdgeAblation(u, "ioi")
    batch = planted_batch(4, seed=0)
    start = attribute(u, [batch], "ioi").units
    options = PruneOptions("faithful", steps=3, lr=0.1, keep=6 / u.n_blocks)
    steps, lines = [], []
    _, runs = pruned_curves(ablation, batch, start, ["pruned_abs_raw"], options, lines.append,
                            on_step=lambda *s: steps.append(s))  # fmt: skip
    assert steps == [("pruned_abs_raw", i, v) for i, v in enumerate(runs["pruned_abs_raw"]["objective"])]
    assert len(steps) == 3 and lines and not any(" step " in line for line in lines)
    lines.clear()
    pruned_curves(ablation, batch, start, ["pruned_abs_raw"], options, lines.append)
    assert sum(line.startswith("pruned_abs_raw step ") for line in lines) == 3


def test_direction_pruning_starts_from_the_head_level_circuit_and_its_curve_is_nested_cuts():
    """At the direction level, step 0's circuit is the head-level warm start (every direction kept) and the run
    lowers its objective on the planted model; the curve's circuits are nested, their weighted counts (by their masks
    and the universe's edge weights) within the sizes, the trained circuit the cut at its size."""
    u, ablation, train, ref, full, empty, start = _planted_pruning(16)
    keep = 6 / u.n_blocks
    options = PruneOptions("metric", steps=1, lr=0.1, keep=keep, level="directions")
    _, log0 = prune_blocks(ablation, [train], [ref], [full], [empty], start, options)
    _, head = prune_blocks(ablation, [train], [ref], [full], [empty], start, replace(options, level="units"))
    assert log0.objective[0] == pytest.approx(head.objective[0], abs=1e-9)
    (blocks, writers, readers), log = prune_blocks(
        ablation, [train], [ref], [full], [empty], start, replace(options, steps=15)
    )
    assert min(log.objective) < log.objective[0]
    trained = SoftDirections(u, blocks, writers, readers)  # the circuit trained: the logits above 0
    sizes = sorted((0.01, 0.1, keep, 0.5, 0.9, 1.0))
    for order in ("min", "blocks"):
        circuits = direction_spec(u, blocks, writers, readers, order).circuits(sizes)
        masks = [{r.index: c.keep(r) for r in u.readers} for c, _, _ in circuits]
        for (_, kept, weight), size, mask in zip(circuits, sizes, masks):
            assert kept == sum(int(m.sum()) for m in mask.values())
            by_mask = sum(
                float((m.double() * u.block_weights(r)[u.col_unit[: r.n_cols]]).sum())
                for r, m in zip(u.readers, mask.values())
            )
            assert weight == pytest.approx(by_mask, rel=1e-9) and weight <= size * u.n_blocks + 1e-9, order
        for small, large in zip(masks, masks[1:]):  # nested: one ranking
            assert all(bool((small[i] <= large[i]).all()) for i in small), order
        assert circuits[-1][1] == u.counts()["directions"]
        at_keep = masks[sizes.index(keep)]
        assert all(bool((trained.keep(r) <= at_keep[r.index]).all()) for r in u.readers), order
        if order == "min":
            assert all(torch.equal(trained.keep(r), at_keep[r.index]) for r in u.readers)
    with pytest.raises(ValueError, match="order='max'"):
        direction_spec(u, blocks, writers, readers, "max")


def test_a_run_states_the_directions_it_drops_and_says_when_it_drops_none():
    """``pruned_curves``' ``dropped``: the writer and reader directions of logit <= 0, the ones the trained circuit
    (every block here) reads or writes through no edge; with none dropped the run says its trained circuit is whole
    blocks."""
    model, _, _ = planted_model()
    u = EdgeUniverse(make_view(model))
    ablation = EdgeAblation(u, "ioi")
    batch = planted_batch(8, seed=0)
    start = attribute(u, [batch], "ioi").units
    keep = 0.3
    options = PruneOptions("metric", keep=keep, level="directions")
    blocks, writers, readers = _direction_logits(u, 3, torch.float32)
    blocks[:] = 1.0  # every block in every circuit: the directions alone decide
    assert (writers <= 0).any() and (readers <= 0).any()
    said: list[str] = []
    _, runs = pruned_curves(
        ablation, batch, start, ["prunedirs_signed_fair"], options, said.append,
        trained={"prunedirs_signed_fair": (blocks, writers, readers)},
    )  # fmt: skip
    dropped = runs["prunedirs_signed_fair"]["dropped"]
    assert dropped == {"writers": int((writers <= 0).sum()), "readers": int((readers <= 0).sum())}
    assert not any("dropped" in m for m in said)
    circuit = SoftDirections(u, blocks, writers, readers)  # the trained circuit: every block, the positive directions
    kept_cols = torch.zeros(u.n_writer_cols, dtype=torch.bool)
    kept_rows = torch.zeros(u.n_reader_directions, dtype=torch.bool)
    for r in u.readers:
        m = circuit.keep(r)
        kept_cols[: r.n_cols] |= m.any(0)
        kept_rows[r.offset : r.offset + r.size] |= m.any(1)
    assert int((~kept_cols).sum()) == dropped["writers"] and int((~kept_rows).sum()) == dropped["readers"]
    writers[0] = -1.0  # the embedding's one direction: every reader reads the corrupted embedding
    first = next(r for r in u.readers if r.kind == "q" and r.n_cols > 1)  # a whole reader unit past layer 0
    readers[first.offset : first.offset + first.size] = -1.0
    said.clear()
    _, runs = pruned_curves(
        ablation, batch, start, ["prunedirs_signed_fair"], options, said.append,
        trained={"prunedirs_signed_fair": (blocks, writers, readers)},
    )  # fmt: skip
    circuit = SoftDirections(u, blocks, writers, readers)
    cut_writers = [w for w in u.writers if not any(bool(circuit.keep(r)[:, w.offset : w.offset + w.size].any())
                                                   for r in u.readers if r.n_cols > w.offset)]  # fmt: skip
    cut_readers = [r for r in u.readers if r.n_cols > 1 and not bool(circuit.keep(r).any())]  # layer 0: embed only
    assert [w.offset for w in cut_writers] == [0] and cut_readers == [first]
    assert runs["prunedirs_signed_fair"]["dropped_units"] == {
        "writers": ["embed"],
        "readers": [f"L{first.layer}.q.h{first.group}"],
    }
    assert any("units dropped from every block at once" in m for m in said)
    said.clear()
    positive = (blocks, writers.abs() + 0.1, readers.abs() + 0.1)
    _, runs = pruned_curves(
        ablation, batch, start, ["prunedirs_signed_fair"], options, said.append,
        trained={"prunedirs_signed_fair": positive},
    )  # fmt: skip
    assert runs["prunedirs_signed_fair"]["dropped"] == {"writers": 0, "readers": 0}
    assert any("no writer or reader direction dropped" in m for m in said)


@pytest.mark.parametrize("order", ["min", "blocks"])
def test_nested_direction_circuits_are_trained_as_the_curve_cuts_them(order):
    """With several ``keep`` at the direction level, the circuit trained at each is the curve's circuit of the
    current logits at that size in the run's order (``direction_spec``; the largest one cut of every logit), and
    its gradient reaches the writer and reader logits; training them lowers the objective on the planted model."""
    model, _, _ = planted_model()
    u = EdgeUniverse(make_view(model))
    keeps = (3 / u.n_blocks, 0.1, 0.3)
    options = PruneOptions("metric", keep=keeps, level="directions", direction_order=order)
    blocks, writers, readers = _direction_logits(u, 5, torch.float32)
    circuit_at = _Circuits(u, blocks.clone().requires_grad_(True), options)
    with torch.no_grad():  # directions of different logits, then the largest circuit the positive ones
        circuit_at.writers.copy_(writers), circuit_at.readers.copy_(readers)
    circuit_at.recentre(max(keeps))
    spec = direction_spec(u, *circuit_at.result(), order).circuits(keeps)
    for keep, (expected, _, weight) in zip(keeps, spec):
        trained = circuit_at(keep)
        assert weight <= keep * u.n_blocks + 1e-9
        assert all(torch.equal(trained.keep(r), expected.keep(r)) for r in u.readers), keep
    smallest = circuit_at(keeps[0])
    loss = sum(smallest.reader_weights(r).sum() for r in u.readers) + smallest.writer_weights().sum()
    loss.backward()
    assert circuit_at.readers.grad.abs().sum() > 0 and circuit_at.writers.grad.abs().sum() > 0
    ablation = EdgeAblation(u, "ioi")
    train = planted_batch(16, seed=0)
    ref = ablation.reference(train)
    full, empty = ablation.metric(train, AllEdges(), ref), ablation.metric(train, NoEdges(u), ref)
    start = attribute(u, [train], "ioi").units
    _, log = prune_blocks(ablation, [train], [ref], [full], [empty], start, replace(options, steps=10, lr=0.1))
    assert min(log.objective) < log.objective[0]
