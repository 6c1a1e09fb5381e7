"""The array shapes in the annotations (jaxtyping) are the shapes the code takes and returns: each public function
below runs under jaxtyping's run-time check on a tiny model of every architecture, its arguments and result checked
against their annotations (named dimensions bound once per call), and the check fails on a wrong shape."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing

import jaxtyping
import pytest
import torch
from jaxtyping import Float, jaxtyped
from torch import Tensor

from lit_svd import linalg
from lit_svd.analysis import alignment, mounts, sad, spectrum
from lit_svd.models import view as make_view
from lit_svd.models.base import ModelView, augment, augment_inputs, inverse_rms
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm


def conforms(value, ann) -> bool:
    """``value`` against the array types in ``ann`` (an array type, a tuple or union of them; anything else is
    not checked here)."""
    if isinstance(ann, type) and issubclass(ann, jaxtyping.AbstractArray):
        return isinstance(value, ann)
    if ann is type(None):
        return value is None
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is tuple and Ellipsis not in args:
        return isinstance(value, tuple) and len(value) == len(args) and all(map(conforms, value, args))
    return True


def isinstance_checker(fn):
    """The smallest type checker jaxtyping can drive: ``isinstance`` of every array-annotated argument and of the
    result (jaxtyping binds the named dimensions across them)."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        for name, value in sig.bind(*args, **kwargs).arguments.items():
            if not conforms(value, sig.parameters[name].annotation):
                raise TypeError(f"{name}: {value!r} is not {sig.parameters[name].annotation}")
        out = fn(*args, **kwargs)
        if not conforms(out, sig.return_annotation):
            raise TypeError(f"returned {out!r}, not {sig.return_annotation}")
        return out

    return checked


def checked(fn):
    return jaxtyped(typechecker=isinstance_checker)(fn)


def check_fields(obj):
    """A dataclass instance rebuilt through its shape-checked ``__init__`` (every field against its annotation)."""
    return checked(type(obj))(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})


def test_linalg_shapes():
    g = torch.Generator().manual_seed(0)
    A, B = (
        torch.randn(3, 6, 2, generator=g, dtype=torch.float64),
        torch.randn(3, 5, 2, generator=g, dtype=torch.float64),
    )
    svd = checked(linalg.svd_factored)(A, B)
    check_fields(svd)
    assert checked(linalg.svd_dense)(A @ B.mT).S.shape == (3, 5)
    checked(linalg.abs_cosine)(A, A[..., :1])
    S = torch.tensor([[3.0, 2.0, 2.0, 0.0]], dtype=torch.float64)
    checked(linalg.relative_gaps)(S)
    checked(linalg.numerical_rank)(S, 4)
    check_fields(checked(linalg.direction_blocks)(S))
    Q = checked(linalg.haar_orthogonal)(5, 2, generator=g, dtype=torch.float64, columns=3)
    assert Q.shape == (2, 5, 3)
    checked(linalg.orthogonality_to_others)(Q[0], torch.tensor([0, 2]))
    check_fields(checked(linalg.match_directions)(linalg.svd_dense(Q[0]), linalg.svd_dense(Q[0])))
    checked(linalg.average_ranks)(S)
    checked(linalg.rolls_tovee_sparsity)(A)


@pytest.mark.parametrize("arch", ARCHITECTURES + HEAD_NORM_ARCHITECTURES)
def test_view_shapes(arch):
    view = make_view(tiny_causal_lm(arch))
    x = torch.randn(2, 5, view.d_model)
    ids = torch.randint(0, 100, (2, 5))
    check_fields(view.attn(1))
    check_fields(view.mlp(1))
    check_fields(view.norm_affine("attn", 0))
    assert view.embed(ids).shape == (2, 5, view.d_model)  # abstract in ModelView: each view's own
    for point, layer in (("attn", 0), ("mlp", 1), ("final", None)):
        checked(ModelView.normalized)(view, point, layer, x)
        checked(ModelView.norm_factor)(view, point, layer, x)
    checked(ModelView.final_norm)(view, x)
    checked(ModelView.post_norm)(view, "attn", 0, x)
    checked(ModelView.post_norm_factor)(view, "mlp", 1, x)
    W_U, b_U = checked(ModelView.unembed)(view)
    assert W_U.shape == (view.d_model, view.vocab_size) and b_U.shape == (view.vocab_size,)
    q = torch.randn(2, view.n_heads, 5, view.d_head)
    checked(ModelView.rotate)(view, q, torch.arange(5), 0)
    assert checked(ModelView.rotary_matrices)(view, torch.arange(3), 0).shape == (3, view.d_head, view.d_head)
    for name in ("q_map", "k_map"):
        assert checked(getattr(ModelView, name))(view, 0).shape == (view.n_heads, view.d_model + 1, view.d_head)
    assert checked(ModelView.mlp_in)(view, 0).shape == (view.d_model + 1, view.d_mlp)
    assert checked(ModelView.mlp_out)(view, 0).shape == (view.d_mlp + 1, view.d_model)
    if view.gated_mlp:
        checked(ModelView.mlp_gate)(view, 0)
    checked(ModelView.qk_factors)(view, 0, x)
    for site in ("q", "o", "down"):
        W, b = checked(ModelView.site_weight)(view, 0, site)
        mod = view.site_module(0, site)
        out = torch.randn(2, 5, mod.weight.shape[1 if type(mod).__name__ == "Conv1D" else 0])  # the module's output
        checked(ModelView.with_site_output)(view, 0, site, out, checked(ModelView.site_output)(view, 0, site, out))
    assert checked(ModelView.W_E.fget)(view).shape == (view.vocab_size, view.d_model)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma3"])
def test_sad_shapes(arch):
    view = make_view(tiny_causal_lm(arch))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    xa = augment_inputs(view.normalized("attn", 0, torch.randn(2, 6, view.d_model)))
    qk = check_fields(sad.qk_heads_from_view(view, 0))
    U = checked(sad.QKHeads.basis)(qk)
    checked(sad.rotated_bases)(U, 1)
    checked(sad.QKHeads.pair_factors)(qk, xa, xa)
    visible = checked(sad.causal_visibility)(mask)
    score = checked(sad.scores)(xa, xa, qk)
    terms = checked(sad.direction_terms)(xa, xa, qk, U)
    rel = checked(sad.relative)(score, visible)
    checked(sad.relative)(terms, visible)
    probs = checked(sad.attention_probs)(score, visible)
    pairs = checked(sad.select_pairs)(probs, rel, visible)
    c = checked(sad.contributions_at)(xa, xa, visible, qk, U, pairs)
    c, r = checked(sad.signed)(c, rel[pairs])
    assert checked(sad.n_recon)(c, r).shape == r.shape == (int(pairs.sum()),)


def test_base_helpers_and_analysis_shapes():
    W, b = torch.randn(4, 7, 3), torch.randn(4, 3)
    assert checked(augment)(W, b).shape == (4, 8, 3)
    assert checked(augment_inputs)(torch.randn(2, 5, 7)).shape == (2, 5, 8)
    assert checked(inverse_rms)(torch.randn(2, 5, 8), torch.randn(4, 8, 3), 1e-6).shape == (2, 4, 5)
    feats, W_Q, W_K = torch.randn(2, 6, 4), torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    svd = checked(alignment.omega_svd)(W_Q, W_K)
    checked(alignment.feature_singular_cosines)(feats, svd)
    checked(alignment.interference)(feats)
    assert checked(spectrum.effective_rank)(svd.S).shape == (2,)


def test_a_wrong_shape_fails_the_check():
    with pytest.raises(jaxtyping.TypeCheckError, match="parameter 'b'"):
        checked(augment)(torch.randn(4, 7, 3), torch.randn(4, 2))  # the bias is not [..., d_out]
    with pytest.raises(jaxtyping.TypeCheckError, match="parameter 'resid'"):
        checked(ModelView.normalized)(make_view(tiny_causal_lm("llama")), "attn", 0, torch.tensor(1.0))

    def drops_a_row(x: Float[Tensor, "*batch d"]) -> Float[Tensor, "*batch d+1"]:  # a wrong annotation is caught
        return x

    with pytest.raises(jaxtyping.TypeCheckError, match="return value"):
        checked(drops_a_row)(torch.randn(2, 3))
    weights = make_view(tiny_causal_lm("llama")).mlp(0)
    with pytest.raises(jaxtyping.TypeCheckError, match="MLPWeights.__init__"):  # a dataclass's fields too
        check_fields(dataclasses.replace(weights, W_in=weights.W_in.T))


def test_mounts_shapes():
    W = torch.randn(12, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for m in (
        checked(mounts.tiled_svd_mounts)(W, 4, 2),
        checked(mounts.whole_svd_mounts)(W, 8),
        checked(mounts.column_sample_mounts)(W, 8),
        mounts.random_mounts(12, 16, 8),
    ):
        check_fields(m)
    checked(mounts.top_svd)(W, 3)
    X, Z = torch.randn(40, 16, dtype=torch.float64), torch.randn(40, 12, dtype=torch.float64)
    assert checked(mounts.ridge_map)(X.T @ X, X.T @ Z, 0.1).shape == (12, 16)
    assert checked(mounts.orthonormal_span)(W[:, :3]).shape == (12, 3)
    d = check_fields(mounts.CoverageDict.of(mounts.random_units(12, 5, 0)))
    checked(mounts.sparse_explained)(Z @ d.D, d.G, 2)
    assert checked(mounts.haar_null)(W, 0).shape == W.shape
    assert checked(mounts.ceiling_sum)(Z).shape == (12, 12)
    assert checked(mounts.ceiling_sum)(Z, X).shape == (17, 17)
