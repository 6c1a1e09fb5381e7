"""Views against the real HF forward pass.

What is compared (tolerance: max |ours - model| <= 1e-4 * max(1, max |model|), float32):
* scores: the model's own pre-softmax scores, captured as the input of ``torch.nn.functional.softmax``
  inside HF's eager attention (Gemma-2: after its soft-cap, so we cap ours), at visible positions (causal,
  within the sliding window), against
  ``[1, x_i] M(j - i) [1, x_j]^T`` from ``view.qk`` with x the view's ``normalized`` residual (itself
  computed from the residual captured at the norm's input; Gemma-3: times ``view.qk_factors``);
* attention output: ``sum_h A_h [1, X] M_h + b_O`` via ``view.ov`` against the output of the model's
  o projection, with A the model's own softmax output; per head against ``z_h W_O[h]`` with z the o
  projection's captured input and W_O the module's own weight slice;
* MLP: ``view.mlp(layer)`` on the normalised residual against the output of the down projection;
* unembedding and embedding against the logits and the residual entering layer 0;
* factored SVDs against the dense product and ``torch.linalg.svdvals`` in float64.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from lit_svd.models import ModelUnavailableError, load_causal_lm, view
from lit_svd.models.hooks import capture as capture_io
from lit_svd.models.tiny import ARCHITECTURES, tiny_causal_lm

TOL = 1e-4


def assert_close(ours: torch.Tensor, ref: torch.Tensor, what: str, tol: float = TOL) -> None:
    err = (ours - ref).abs().max().item()
    bound = tol * max(1.0, ref.abs().max().item())
    assert err <= bound, f"{what}: max abs diff {err:.3g} > {bound:.3g}"


@contextmanager
def capture(v):
    """Record, during one forward, per layer: norm inputs, o-projection input/output, down-projection
    output, and the softmax input/output of the attention (the model's own scores and weights)."""
    rec = {"softmax_in": [], "softmax_out": [], "final_in": None}
    real_softmax = torch.nn.functional.softmax

    def softmax(x, *args, **kwargs):
        out = real_softmax(x, *args, **kwargs)
        if x.dim() == 4:
            rec["softmax_in"].append(x.detach().clone())
            rec["softmax_out"].append(out.detach().clone())
        return out

    inputs, outputs = {"final_in": v.norm_module("final", None)}, {}
    for layer in range(v.n_layers):
        inputs.update(
            {
                ("attn_in", layer): v.norm_module("attn", layer),
                ("mlp_in", layer): v.norm_module("mlp", layer),
                ("z", layer): v.site_module(layer, "o"),
            }
        )
        outputs.update(
            {("attn_out", layer): v.site_module(layer, "o"), ("mlp_out", layer): v.site_module(layer, "down")}
        )
    torch.nn.functional.softmax = softmax
    try:
        with capture_io(inputs, "pre") as ins, capture_io(outputs, "post") as outs:
            yield rec
            rec.update(ins)
            rec.update(outs)
    finally:
        torch.nn.functional.softmax = real_softmax


def run_captured(v, ids: torch.Tensor):
    """One forward under eager attention (the path whose softmax we can see), restored afterwards."""
    before = v.model.config._attn_implementation
    v.model.set_attn_implementation("eager")
    try:
        with torch.no_grad(), capture(v) as rec:
            rec["logits"] = v.model(input_ids=ids).logits
    finally:
        v.model.set_attn_implementation(before)
    assert len(rec["softmax_in"]) == v.n_layers
    return rec


def scores_from_view(v, layer: int, x: torch.Tensor) -> torch.Tensor:
    """``[n_heads, T, T]`` scores ``[1, x_i] M(j - i) [1, x_j]^T`` at causal pairs j <= i (0 elsewhere)."""
    T = x.shape[0]
    xa = torch.cat([torch.ones(T, 1, dtype=x.dtype), x], dim=-1)
    out = torch.zeros(v.n_heads, T, T, dtype=x.dtype)
    if not v.rotary_dim:
        fm = v.qk(layer)
        return torch.tril((xa @ fm.A) @ (xa @ fm.B).mT)  # the factors, never the dense matrix
    deltas = list(range(-(T - 1), 1))
    fm = v.qk(layer, deltas)  # [n_deltas, h, d+1, r]
    full = (xa @ fm.A) @ (xa @ fm.B).mT  # [n_deltas, h, T, T]
    for n, delta in enumerate(deltas):
        idx = torch.arange(-delta, T)
        out[:, idx, idx + delta] = full[n][:, idx, idx + delta]
    return out


def check_layer_exact(v, rec, layer: int, tol: float = TOL) -> None:
    x = v.normalized("attn", layer, rec[("attn_in", layer)][0])
    T = x.shape[0]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    if v.window(layer) is not None:  # sliding layers: keys at most window - 1 back
        causal &= ~torch.tril(causal, diagonal=-v.window(layer))
    ours = scores_from_view(v, layer, x)
    factors = v.qk_factors(layer, x)  # Gemma-3's per-token 1 / rms of each head's query and key
    if factors is not None:
        ours = ours * factors[0][:, :, None] * factors[1][:, None, :]
    if v.attn_softcap:
        ours = v.attn_softcap * torch.tanh(ours / v.attn_softcap)
    ref = rec["softmax_in"][layer][0]
    assert_close(ours[:, causal], ref[:, causal], f"{v.model_type} L{layer} scores", tol)

    # OV: per head and summed with the shared b_O, against the o projection
    A = rec["softmax_out"][layer][0].to(x.dtype)  # [h, T, T] (HF eager: softmax in float32 for any dtype)
    xa = torch.cat([torch.ones(T, 1, dtype=x.dtype), x], dim=-1)
    ov = v.ov(layer)
    per_head = A @ ((xa @ ov.A) @ ov.B.mT)  # [h, T, d_model]
    W_O, _ = v.site_weight(layer, "o")
    z = rec[("z", layer)][0].reshape(T, v.n_heads, v.d_head).transpose(0, 1)
    ref_heads = z @ W_O.reshape(v.n_heads, v.d_head, v.d_model)
    assert_close(per_head, ref_heads, f"{v.model_type} L{layer} per-head OV", tol)
    assert_close(per_head.sum(0) + v.attn(layer).b_O, rec[("attn_out", layer)][0], f"{v.model_type} L{layer} attn", tol)

    # MLP on the normalised residual at the MLP's norm
    xm = v.normalized("mlp", layer, rec[("mlp_in", layer)][0])
    assert_close(v.mlp(layer)(xm), rec[("mlp_out", layer)][0], f"{v.model_type} L{layer} MLP", tol)
    # the augmented maps are the same weights
    mw = v.mlp(layer)
    xma = torch.cat([torch.ones(T, 1, dtype=x.dtype), xm], dim=-1)
    pre = xma @ v.mlp_in(layer)
    hidden = mw.act(xma @ v.mlp_gate(layer)) * pre if v.gated_mlp else mw.act(pre)
    hidden_a = torch.cat([torch.ones(T, 1, dtype=x.dtype), hidden], dim=-1)
    assert_close(hidden_a @ v.mlp_out(layer), rec[("mlp_out", layer)][0], f"{v.model_type} L{layer} MLP maps", tol)


def tiny_cases():
    """Each architecture, plus Llama with attention / MLP biases so the augmented rows are exercised."""
    cases = [(arch, {}) for arch in ARCHITECTURES]
    cases.append(("llama", {"attention_bias": True, "mlp_bias": True}))
    cases.append(("gpt_neox", {"use_parallel_residual": False}))
    cases.append(("qwen3", {"attention_bias": True}))  # head norms after biased projections
    return cases


@pytest.fixture(params=tiny_cases(), ids=lambda c: c[0] + ("+" + ",".join(c[1]) if c[1] else ""))
def tiny_any(request):
    arch, overrides = request.param
    return tiny_causal_lm(arch, seed=1, **overrides)


@pytest.mark.parametrize("fold_norms", [True, False])
def test_tiny_views_exact_to_hf_forward(tiny_any, fold_norms):
    v = view(tiny_any, fold_norms=fold_norms)
    ids = torch.randint(0, v.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    rec = run_captured(v, ids)
    for layer in range(v.n_layers):
        check_layer_exact(v, rec, layer)
    # embedding and unembedding
    assert_close(v.embed(ids), rec[("attn_in", 0)], f"{v.model_type} embed")
    W_U, b_U = v.unembed()
    pre_cap = v.normalized("final", None, rec["final_in"]) @ W_U + b_U
    raw_W, raw_b = v._raw_unembed()
    assert_close(v.final_norm(rec["final_in"]) @ raw_W + raw_b, pre_cap, f"{v.model_type} final_norm")
    logits = v.final_softcap * torch.tanh(pre_cap / v.final_softcap) if v.final_softcap else pre_cap
    assert_close(logits, rec["logits"], f"{v.model_type} unembed")


def test_tiny_residual_bookkeeping(tiny_any):
    """The residual stream rebuilds from the captured sub-layer outputs with ``post_norm`` and
    ``parallel_residual`` as the view states them."""
    v = view(tiny_any)
    ids = torch.randint(0, v.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    rec = run_captured(v, ids)
    for layer in range(v.n_layers):
        resid = rec[("attn_in", layer)]
        attn = v.post_norm("attn", layer, rec[("attn_out", layer)])
        mlp = v.post_norm("mlp", layer, rec[("mlp_out", layer)])
        mid_expected = resid if v.parallel_residual else resid + attn
        assert_close(rec[("mlp_in", layer)], mid_expected, f"{v.model_type} L{layer} mid residual")
        nxt = rec[("attn_in", layer + 1)] if layer + 1 < v.n_layers else rec["final_in"]
        assert_close(nxt, resid + attn + mlp, f"{v.model_type} L{layer} next residual")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_factored_svd_reconstructs(arch):
    v = view(tiny_causal_lm(arch, seed=2))
    for fm in (v.qk(1, -3), v.qk(0, 0), v.ov(1)):
        svd = fm.svd()
        dense = fm.dense()
        assert_close(svd.dense(), dense, f"{arch} svd reconstruct")
        ref = torch.linalg.svdvals(dense.double())[..., : svd.S.shape[-1]].float()
        assert_close(svd.S, ref, f"{arch} singular values")
        eye = torch.eye(svd.S.shape[-1]).expand(v.n_heads, -1, -1)
        assert_close(svd.U.mT @ svd.U, eye, f"{arch} U orthonormal")


@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "gemma2", "qwen2", "qwen3"])
def test_rotary_depends_on_offset_only(arch):
    """RoPE scores depend on j - i only: M computed at two different absolute positions agree, and
    R_p is a rotation on the rotary features and the identity elsewhere."""
    v = view(tiny_causal_lm(arch, seed=3))
    R3, R7 = v.rotary_matrix(3), v.rotary_matrix(7)
    assert_close(R3 @ R3.T, torch.eye(v.d_head), f"{arch} R orthogonal")
    if v.rotary_dim < v.d_head:  # partial rotary (GPT-NeoX): the rest passes through unrotated
        assert_close(R7[v.rotary_dim :, v.rotary_dim :], torch.eye(v.d_head - v.rotary_dim), f"{arch} pass-through")
        assert R7[v.rotary_dim :, : v.rotary_dim].abs().max() == 0
    assert_close(R7 @ R3.T, v.rotary_matrix(4), f"{arch} R composes")
    assert (v.qk(0, -2).dense() - v.qk(0, -5).dense()).abs().max() > 1e-3  # offsets do matter
    batched = v.qk(0, [-5, -2, 0])
    assert batched.shape == (3, v.n_heads, v.d_model + 1, v.d_model + 1)
    assert_close(batched[1].dense(), v.qk(0, -2).dense(), f"{arch} batched offsets")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_sites_weights_and_replacement(arch):
    """site_weight maps each site module's input to its site_output; with_site_output replaces only
    that site's part of a fused output."""
    v = view(tiny_causal_lm(arch, seed=4))
    sites = [s for s in ("q", "k", "v", "o", "gate", "up", "down") if s != "gate" or v.gated_mlp]
    for layer in range(v.n_layers):
        for site in sites:
            mod = v.site_module(layer, site)
            W, b = v.site_weight(layer, site)
            inp = torch.randn(2, 5, W.shape[0])
            with torch.no_grad():
                out = mod(inp)
            mine = v.site_output(layer, site, out)
            assert_close(inp @ W + (0 if b is None else b), mine, f"{arch} site {site}")
            new = torch.randn_like(mine)
            replaced = v.with_site_output(layer, site, out, new)
            assert_close(v.site_output(layer, site, replaced), new, f"{arch} replace {site}")
            for other in ("q", "k", "v"):
                if other != site and v.site_module(layer, other) is mod:
                    assert_close(
                        v.site_output(layer, other, replaced),
                        v.site_output(layer, other, out),
                        f"{arch} replace {site} keeps {other}",
                    )


def test_gqa_expanded_per_query_head():
    v = view(tiny_causal_lm("llama", seed=5))
    w = v.attn(0)
    rep = v.n_heads // v.n_kv_heads
    assert v.n_kv_heads < v.n_heads
    for h in range(v.n_heads):
        assert torch.equal(w.W_K[h], w.W_K[(h // rep) * rep])
        assert torch.equal(w.W_V[h], w.W_V[(h // rep) * rep])
    assert not torch.equal(w.W_K[0], w.W_K[rep])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_qk_unrotated_rotated_give_the_qk_scores(arch):
    """``qk_unrotated`` is ``qk`` before rotation: rotating ``[1, x] A`` at i and ``[1, x] B`` at j gives
    ``[1, x_i] qk(layer, j - i) [1, x_j]^T``."""
    v = view(tiny_causal_lm(arch, seed=3))
    fm = v.qk_unrotated(1)
    x = torch.cat([torch.ones(5, 1), torch.randn(5, v.d_model, generator=torch.Generator().manual_seed(0))], -1)
    q, k = v.rotate(x @ fm.A, torch.arange(5)), v.rotate(x @ fm.B, torch.arange(5))  # [h, T, d_head]
    for i, j in ((4, 1), (3, 3), (2, 0)):
        M = v.qk(1, j - i).dense() if v.rotary_dim else v.qk(1).dense()
        assert_close((q[:, i] * k[:, j]).sum(-1), x[i] @ M @ x[j], f"{arch} score ({i}, {j})")


@pytest.mark.parametrize(
    "arch, window, expected",
    [("gemma2", 3, [3, None]), ("llama", None, [None, None]), ("gpt2", None, [None, None]), ("qwen2", 4, [None, 4])],
)
def test_visible_keys_are_the_keys_the_model_attends(arch, window, expected):
    """``visible_keys(layer, t)`` against the HF forward: the keys where the model's own attention weight
    is nonzero (Gemma-2: sliding window on its first layer, full on the second; tiny Qwen2: sliding from
    ``max_window_layers`` = 1 on)."""
    model = tiny_causal_lm(arch, seed=2, **({"sliding_window": window} if window else {}))
    v = view(model)
    ids = torch.randint(0, v.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions
    windows = [v.window(layer) for layer in range(v.n_layers)]
    assert windows == expected
    for layer, A in enumerate(attentions):
        seen = A[0].abs().amax(0) > 0  # [T_query, T_key], any head
        for t in range(ids.shape[1]):
            assert list(v.visible_keys(layer, t)) == seen[t].nonzero().flatten().tolist(), (layer, t)


def test_bad_input_one_clear_line():
    v = view(tiny_causal_lm("llama", seed=0))
    with pytest.raises(ValueError, match=r"model_type 'bert' has no view; supported: gpt2"):
        view(SimpleNamespace(config=SimpleNamespace(model_type="bert")))
    with pytest.raises(IndexError, match=r"layer 2 out of range: llama has layers 0..1"):
        v.qk(2, 0)
    with pytest.raises(IndexError, match=r"layer -1 out of range"):
        v.ov(-1)
    with pytest.raises(IndexError, match=r"head 4 out of range: llama has heads 0..3"):
        v.check_head(4)
    with pytest.raises(ValueError, match=r"delta=None: llama uses rotary"):
        v.qk(0)
    with pytest.raises(ValueError, match=r"^site='gate' is unknown for gpt2; choose one of q, k, v, o, up, down$"):
        view(tiny_causal_lm("gpt2")).site_module(0, "gate")
    with pytest.raises(ValueError, match=r"^point='pre' is unknown; choose one of attn, mlp, final$"):
        v.normalized("pre", 0, torch.zeros(3, 64))
    with pytest.raises(ModelUnavailableError, match=r"GGUF file '/no/such/model.gguf' does not exist"):
        load_causal_lm("/no/such/model.gguf")


# --- the real SmolLM2 ----------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_views_exact(smollm2, wikitext_valid):
    model, tok = smollm2
    v = view(model)
    assert (v.model_type, v.n_layers, v.n_heads, v.n_kv_heads, v.d_model) == ("llama", 30, 9, 3, 576)
    text = open(wikitext_valid, encoding="utf-8").read()[:2000]
    ids = tok(text, return_tensors="pt").input_ids[:, :20]
    rec = run_captured(v, ids)
    for layer in (0, 13, 29):
        check_layer_exact(v, rec, layer)
    W_U, b_U = v.unembed()
    logits = v.normalized("final", None, rec["final_in"]) @ W_U + b_U
    assert_close(logits, rec["logits"], "smollm2 unembed")
