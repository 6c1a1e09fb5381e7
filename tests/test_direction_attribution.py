"""Direction attribution (lit_svd.analysis.direction_attribution) against central finite differences of the summed
task metric along each direction's corrupted-to-clean path, computed with ``Intervention.apply`` (the scales
``c' = c_ref + lambda (c - c_ref)``: independent code) or, for the ``inputs`` path, a hand-written hook, on float64
tiny models of every architecture run end to end in float64 (SDPA attention, tests/helpers.exact_rms_norms).

Tolerance: 1e-6 of the largest |attribution| (central difference, eps 1e-4: truncation O(eps^2); the two forms of
the path differ by the part of ``own - own_ref`` outside the float32 span of ``V``, ~1e-8 relative). Each check
covers a sample of directions of every kind (random, and the largest attributions)."""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.attribution import batch_attributions
from lit_svd.analysis.direction_attribution import (
    WRITER_KINDS,
    alphas,
    batch_direction_attributions,
    unit_attributions,
)
from lit_svd.analysis.faithfulness import Universe, universe_components
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.metrics import forward_answer_logits, task_scorer
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, hooks
from lit_svd.models.intervene import Intervention
from lit_svd.models.patching import CircuitPatch
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm
from tests.helpers import exact_rms_norms

EPS = 1e-4
TOL = 1e-6


@pytest.fixture(scope="module")
def batch(tokenizer):
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=6, batch_size=6, seed=0)
    return next(iter(dm.test_dataloader()))


@pytest.fixture(autouse=True)
def float64_softmax(monkeypatch):
    """Gemma-2 has no SDPA attention, and HF's eager attention takes its softmax in float32: here it keeps a float64
    input's dtype, so that finite differences see a float64 model end to end."""
    softmax = torch.nn.functional.softmax

    def exact(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=x.dtype if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", exact)


def _setup(arch):
    model = tiny_causal_lm(arch, seed=2).double()
    if arch != "gemma2":
        model.set_attn_implementation("sdpa")
    view = make_view(model)
    comps = universe_components(view)
    return model, view, comps, Universe(comps)


def _metric(model, batch) -> float:
    logits = forward_answer_logits(model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])
    return float(task_scorer("ioi").metric(logits, batch).sum())


class ScaleFD:
    """Central differences of the summed metric in the intervention's scales, patched toward the corrupted run."""

    def __init__(self, model, view, comps, universe, batch):
        self.model, self.universe, self.batch = model, universe, batch
        self.iv = Intervention(view, comps)
        with torch.no_grad(), self.iv.record() as ref:
            model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])
        self.ref = dict(ref)

    def metric(self, scales) -> float:
        with torch.no_grad(), self.iv.apply(self.universe.split(scales), reference=self.ref):
            return _metric(self.model, self.batch)

    def slope(self, base, direction) -> float:
        """d m / d t of ``m(base + t direction)`` at 0 (``direction``: [N])."""
        return (self.metric(base + EPS * direction) - self.metric(base - EPS * direction)) / (2 * EPS)


def _sample(n, *scores, k=10, top=3):
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(n, generator=g)[:k].tolist()
    for s in scores:
        idx += s.abs().argsort(descending=True)[:top].tolist()
    return sorted(set(idx))


def _unit(n, i):
    e = torch.zeros(n, dtype=torch.float64)
    e[i] = 1.0
    return e


@pytest.mark.parametrize("arch", [*ARCHITECTURES, *HEAD_NORM_ARCHITECTURES])
def test_eap_and_joint_eap_ig_equal_finite_differences(batch, arch):
    """EAP = d m / d lambda_k at the clean run; joint EAP-IG (2 steps) = the mean of d m / d lambda_k at
    lambda = 0.5 and 1 for every direction at once."""
    model, view, comps, universe = _setup(arch)
    n = len(universe)
    with exact_rms_norms(model):
        patch = CircuitPatch(view, comps)
        eap = universe.flatten(batch_direction_attributions(patch, batch, "ioi", steps=1))
        ig = universe.flatten(batch_direction_attributions(patch, batch, "ioi", steps=2, path="joint"))
        fd = ScaleFD(model, view, comps, universe, batch)
        ones = torch.ones(n, dtype=torch.float64)
        for i in _sample(n, eap, ig):
            e = _unit(n, i)
            assert abs(fd.slope(ones, e) - eap[i]) <= TOL * eap.abs().max(), (arch, str(universe.address(i)))
            want = sum(fd.slope(a * ones, e) for a in alphas(2)) / 2
            assert abs(want - ig[i]) <= TOL * ig.abs().max(), (arch, str(universe.address(i)))
    assert eap.abs().max() > 1e-4 and not torch.allclose(eap, ig)  # the model moves; the path matters
    kinds = {a.kind for a in map(universe.address, _sample(n, eap, ig))}
    assert {"q", "k", "ov", "mlp_out"} <= kinds


def test_layer_path_equals_finite_differences(batch):
    """Per-layer IG: layer l's directions take the derivative of the run with only layer l at lambda = alpha."""
    model, view, comps, universe = _setup("llama")
    n = len(universe)
    with exact_rms_norms(model):
        got = universe.flatten(batch_direction_attributions(CircuitPatch(view, comps), batch, "ioi", 2, "layer"))
        fd = ScaleFD(model, view, comps, universe, batch)
        for i in _sample(n, got):
            layer = universe.address(i).layer
            want = 0.0
            for a in alphas(2):
                base = torch.ones(n, dtype=torch.float64)
                for c in comps:
                    if c.layer == layer:
                        base[universe.slice(c.name)] = a
                want += fd.slope(base, _unit(n, i)) / 2
            assert abs(want - got[i]) <= TOL * got.abs().max(), str(universe.address(i))


def test_inputs_path_equals_finite_differences(batch):
    """MIB's EAP-IG-inputs: the residual entering layer 0 interpolated; the derivative of that run along the
    direction's fixed clean-minus-corrupted change, added by a hand-written hook on the site output."""
    model, view, comps, universe = _setup("llama")
    n = len(universe)
    iv = Intervention(view, comps)
    with exact_rms_norms(model):
        got = universe.flatten(batch_direction_attributions(CircuitPatch(view, comps), batch, "ioi", 2, "inputs"))
        coef = {}
        with torch.no_grad():
            for ids in ("clean_ids", "corrupt_ids", "embed"):
                if ids == "embed":
                    continue
                with iv.record() as rec:
                    model(input_ids=batch[ids], attention_mask=batch["attention_mask"])
                coef[ids] = dict(rec)
            embed = {ids: view.embed(batch[ids]) for ids in ("clean_ids", "corrupt_ids")}

        def metric(alpha, comp, group, k, eps) -> float:
            change = (coef["clean_ids"][comp.name] - coef["corrupt_ids"][comp.name])[..., group, k]
            write = change[..., None] * comp.V[group, :, k]  # [B, T, d_out of one group]

            def pre(module, args, kwargs):
                x = embed["corrupt_ids"] + alpha * (embed["clean_ids"] - embed["corrupt_ids"])
                return (x, *args[1:]), kwargs

            def post(module, args, kwargs, out):
                out = out.clone()
                width = write.shape[-1]
                start = 0 if comp.kind in ("ov", "mlp_in", "mlp_gate", "mlp_out") else group * width
                out[..., start : start + width] += eps * write
                return out

            site = view.site_module(comp.layer, comp.site)
            with torch.no_grad(), hooks(Hook(view.block(0), pre, "pre"), Hook(site, post, "post")):
                return _metric(model, batch)

        for i in _sample(n, got):
            a = universe.address(i)
            comp = next(c for c in comps if c.name == a.component)
            want = (
                sum(
                    (metric(x, comp, a.group, a.index, EPS) - metric(x, comp, a.group, a.index, -EPS)) / (2 * EPS)
                    for x in alphas(2)
                )
                / 2
            )
            assert abs(want - got[i]) <= TOL * got.abs().max(), str(a)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_heads_ov_directions_sum_to_its_attribution(batch, arch):
    """Head level on the same path: at the clean run the sums over each head's OV directions (each MLP's output
    directions) equal head-level attribution patching (analysis.attribution, its own hooks); with the writers
    interpolated (3 steps) each head's sum equals the finite difference along all of its OV scales at once."""
    model, view, comps, universe = _setup(arch)
    n = len(universe)
    with exact_rms_norms(model):
        patch = CircuitPatch(view, comps)
        eap = batch_direction_attributions(
            patch, batch, "ioi", 1, names=[c.name for c in comps if c.kind in WRITER_KINDS]
        )
        units = unit_attributions(universe, universe.flatten(eap), view.n_layers, view.n_heads, 1)
        want = batch_attributions(view, batch, "ioi")
        scale = float(want.heads.abs().max())
        n_prompts = len(batch["answer_pos"])
        assert (units.heads / n_prompts - want.heads).abs().max() <= TOL * scale
        assert (units.mlps / n_prompts - want.mlps).abs().max() <= TOL * scale

        writers = [c.name for c in comps if c.kind in WRITER_KINDS]
        ig = universe.flatten(batch_direction_attributions(patch, batch, "ioi", 3, names=writers))
        heads = unit_attributions(universe, ig, view.n_layers, view.n_heads, 1).heads
        fd = ScaleFD(model, view, comps, universe, batch)
        writer = torch.zeros(n, dtype=torch.bool)
        for name in writers:
            writer[universe.slice(name)] = True
        for layer, head in ((0, 1), (1, 2)):
            block = torch.zeros(n, dtype=torch.float64)
            start = universe.slice(f"L{layer}.ov").start + head * view.d_head
            block[start : start + view.d_head] = 1.0
            slope = 0.0
            for a in alphas(3):
                base = torch.where(writer, a, 1.0).double()
                slope += fd.slope(base, block) / 3
            assert abs(slope - heads[layer, head]) <= TOL * heads.abs().max()
    assert scale > 1e-5


def test_joint_path_is_complete(batch):
    """The joint path's attributions sum to m(clean) - m(corrupted) as the steps grow: right Riemann sums of one
    path integral, error ~ 1/steps, so the Richardson estimate 2 S(32) - S(16) is within 2 % of the gap while
    S(16) itself is not."""
    model, view, comps, universe = _setup("llama")
    with exact_rms_norms(model):
        patch = CircuitPatch(view, comps)
        gap = _metric(model, batch) - _metric(model, {**batch, "clean_ids": batch["corrupt_ids"]})
        s16, s32 = (
            float(universe.flatten(batch_direction_attributions(patch, batch, "ioi", n)).sum()) for n in (16, 32)
        )
    assert abs(2 * s32 - s16 - gap) <= 0.02 * abs(gap) < abs(s16 - gap), (s16, s32, gap)


def test_bad_options_fail_in_one_line(batch):
    model, view, comps, universe = _setup("llama")
    patch = CircuitPatch(view, comps)
    with pytest.raises(ValueError, match="steps=0"):
        batch_direction_attributions(patch, batch, "ioi", steps=0)
    with pytest.raises(ValueError, match="path="):
        batch_direction_attributions(patch, batch, "ioi", path="nodes")
