"""The causal check: the batched, fanned-out patch against independent hooks on the real forward, and a planted
direction that carries the task effect passes while random directions of the same head do not."""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.causal import (
    MIN_GAP_FRACTION,
    Z_PASS,
    Probes,
    causal_check,
    corrupted_coefficients,
    patched_metrics,
    random_coords,
    summarize,
)
from lit_svd.metrics import task_scorer
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, hooks
from lit_svd.models.intervene import Intervention, build_components
from lit_svd.models.tiny import tiny_causal_lm

TOL = 1e-4  # float32, logits of order 1: the fanned-out forward against the full one


def _batch(lengths=(9, 7, 9, 6, 7), seed=0, vocab=1000):
    """A right-padded IOI-shaped batch of random prompts; each corrupted prompt differs from its clean one."""
    g = torch.Generator().manual_seed(seed)
    n, T = len(lengths), max(lengths)
    clean = torch.randint(10, vocab, (n, T), generator=g)
    corrupt = torch.randint(10, vocab, (n, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    clean, corrupt = clean * mask, corrupt * mask
    return {
        "clean_ids": clean,
        "corrupt_ids": corrupt,
        "attention_mask": mask,
        "answer_pos": torch.tensor(lengths) - 1,
        "correct_id": torch.randint(10, vocab, (n,), generator=g),
        "wrong_id": torch.randint(10, vocab, (n,), generator=g),
    }


def _answer_metric(model, batch, *specs):
    """Logit difference at the answer position of the full (padded) forward with ``specs`` hooks."""
    rows = torch.arange(len(batch["answer_pos"]))
    with torch.no_grad(), hooks(*specs):
        logits = model(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"]).logits[
            rows, batch["answer_pos"]
        ]
    return logits[rows, batch["correct_id"]] - logits[rows, batch["wrong_id"]]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "qwen3"])
def test_batched_patch_matches_a_hand_written_hook(arch):
    """Random OV directions: the fanned-out patch equals a post-hook on o_proj of the full forward that adds
    ``((z_corrupt - z) W_O,h . r) r`` at the answer position, with ``W_O`` read from the view."""
    model = tiny_causal_lm(arch)
    view = make_view(model)
    layer = 1
    comp = build_components(view, ["ov"], layers=[layer])[0]
    batch = _batch()
    reference = corrupted_coefficients(view, [comp], batch)[comp.name]
    probes = Probes(comp, torch.tensor([0, 2, 3, 1]), random_coords(4, comp.shape[1], torch.Generator().manual_seed(1)))
    got = patched_metrics(view, probes, batch, reference, "ioi", rows_per_forward=6)  # chunks of one probe
    W_O = view.attn(layer).W_O  # [H, d_head, d_model]
    d_head = W_O.shape[1]
    o_proj = view.site_module(layer, "o")
    with torch.no_grad(), capture({"z": o_proj}, "pre") as z_corrupt:
        model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])
    rows = torch.arange(len(batch["answer_pos"]))
    for j in range(len(probes)):
        h = int(probes.group[j])
        r = comp.V[h] @ probes.coords[j]  # unit write direction in d_model
        sl = slice(h * d_head, (h + 1) * d_head)

        def hook(mod, args, kwargs, out, r=r, sl=sl, h=h):
            z = args[0] if args else kwargs["hidden_states"]
            zc = z_corrupt["z"][rows, batch["answer_pos"], sl]
            shift = ((zc - z[rows, batch["answer_pos"], sl]) @ W_O[h]) @ r
            out = out.clone()
            out[rows, batch["answer_pos"]] += shift[:, None] * r
            return out

        want = _answer_metric(model, batch, Hook(o_proj, hook, "post"))
        assert torch.allclose(got[:, j], want, atol=TOL), (j, (got[:, j] - want).abs().max())
    # the probes do change the metric, by several times the comparison's tolerance (so that the agreement above is not
    # that of two unchanged forwards). Measured: gpt2 7.1e-4, qwen2 2.4e-3, llama 0.073, qwen3 0.069 (which random
    # directions these are is fixed since the components' singular vectors have fixed signs, models.svds)
    assert (got - got[:, :1]).abs().max() > 5 * TOL


def test_singular_directions_match_the_intervention_patch():
    """Claimed singular directions of OV and MLP-out against ``Intervention.apply`` (scale 0 on that direction,
    patched toward the recorded corrupted coefficients), on the full padded forward."""
    model = tiny_causal_lm("llama")
    view = make_view(model)
    comps = build_components(view, ["ov", "mlp_out"], layers=[0])
    batch = _batch(seed=3)
    iv = Intervention(view, comps)
    refs = corrupted_coefficients(view, comps, batch)
    for comp, (g, k) in zip(comps, [(1, 0), (0, 5)]):
        probes = Probes(comp, torch.tensor([g]), torch.eye(comp.shape[1])[[k]])
        got = patched_metrics(view, probes, batch, refs[comp.name], "ioi")[:, 0]
        scales = iv.ones()
        scales[comp.name][g, k] = 0.0
        with iv.apply(scales, positions=batch["answer_pos"], reference=refs):
            want = _answer_metric(model, batch)
        assert torch.allclose(got, want, atol=TOL), comp.name
        assert (want - _answer_metric(model, batch)).abs().max() > 1e-4


def _planted():
    """A tiny llama whose layer-1 head 0 writes ``s (z . p) w`` with ``w`` the direction that reads as the logit
    difference (correct - wrong) through the final norm's gain: its top OV direction carries the answer."""
    model = tiny_causal_lm("llama", seed=2)
    view = make_view(model)
    batch = _batch(lengths=(8,) * 6 + (7,) * 6, seed=5)
    batch["correct_id"][:] = 11
    batch["wrong_id"][:] = 12
    W_U, _ = view.unembed()  # [d_model, vocab], final norm's gain folded in
    w = W_U[:, 11] - W_U[:, 12]
    w = w / w.norm()
    o_proj = view.site_module(1, "o")
    d_head = view.d_head
    p = torch.randn(d_head, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        o_proj.weight[:, :d_head] = 0.05 * o_proj.weight[:, :d_head] + 6.0 * torch.outer(w, p / p.norm())
    return model, make_view(model), batch


def test_planted_direction_passes_and_random_directions_do_not():
    model, view, batch = _planted()
    comp = build_components(view, ["ov"], layers=[1])[0]
    reference = corrupted_coefficients(view, [comp], batch)[comp.name]
    K = comp.shape[1]
    rows = causal_check(view, comp, [comp.address(0, 0), comp.address(0, K - 1)], batch, "ioi", reference, n_random=32)
    top, bottom = rows
    assert top["passes"] and top["z"] > 2 * Z_PASS and top["percentile"] == 1.0
    assert not bottom["passes"]  # the smallest direction of the planted head carries nothing
    # a Haar-random direction of the same head, judged against the same null, fails (at most 1 in 20 at 1 %)
    probes = Probes(
        comp,
        torch.zeros(1 + 32 + 20, dtype=torch.long),
        torch.cat([torch.zeros(1, K), random_coords(52, K, torch.Generator().manual_seed(0))]),
    )
    change = (patched_metrics(view, probes, batch, reference, "ioi") - 0).mean(0)
    change = change[1:] - change[0]
    null, claimed = change[:32], change[32:]
    passed = [summarize(float(e), null)["passes"] for e in claimed]
    assert sum(passed) <= 1, passed
    # the null itself has the scale the planted direction dwarfs
    assert abs(top["effect"]) > 5 * top["null_mean"]
    # the gap fraction: -effect / (m(clean) - m(corrupted)), the gap from two plain forwards here
    task = task_scorer("ioi")
    with torch.no_grad():
        m = [
            task.metric(model(input_ids=batch[k], attention_mask=batch["attention_mask"]).logits[
                torch.arange(len(batch["answer_pos"])), batch["answer_pos"]], batch)
            for k in ("clean_ids", "corrupt_ids")
        ]  # fmt: skip
    gap = float((m[0] - m[1]).mean())
    for r in rows:
        assert r["metric_gap"] == pytest.approx(gap, rel=1e-5)
        assert r["gap_fraction"] == pytest.approx(-r["effect"] / gap, rel=1e-6)
        assert r["passes_gap"] == (r["passes"] and abs(r["gap_fraction"]) >= MIN_GAP_FRACTION)
    assert top["passes_gap"] and abs(top["gap_fraction"]) > 0.05


def test_bad_inputs_fail_in_one_line():
    model = tiny_causal_lm("llama")
    view = make_view(model)
    q = build_components(view, ["q"], layers=[0])[0]
    batch = _batch()
    with pytest.raises(ValueError, match="causal check patches"):
        patched_metrics(
            view, Probes(q, torch.tensor([0]), torch.eye(q.shape[1])[:1]), batch, torch.zeros(5, *q.shape), "ioi"
        )
    ov = build_components(view, ["ov"], layers=[0])[0]
    with pytest.raises(ValueError, match="n_random=1"):
        causal_check(view, ov, [ov.address(0, 0)], batch, "ioi", torch.zeros(5, *ov.shape), n_random=1)
    with pytest.raises(ValueError, match="task='sst'"):
        patched_metrics(
            view, Probes(ov, torch.tensor([0]), torch.eye(ov.shape[1])[:1]), batch, torch.zeros(5, *ov.shape), "sst"
        )


def test_gt_probability_difference_matches_the_intervention_patch():
    """GT's metric needs the whole softmax: the full-vocabulary path against ``Intervention.apply``."""
    from lit_svd.metrics import gt_prob_diff

    model = tiny_causal_lm("llama")
    view = make_view(model)
    comp = build_components(view, ["ov"], layers=[1])[0]
    batch = _batch(seed=4)
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    batch["greater_mask"] = torch.rand(5, V, generator=g) < 0.3
    batch["lesser_mask"] = ~batch["greater_mask"] & (torch.rand(5, V, generator=g) < 0.5)
    refs = corrupted_coefficients(view, [comp], batch)
    got = patched_metrics(
        view, Probes(comp, torch.tensor([2]), torch.eye(comp.shape[1])[[1]]), batch, refs[comp.name], "gt"
    )[:, 0]
    iv = Intervention(view, [comp])
    scales = iv.ones()
    scales[comp.name][2, 1] = 0.0
    rows = torch.arange(5)
    with torch.no_grad(), iv.apply(scales, positions=batch["answer_pos"], reference=refs):
        logits = model(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"]).logits[
            rows, batch["answer_pos"]
        ]
    want = gt_prob_diff(logits, batch["greater_mask"], batch["lesser_mask"])
    assert torch.allclose(got, want, atol=1e-6)
    with torch.no_grad():
        plain = model(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"]).logits[
            rows, batch["answer_pos"]
        ]
    assert (want - gt_prob_diff(plain, batch["greater_mask"], batch["lesser_mask"])).abs().max() > 1e-5
