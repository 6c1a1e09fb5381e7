"""SAD on real model code paths: scores equal the HF forward's own pre-softmax scores (captured at its
softmax), contributions sum to the relative attention, and the view's dense ``qk(layer, delta)`` agrees
pair by pair. Tiny models of every architecture in float64; SmolLM2 in float32."""

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

from lit_svd.analysis.sad import (
    attention_inputs,
    causal_visibility,
    decompose_layer,
    direction_terms,
    layer_bases,
    relative,
    scores,
)
from lit_svd.models import view as make_view
from lit_svd.models.tiny import tiny_causal_lm


@contextmanager
def captured_softmax_inputs():
    """Record every tensor HF's eager attention passes to ``softmax`` (the masked pre-softmax scores)."""
    seen, original = [], F.softmax

    def spy(x, *args, **kwargs):
        seen.append(x.detach().clone())
        return original(x, *args, **kwargs)

    F.softmax = spy
    try:
        yield seen
    finally:
        F.softmax = original


@contextmanager
def eager(model):
    """Run ``model`` with eager attention (the only implementation that exposes its scores)."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


def check_against_hf(view, input_ids, mask, layers, dtype, score_tol, sum_tol):
    with eager(view.model), captured_softmax_inputs() as hf_scores:
        X = attention_inputs(view, input_ids, mask, layers)
    assert len(hf_scores) == view.n_layers
    for layer in layers:
        bases = layer_bases(view, layer, dtype=dtype)
        vis = causal_visibility(mask, bases.window)
        l = scores(X[layer].to(dtype), X[layer].to(dtype), bases.qk)
        capped = l if not bases.qk.softcap else bases.qk.softcap * torch.tanh(l / bases.qk.softcap)
        on = vis[:, None].expand_as(l)
        hf = hf_scores[layer].to(dtype)
        scale = hf[on].abs().max()
        assert (capped[on] - hf[on]).abs().max() <= score_tol * scale, f"layer {layer} scores differ from HF"
        for U in (bases.U, bases.U_rot):
            c = relative(direction_terms(X[layer].to(dtype), X[layer].to(dtype), bases.qk, U), vis)
            rel = relative(l, vis)
            assert (c.sum(-2) - rel).abs().max() <= sum_tol * rel.abs().max(), f"layer {layer}: sum_k c_k != l~"
    return X


def test_tiny_architectures_match_hf_and_view_qk(tiny_model):
    model = tiny_model.double()
    view = make_view(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # right padding
    X = check_against_hf(view, ids, mask, list(range(view.n_layers)), torch.float64, 1e-6, 1e-10)
    # pair by pair against the view's own dense bias-augmented Omega(delta) (an independent path to the score)
    layer = view.n_layers - 1
    bases = layer_bases(view, layer, dtype=torch.float64)
    l = scores(X[layer], X[layer], bases.qk)
    for b, h, d, s in [(0, 0, 10, 3), (1, 2, 7, 0), (2, 3, 5, 5)]:
        omega = view.qk(layer, s - d if view.rotary_dim else None)[h].dense()
        want = X[layer][b, d] @ omega @ X[layer][b, s]
        # qk(delta) is built at query position max(0, -delta); HF's rotary tables are float32, so R_d R_s^T
        # equals R_{d-s} to ~1e-7 relative only (visible with Qwen2's large q / k biases)
        torch.testing.assert_close(l[b, h, d, s], want, rtol=1e-6, atol=1e-9)
        if view.rotary_dim:  # at the pair's own positions the same augmented maps are exact
            fm = view.qk_unrotated(layer)
            R_d, R_s = view.rotary_matrix(d, layer), view.rotary_matrix(s, layer)
            omega = (fm.A[h] @ R_d) @ (fm.B[h] @ R_s).T
            exact = X[layer][b, d] @ omega @ X[layer][b, s]
            torch.testing.assert_close(l[b, h, d, s], exact, rtol=1e-12, atol=1e-12)
    stats = decompose_layer(bases, X[layer], mask)
    assert len(stats) > 0 and set(stats.head.tolist()) <= set(range(view.n_heads))


def test_left_padding_gives_same_pairs_as_unpadded():
    model = tiny_causal_lm("llama").double()
    view = make_view(model)
    ids = torch.randint(0, 1000, (1, 9), generator=torch.Generator().manual_seed(1))
    alone = decompose_layer(
        layer_bases(view, 1, dtype=torch.float64),
        attention_inputs(view, ids, torch.ones_like(ids), [1])[1],
        torch.ones_like(ids),
    )
    padded_ids = torch.cat([torch.zeros(1, 3, dtype=ids.dtype), ids], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], 1)
    padded = decompose_layer(
        layer_bases(view, 1, dtype=torch.float64), attention_inputs(view, padded_ids, mask, [1])[1], mask
    )
    assert torch.equal(padded.dest - 3, alone.dest) and torch.equal(padded.src - 3, alone.src)
    torch.testing.assert_close(padded.sparsity, alone.sparsity, rtol=1e-6, atol=1e-8)


def test_layer_and_head_out_of_range():
    view = make_view(tiny_causal_lm("gpt2"))
    with pytest.raises(IndexError, match="layer 2 out of range"):
        layer_bases(view, 2)
    with pytest.raises(IndexError, match="head 4 out of range"):
        layer_bases(view, 0, heads=[0, 4])


@pytest.mark.slow
def test_smollm2_scores_and_exact_sums(smollm2):
    model, tok = smollm2
    view = make_view(model)
    enc = tok(
        [
            "When Mary and John went to the store, John gave a drink to",
            "Then, Anna and Tom had a long argument. Afterwards Tom said to",
        ],
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        check_against_hf(view, enc["input_ids"], enc["attention_mask"], [0, 14, 29], torch.float32, 1e-4, 1e-4)
