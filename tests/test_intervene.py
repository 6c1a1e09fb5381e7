"""Running a modified model (lit_svd.models.intervene) against independent computations: the plain HF
forward, forward-hook ablation and patching, and dense SVDs of the view's augmented matrices.
Tolerance: float32, 1e-4 absolute on logits / activations unless stated."""

from __future__ import annotations

import pytest
import torch

from lit_svd.linalg import NULL_RTOL
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, hooks
from lit_svd.models.intervene import Intervention, build_component, build_components
from lit_svd.models.tiny import tiny_causal_lm

TOL = 1e-4


def _ids(seed=0, batch=2, length=7, vocab=1000):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _zero_head(view, layer, head):
    """An independent ablation: zero the head's slice of the o-projection input."""
    dh = view.d_head

    def pre(mod, args, kwargs):
        z = args[0].clone()
        z[..., head * dh : (head + 1) * dh] = 0
        return (z, *args[1:]), kwargs

    return Hook(view.site_module(layer, "o"), pre, "pre")


def _dense_scaled(M: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``U diag(S lam) V^T`` from an independent dense SVD (float64) of ``M: [..., m, n]``."""
    U, S, Vh = torch.linalg.svd(M.double(), full_matrices=False)
    k = lam.shape[-1]
    return ((U[..., :k] * (S[..., :k] * lam.double()).unsqueeze(-2)) @ Vh[..., :k, :]).float()


def _aug(x):
    return torch.cat([torch.ones_like(x[..., :1]), x], -1)


@torch.no_grad()
def test_all_ones_reproduce_logits_and_random_scales_change_them(tiny_model):
    view = make_view(tiny_model)
    iv = Intervention(view, build_components(view))
    ids = _ids()
    base = tiny_model(ids).logits
    with iv.apply(iv.ones()):
        same = tiny_model(ids).logits
    assert (same - base).abs().max() <= TOL
    g = torch.Generator().manual_seed(1)
    rand = {n: torch.rand(c.shape, generator=g) for n, c in iv.components.items()}
    with iv.apply(rand):
        changed = tiny_model(ids).logits
    assert (changed - base).abs().max() > 1e-2  # the hooks are live
    assert (tiny_model(ids).logits - base).abs().max() == 0  # and removed afterwards


@torch.no_grad()
def test_zero_ov_scales_equal_removing_the_head(tiny_model):
    view = make_view(tiny_model)
    layer, head = 1, 2
    comp = build_component(view, "ov", layer)
    iv = Intervention(view, [comp])
    ids = _ids(3)
    scales = torch.ones(comp.shape)
    scales[head] = 0
    with iv.apply({comp.name: scales}):
        masked = tiny_model(ids).logits

    with hooks(_zero_head(view, layer, head)):
        ablated = tiny_model(ids).logits
    assert (masked - ablated).abs().max() <= TOL
    assert (ablated - tiny_model(ids).logits).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("kind", ["mlp_in", "mlp_gate", "mlp_out", "q", "k"])
def test_random_scales_match_dense_svd_of_the_map(tiny_model, kind):
    """The site's output under random scales equals ``[1, x] U diag(S lam) V^T`` of the view's map."""
    view = make_view(tiny_model)
    if kind == "mlp_gate" and not view.gated_mlp:
        pytest.skip("no gate")
    if kind in ("q", "k") and not view.rotary_dim:
        pytest.skip("non-rotary models mask the joint QK product")
    layer = 1
    comp = build_component(view, kind, layer)
    iv = Intervention(view, [comp])
    lam = torch.rand(comp.shape, generator=torch.Generator().manual_seed(2))
    site = comp.site
    ids = _ids(4)
    with iv.apply({comp.name: lam}):  # capture hooks run after the intervention's
        with (
            capture({"out": view.site_module(layer, site)}, "post") as store,
            capture(
                {
                    "hidden": view.site_module(layer, "down"),
                    "resid": view.block(layer),
                    "resid_mlp": view.norm_module("mlp", layer),
                },
                "pre",
            ) as inputs,
        ):
            tiny_model(ids)
    store.update(inputs)
    got = view.site_output(layer, site, store["out"])
    if kind == "mlp_out":
        want = _aug(store["hidden"]) @ _dense_scaled(view.mlp_out(layer), lam[0])
    else:
        point = "attn" if kind in ("q", "k") else "mlp"
        resid = store["resid"] if point == "attn" else store["resid_mlp"]  # what the norm reads
        x = _aug(view.normalized(point, layer, resid))
        if kind in ("q", "k"):
            M = view.q_map(layer) if kind == "q" else view.k_map(layer)[:: view.n_heads // view.n_kv_heads]
            want = torch.einsum("bsd,gde->bsge", x, _dense_scaled(M, lam)).flatten(-2)
        else:
            M = view.mlp_in(layer) if kind == "mlp_in" else view.mlp_gate(layer)
            want = x @ _dense_scaled(M, lam[0])
    assert (got - want).abs().max() <= TOL * max(1.0, want.abs().max().item())


@torch.no_grad()
def test_random_ov_scales_match_dense_head_outputs(tiny_model):
    """o-site output = sum_h A_h [1, x] (U diag(S lam) V^T)_h + b_O, from captured attention and inputs."""
    view = make_view(tiny_model)
    layer = 1
    comp = build_component(view, "ov", layer)
    iv = Intervention(view, [comp])
    lam = torch.rand(comp.shape, generator=torch.Generator().manual_seed(5))
    ids = _ids(6)
    with iv.apply({comp.name: lam}):
        with (
            capture({"out": view.site_module(layer, "o")}, "post") as store,
            capture({"resid": view.block(layer)}, "pre") as inputs,
        ):
            attn = tiny_model(ids, output_attentions=True).attentions[layer]  # [B, H, T, T]
    store.update(inputs)
    x = _aug(view.normalized("attn", layer, store["resid"]))
    per_source = torch.einsum("bsd,hde->bhse", x, _dense_scaled(view.ov(layer).dense(), lam))
    want = torch.einsum("bhts,bhse->bte", attn, per_source).to(store["out"].dtype) + view.attn(layer).b_O
    assert (store["out"] - want).abs().max() <= TOL


def _view_map(view, kind: str, layer: int) -> torch.Tensor:
    """The view's augmented map of ``kind`` at ``layer``, dense and batched over its groups ``[G, m, n]``."""
    if kind in ("qk", "ov"):
        return getattr(view, kind)(layer).dense()
    if kind == "q":
        return view.q_map(layer)
    if kind == "k":
        return view.k_map(layer)[:: view.n_heads // view.n_kv_heads]
    return getattr(view, kind)(layer)[None]


def _check_null_dropped(view, kinds) -> int:
    """Every component built with ``drop_null``: the directions it lacks against ``drop_null=False`` have singular
    values (of an independent dense float64 SVD of the view's map) at or below ``NULL_RTOL`` of their group's
    largest, it keeps every direction above it, and its ``U diag(S) V^T`` rebuilds the map (float32, 1e-5 of the
    map's largest entry). Returns the number of directions dropped."""
    dropped = 0
    for full, comp in zip(build_components(view, kinds), build_components(view, kinds, drop_null=True), strict=True):
        M = _view_map(view, comp.kind, comp.layer).double()
        S = torch.linalg.svdvals(M)[:, : full.shape[1]]
        null = S <= NULL_RTOL * S[:, :1]
        G, K = comp.shape
        assert K == full.shape[1] - int(null.sum(-1).min()), comp.name
        assert null[:, K:].all() and (comp.S.double()[~null[:, :K]] > 0).all(), comp.name
        assert (comp.S[null[:, :K]] == 0).all(), comp.name  # a null direction left in a group of lower rank: zeroed
        rebuilt = (comp.U.double() * comp.S.double().unsqueeze(-2)) @ comp.V.double().mT
        assert (rebuilt - M).abs().max() <= 1e-5 * M.abs().max(), comp.name
        dropped += G * (full.shape[1] - K)
    return dropped


@torch.no_grad()
def test_null_directions_are_dropped_below_the_tolerance_and_the_rest_rebuild_the_map(tiny_model):
    view = make_view(tiny_model)
    dropped = _check_null_dropped(view, ["qk", "ov", "mlp"])
    bias_free_mlp = view.mlp_in(0)[0].abs().max() == 0  # a zero bias row: one null direction per in / gate map
    per_layer = (2 if view.gated_mlp else 1) if bias_free_mlp else 0
    assert dropped == per_layer * view.n_layers, (tiny_model.config.model_type, dropped)


@torch.no_grad()
def test_a_group_of_lower_rank_keeps_zeroed_null_directions():
    """Half of one head's query rows zeroed: that head's q map has rank 8 of 16, the others 16, so nothing is cut
    from the component and the head's 8 null directions are zeroed."""
    model = tiny_causal_lm("llama", seed=0)
    dh = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[dh : dh + dh // 2] = 0  # head 1, its first 8 query dims
    view = make_view(model)
    _check_null_dropped(view, ["q"])
    comp = build_component(view, "q", 0, drop_null=True)
    assert comp.shape == (model.config.num_attention_heads, dh)
    assert (comp.S[1, dh // 2 :] == 0).all() and (comp.U[1, :, dh // 2 :] == 0).all() and (comp.S[0] > 0).all()


@torch.no_grad()
def test_joint_qk_scales_match_dense_scores():
    model = tiny_causal_lm("gpt2")
    view = make_view(model)
    layer = 1
    comp = build_component(view, "qk", layer)
    iv = Intervention(view, [comp])
    lam = torch.rand(comp.shape, generator=torch.Generator().manual_seed(7))
    ids = _ids(8, length=6)
    with capture({"resid": view.block(layer)}, "pre") as store, iv.apply({comp.name: lam}):
        attn = model(ids, output_attentions=True).attentions[layer]
    x = _aug(view.normalized("attn", layer, store["resid"]))
    scores = torch.einsum("bid,hde,bje->bhij", x, _dense_scaled(view.qk(layer).dense(), lam), x)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    want = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    assert (attn - want).abs().max() <= TOL


@torch.no_grad()
@pytest.mark.parametrize("kind", ["ov", "mlp_out"])
def test_patch_with_zero_scales_equals_activation_patching(tiny_model, kind):
    """lambda = 0 in patch mode at the answer position = copying the corrupted run's activation there."""
    view = make_view(tiny_model)
    layer, head = 0, 1
    comp = build_component(view, kind, layer)
    iv = Intervention(view, [comp])
    clean, corrupt = _ids(10, batch=3), _ids(11, batch=3)
    pos = torch.tensor([6, 4, 5])
    rows = torch.arange(3)
    scales = torch.ones(comp.shape)
    scales[head if kind == "ov" else 0] = 0
    with iv.record([comp.name], positions=pos) as ref:
        tiny_model(corrupt)
    with iv.apply({comp.name: scales}, positions=pos, reference=ref):
        patched = tiny_model(clean).logits

    module = view.site_module(layer, "o" if kind == "ov" else "down")
    with capture({"act": module}, "pre" if kind == "ov" else "post") as store:
        tiny_model(corrupt)
    dh = view.d_head

    if kind == "ov":

        def hook(mod, args, kwargs):
            z = args[0].clone()
            sl = slice(head * dh, (head + 1) * dh)
            z[rows, pos, sl] = store["act"][rows, pos, sl]
            return (z, *args[1:]), kwargs

        patch = Hook(module, hook, "pre")
    else:

        def hook(mod, args, kwargs, out):
            out = out.clone()
            out[rows, pos] = store["act"][rows, pos]
            return out

        patch = Hook(module, hook, "post")
    with hooks(patch):
        want = tiny_model(clean).logits
    assert (patched - want).abs().max() <= TOL
    assert (want - tiny_model(clean).logits).abs().max() > 1e-3


def test_gradients_reach_every_scale(tiny_model):
    view = make_view(tiny_model)
    iv = Intervention(view, build_components(view))
    theta = {n: torch.full(c.shape, 2.0, requires_grad=True) for n, c in iv.components.items()}
    ids = _ids(12)
    pos = torch.tensor([6, 5])
    with torch.no_grad():
        ref_logits = tiny_model(ids).logits[torch.arange(2), pos]
    with iv.apply({n: t.sigmoid() for n, t in theta.items()}, positions=pos):
        logits = tiny_model(ids).logits[torch.arange(2), pos]
    loss = torch.nn.functional.kl_div(
        logits.log_softmax(-1), ref_logits.log_softmax(-1), log_target=True, reduction="batchmean"
    ) + sum(t.sigmoid().sum() for t in theta.values())
    loss.backward()
    for name, t in theta.items():
        assert t.grad is not None and torch.isfinite(t.grad).all(), name
        assert (t.grad != 0).all(), f"{name}: {(t.grad == 0).sum().item()} directions get no gradient"


def test_bad_inputs_fail_in_one_line():
    model = tiny_causal_lm("llama")
    view = make_view(model)
    with pytest.raises(
        ValueError, match=r"^components='attn' is unknown; choose one of qk, q, k, ov, mlp_in, mlp_gate, mlp_out, mlp$"
    ):
        build_components(view, ["attn"])
    with pytest.raises(ValueError, match="joint 'qk' cannot be masked on rotary"):
        build_component(view, "qk", 0)
    gpt2 = make_view(tiny_causal_lm("gpt2"))
    with pytest.raises(ValueError, match="no gated MLP"):
        build_components(gpt2, ["mlp_gate"])
    iv = Intervention(view, build_components(view, ["ov"], layers=[0]))
    with pytest.raises(ValueError, match=r"has shape \(3,\)"):
        with iv.apply({"L0.ov": torch.ones(3)}):
            pass
    with pytest.raises(IndexError, match="layer 5 out of range"):
        build_components(view, ["ov"], layers=[5])


@pytest.mark.slow
@torch.no_grad()
def test_smollm2_all_ones_and_head_removal(smollm2):
    model, tok = smollm2
    view = make_view(model)
    layers = [0, 14, 29]
    iv = Intervention(view, build_components(view, ["qk", "ov", "mlp"], layers=layers))
    ids = torch.tensor([tok.encode("When Mary and John went to the store, John gave a drink to")])
    base = model(ids).logits
    with iv.apply(iv.ones()):
        same = model(ids).logits
    assert (same - base).abs().max() <= TOL
    layer, head = 14, 4
    scales = torch.ones(iv.components[f"L{layer}.ov"].shape)
    scales[head] = 0
    with iv.apply({f"L{layer}.ov": scales}):
        masked = model(ids).logits
    with hooks(_zero_head(view, layer, head)):
        ablated = model(ids).logits
    assert (masked - ablated).abs().max() <= TOL
    assert (ablated - base).abs().max() > 1e-3
