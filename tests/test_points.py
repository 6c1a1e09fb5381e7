"""Activation points and ``view.run_with_cache`` against the HF forward of float64 tiny models.

Every architecture (GPT-2, GPT-NeoX with its parallel residual, Llama with GQA, Gemma-2 and Gemma-3 with
their sandwich norms) runs in float64 with its RMSNorms computing in float64 (``exact_rms_norms``); the
identities below hold to 1e-10 relative (of the largest |value| compared):

* the last ``resid_post`` through the final norm and the unembedding gives the HF logits;
* ``sum_h head_out + b_O`` is the attention module's output; ``z`` is the pattern times the value heads;
* ``resid_post = resid_pre + attn_write + mlp_write``; ``resid_mid = resid_pre + attn_write`` (sequential);
* ``attn_write = attn_out * attn_post_factor * gain`` (Gemma), ``= attn_out`` elsewhere;
* ``*_normalized`` times the norm's gain (+ bias) is what the norm module returned in the forward.
"""

from __future__ import annotations

import pytest
import torch

from lit_svd.models import view as make_view
from lit_svd.models.hooks import capture
from lit_svd.models.points import LAYER_POINTS, MODEL_POINTS, Point, resolve_points
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm
from tests.helpers import exact_rms_norms

ALL = ARCHITECTURES + HEAD_NORM_ARCHITECTURES
TOL = 1e-10


def close(ours, ref, what):
    err = (ours - ref).abs().max().item()
    bound = TOL * max(1.0, ref.abs().max().item())
    assert err <= bound, f"{what}: max abs diff {err:.3g} > {bound:.3g}"


def batch(v, B=3, T=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 3 :] = 0  # right padding
    return ids, mask


@pytest.fixture(params=ALL, scope="module")
def f64(request):
    model = tiny_causal_lm(request.param).double()
    with exact_rms_norms(model):
        yield make_view(model)


def every_point(v):
    names = [n for n in LAYER_POINTS if not (n == "resid_mid" and v.parallel_residual)]
    if v.post_norm_module("attn", 0) is None:
        names = [n for n in names if not n.endswith("_post_factor")]
    return names + list(MODEL_POINTS)


def test_cache_against_hf_forward(f64):
    v = f64
    ids, mask = batch(v)
    cache = v.run_with_cache(every_point(v), ids, mask)
    sites = {("v", l): v.site_module(l, "v") for l in range(v.n_layers)}
    norms_out = {(p, l): v.norm_module(p, l) for p in ("attn", "mlp") for l in range(v.n_layers)}
    with torch.no_grad(), capture(sites, "post") as vals, capture(norms_out, "post") as normed:
        logits = v.model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    close(cache["logits"], logits, "cached logits")
    W_U, b_U = v.unembed()
    ours = v.normalized("final", None, cache["resid_post", v.n_layers - 1]) @ W_U + b_U
    if v.final_softcap:
        ours = v.final_softcap * torch.tanh(ours / v.final_softcap)
    close(ours[real], logits[real], "last resid_post -> final norm -> unembedding vs HF logits")
    close(cache["final_resid"], cache["resid_post", v.n_layers - 1], "final_resid")
    close(cache["embed"], v.embed(ids), "embed")
    for l in range(v.n_layers):
        w = v.attn(l)
        close(cache["head_out", l].sum(2) + w.b_O, cache["attn_out", l], f"L{l} sum of head writes + b_O")
        value = v.site_output(l, "v", vals["v", l]).reshape(*ids.shape, v.n_kv_heads, v.d_head)
        value = value.repeat_interleave(v.n_heads // v.n_kv_heads, 2)  # [B, T, H, d_head]
        z = torch.einsum("bhqs,bshc->bqhc", cache["pattern", l], value)
        close(cache["z", l][real], z[real], f"L{l} z = pattern @ values")
        rows = cache["pattern", l].sum(-1).transpose(1, 2)[real]  # HF's eager softmax runs in float32
        assert (rows - 1).abs().max() < 1e-6, f"L{l} pattern rows sum to 1"
        post = v.post_norm_affine("attn", l)
        if post is None:
            close(cache["attn_write", l], cache["attn_out", l], f"L{l} attn_write")
        else:
            close(cache["attn_write", l], cache["attn_out", l] * cache["attn_post_factor", l] * post.scale, "post")
            mlp_post = v.post_norm_affine("mlp", l)
            close(cache["mlp_write", l], cache["mlp_out", l] * cache["mlp_post_factor", l] * mlp_post.scale, "post")
        close(
            cache["resid_post", l],
            cache["resid_pre", l] + cache["attn_write", l] + cache["mlp_write", l],
            f"L{l} resid_post = resid_pre + writes",
        )
        mlp = v.mlp(l)
        close(cache["mlp_hidden", l] @ mlp.W_out + mlp.b_out, cache["mlp_out", l], f"L{l} mlp_out")
        reads = "resid_pre" if v.parallel_residual else "resid_mid"
        if not v.parallel_residual:
            close(cache["resid_mid", l], cache["resid_pre", l] + cache["attn_write", l], f"L{l} resid_mid")
        for point, resid in (("attn", cache["resid_pre", l]), ("mlp", cache[reads, l])):
            aff = v.norm_affine(point, l)
            x = cache[f"{point}_normalized", l]
            close(x * aff.scale + (0 if aff.bias is None else aff.bias), normed[point, l], f"L{l} {point} norm")
            centred = resid - resid.mean(-1, keepdim=True) if v.norm_kind == "layernorm" else resid
            close(centred * cache[f"{point}_factor", l], x, f"L{l} {point}_factor")


def test_points_resolve_and_fail_in_one_line():
    v = make_view(tiny_causal_lm("gpt_neox"))
    assert resolve_points(v, ["resid_pre", ("z", 1), "logits", ("z", 1)]) == [
        Point("resid_pre", 0),
        Point("resid_pre", 1),
        Point("z", 1),
        Point("logits"),
    ]
    assert str(Point("z", 1)) == "L1.z" and str(Point("logits")) == "logits"
    with pytest.raises(ValueError, match="parallel residual"):
        resolve_points(v, ["resid_mid"])
    with pytest.raises(ValueError, match="without a post norm"):
        resolve_points(v, [("attn_post_factor", 0)])
    with pytest.raises(ValueError, match=r"^point='resid' is unknown; choose one of resid_pre, "):
        resolve_points(v, ["resid"])
    with pytest.raises(IndexError, match="out of range"):
        resolve_points(v, [("z", 5)])
    cache = v.run_with_cache([("resid_pre", 1)], torch.zeros(1, 3, dtype=torch.long))
    assert list(cache) == [Point("resid_pre", 1)] and ("resid_pre", 1) in cache and "logits" not in cache


def test_run_with_cache_restores_attention_implementation():
    model = tiny_causal_lm("llama")
    model.set_attn_implementation("sdpa")
    v = make_view(model)
    cache = v.run_with_cache(["pattern"], torch.zeros(1, 4, dtype=torch.long))
    assert cache["pattern", 0].shape == (1, v.n_heads, 4, 4)
    assert model.config._attn_implementation == "sdpa"
