"""The model object and its SVD cache (``lit_svd.models.loaded``, ``lit_svd.models.svds``).

Each cached SVD is checked against the map itself (U diag(S) V^T rebuilds the view's dense matrix, float64,
1e-10 relative), its signs against the rule (largest |entry| of each left vector positive), and the cache's
reuse against its conditions: one SVD per (layer, kind) while the weights are unchanged, a new one after an
in-place edit or a training step. The loading options: one group, mirrored by every
pretrained-model module's signature, validated in one line."""

from __future__ import annotations

import inspect

import pytest
import torch

from lit_svd.models import view as make_view
from lit_svd.models.intervene import build_component
from lit_svd.models.loaded import LoadedModel, ModelOptions, obtain, using
from lit_svd.models.svds import cache_of, view_svd
from lit_svd.models.tiny import tiny_causal_lm

DENSE = {
    "ov": lambda v, l: v.ov(l).dense(),
    "qk": lambda v, l: v.qk_unrotated(l).dense(),
    "q": lambda v, l: v.q_map(l),
    "k": lambda v, l: v.k_map(l)[:: v.n_heads // v.n_kv_heads],
    "mlp_in": lambda v, l: v.mlp_in(l)[None],
    "mlp_gate": lambda v, l: v.mlp_gate(l)[None],
    "mlp_out": lambda v, l: v.mlp_out(l)[None],
}


@pytest.fixture
def llama64():
    return make_view(tiny_causal_lm("llama").double())


@pytest.mark.parametrize("kind", list(DENSE))
def test_each_cached_svd_rebuilds_its_map_with_fixed_signs(llama64, kind):
    svd = view_svd(llama64, 1, kind)
    dense = DENSE[kind](llama64, 1).double()
    rebuilt = svd.U @ torch.diag_embed(svd.S) @ svd.V.mT
    k = svd.S.shape[-1]
    assert torch.allclose(rebuilt, dense, rtol=0, atol=1e-10 * float(dense.abs().max())), kind
    assert svd.U.shape[-1] == k and torch.allclose(svd.S, torch.linalg.svdvals(dense)[..., :k], rtol=1e-10)
    pick = svd.U.abs().argmax(-2, keepdim=True)
    assert (svd.U.gather(-2, pick) > 0).all()  # the sign rule: no LAPACK build chooses another


def test_one_svd_per_layer_and_kind_until_the_weights_change(llama64):
    first = view_svd(llama64, 0, "ov")
    assert view_svd(llama64, 0, "ov") is first
    build_component(llama64, "ov", 0)  # the mask components read the same entry
    assert cache_of(llama64).computed[(0, "ov")] == 1
    with torch.no_grad():
        llama64.block(0).self_attn.o_proj.weight.mul_(2.0)  # an edit in place: the entry is stale
    again = view_svd(llama64, 0, "ov")
    assert cache_of(llama64).computed[(0, "ov")] == 2
    assert torch.allclose(again.S, 2 * first.S, rtol=1e-12)


def test_a_training_step_makes_a_new_svd(llama64):
    params = list(llama64.block(1).parameters())
    before = view_svd(llama64, 1, "q")
    loss = sum((p**2).sum() for p in params)
    loss.backward()
    torch.optim.SGD(params, lr=0.1).step()  # updates the weights in place
    after = view_svd(llama64, 1, "q")
    assert cache_of(llama64).computed[(1, "q")] == 2 and not torch.allclose(before.S, after.S)


def test_an_entry_made_in_a_test_loop_serves_a_training_run():
    """SAD and the direction check run under ``torch.inference_mode``; a mask trained afterwards on the same model
    object reads the same entries with autograd on (inference tensors cannot be saved for backward). Float32: the
    components share the cached tensors."""
    v = make_view(tiny_causal_lm("llama"))
    with torch.inference_mode():
        build_component(v, "ov", 0)
    comp = build_component(v, "ov", 0)
    scale = torch.ones(comp.S.shape, dtype=comp.V.dtype, requires_grad=True)
    (comp.V * scale.unsqueeze(-2)).sum().backward()
    assert scale.grad is not None and cache_of(v).computed[(0, "ov")] == 1


def test_the_cache_keeps_at_most_its_budget(llama64):
    cache = cache_of(llama64)
    cache.max_bytes = 1  # every new entry pushes out the older ones
    view_svd(llama64, 0, "q")
    view_svd(llama64, 1, "q")
    assert list(cache.entries) == [(1, "q")]


def test_a_model_in_use_is_the_one_every_module_takes():
    lm = tiny_causal_lm("llama")
    from lit_svd.models.loading import load_tokenizer

    m = LoadedModel.of(lm, load_tokenizer("smollm2-135m"), name="my-tiny")
    assert m.options == ModelOptions("my-tiny") and not any(p.requires_grad for p in lm.parameters())
    with using(m):
        assert obtain(ModelOptions("my-tiny")) is m
        assert obtain(ModelOptions("my-tiny", fold_norms=False)) is m  # another view of the same weights
        with pytest.raises(ValueError, match="model='my-tiny' is the model object in use, loaded with"):
            obtain(ModelOptions("my-tiny", dtype="bfloat16"))
    text = repr(m)
    assert len(text.splitlines()) <= 5 and "llama" in text and "2 layers" in text and "float32" in text


def test_every_pretrained_module_takes_the_one_group_of_loading_options():
    """The base module's signature is the options' group (names, defaults); no subclass repeats one of them but
    ``model`` where its default is a finished run's (the direction check, faithfulness)."""
    import lit_svd.modules as modules
    from lit_svd.modules.pretrained import PretrainedLMModule

    base = inspect.signature(PretrainedLMModule.__init__).parameters
    group = ModelOptions().as_dict()
    assert {k: base[k].default for k in group} == group and set(base) - {"self"} == set(group)
    found = 0
    for name in dir(modules):
        cls = getattr(modules, name)
        if inspect.isclass(cls) and issubclass(cls, PretrainedLMModule) and cls is not PretrainedLMModule:
            found += 1
            own = inspect.signature(cls.__init__).parameters
            assert any(p.kind is p.VAR_KEYWORD for p in own.values()), name
            assert not (set(own) & set(group)) - {"model"}, name
    assert found >= 4


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(dtype="int8"), "model.dtype='int8' is not supported"),
        (dict(offload_folder="x"), "offload_folder='x' needs a device_map"),
        (dict(device_map={"model": "disk"}), "give offload_folder"),
        (dict(fold_norms="yes"), "model.fold_norms='yes': give true or false"),
        (dict(model="arch:llama", device_map="auto"), "a random-weight arch model has no weights on disk"),
    ],
)
def test_bad_loading_options_fail_in_one_line(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        ModelOptions(**options).check()
    assert "\n" not in str(err.value)
