"""Fast circuit patching (lit_svd.models.patching) against ``Intervention.apply`` (scales 1 on the kept directions, 0
elsewhere, the corrupted coefficients as reference: the independent, slower form of the same ablation), on float64
tiny models of every architecture (float64 RMS norms, tests/helpers.exact_rms_norms). Tolerance 2e-7 of the
answer logits' scale: both keep the SVDs in float32 (cast from float64), and the two forms differ by the part of
``own - own_ref`` outside the float32 span of ``V``."""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.faithfulness import Universe, universe_components
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.metrics import forward_answer_logits
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, hooks
from lit_svd.models.intervene import Intervention
from lit_svd.models.patching import CircuitPatch
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm
from tests.helpers import exact_rms_norms

TOL = 2e-7


@pytest.fixture(scope="module")
def batch(tokenizer):
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=6, batch_size=6, seed=0)
    return next(iter(dm.test_dataloader()))


def _answer(model, batch):
    return forward_answer_logits(model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])


@torch.no_grad()
@pytest.mark.parametrize("arch", [*ARCHITECTURES, *HEAD_NORM_ARCHITECTURES])
def test_patch_equals_the_interventions_scales(batch, arch):
    model = tiny_causal_lm(arch, seed=1).double()
    view = make_view(model)
    comps = universe_components(view)
    universe = Universe(comps)
    iv, patch = Intervention(view, comps), CircuitPatch(view, comps)
    with exact_rms_norms(model):
        with iv.record() as ref:
            model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])
        reference = patch.record(batch["corrupt_ids"], batch["attention_mask"])
        clean = _answer(model, batch)
        g = torch.Generator().manual_seed(3)
        for frac in (0.05, 0.5, 0.95):  # the kept route, both, the dropped route
            keep = torch.rand(len(universe), generator=g) < frac
            keep[universe.slice("L0.mlp_out")] = False  # layer 0's MLP skipped whole
            keep[universe.slice("L1.q")] = True  # a component kept whole: not hooked
            keep[universe.slice("L1.ov")] = False  # one written from the reference
            with iv.apply(universe.scales(keep, torch.float64), reference=dict(ref)):
                want = _answer(model, batch)
            with patch.apply(universe.split(keep), reference):
                got = _answer(model, batch)
            assert (got - want).abs().max() <= TOL * want.abs().max(), (arch, frac)
            assert (want - clean).abs().max() > 1e-4  # the circuit changes the logits
        with patch.apply({}, reference):
            assert torch.equal(_answer(model, batch), clean)  # nothing named: nothing hooked


@torch.no_grad()
@pytest.mark.parametrize("arch", [*ARCHITECTURES, *HEAD_NORM_ARCHITECTURES])
def test_input_route_equals_the_output_routes(batch, arch):
    """The input route (the site's module skipped, its kept directions read from the module's input) gives the
    answer logits of the output routes (``input_route=False``) to 2e-7 of their scale, and is taken exactly where
    a module computes its site alone: every kind on Llama-style models at 5 % kept; never GPT-2's fused q / k, nor
    q / k behind a head norm."""
    model = tiny_causal_lm(arch, seed=2).double()
    view = make_view(model)
    comps = universe_components(view)
    universe = Universe(comps)
    fast, slow = CircuitPatch(view, comps), CircuitPatch(view, comps, input_route=False)
    with exact_rms_norms(model):
        reference = fast.record(batch["corrupt_ids"], batch["attention_mask"])
        g = torch.Generator().manual_seed(4)
        for frac in (0.05, 0.3, 0.6):
            keep = universe.split(torch.rand(len(universe), generator=g) < frac)
            with slow.apply(keep, reference):
                want = _answer(model, batch)
            with fast.apply(keep, reference):
                got = _answer(model, batch)
            assert (got - want).abs().max() <= TOL * want.abs().max(), (arch, frac)
            skipped = {c.kind for c in comps if (p := fast.plan(c, keep[c.name])) is not None and p.skip}
            assert not any(p is not None and p.skip for c in comps if (p := slow.plan(c, keep[c.name])))
            if frac == 0.05:
                fused_or_normed = arch == "gpt2" or arch in HEAD_NORM_ARCHITECTURES or arch == "gpt_neox"
                assert ({"q", "k"} <= skipped) != fused_or_normed, (arch, skipped)
                assert "ov" in skipped and "mlp_in" in skipped, (arch, skipped)


@torch.no_grad()
def test_skipped_mlp_returns_the_corrupted_output_without_running(batch):
    """A layer whose mlp_out is dropped whole: its MLP's down projection sees zero positions and the block gets
    the corrupted run's MLP output."""
    model = tiny_causal_lm("llama", seed=1).double()
    view = make_view(model)
    comps = universe_components(view)
    universe, patch = Universe(comps), CircuitPatch(view, comps)
    reference = patch.record(batch["corrupt_ids"], batch["attention_mask"])
    with capture({"down": view.site_module(0, "down")}, "post") as corrupt:
        model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])
    keep = torch.ones(len(universe), dtype=torch.bool)
    keep[universe.slice("L0.mlp_out")] = False
    seen = {}

    def post(module, args, kwargs, out):
        seen["down_in"] = args[0].shape

    with patch.apply(universe.split(keep), reference), hooks(Hook(view.site_module(0, "down"), post, "post")):
        with capture({"mlp": view.mlp_module(0)}, "post") as got:
            _answer(model, batch)
    assert seen["down_in"][1] == 0
    assert torch.equal(got["mlp"], corrupt["down"])


def test_bad_keeps_fail_in_one_line(batch):
    view = make_view(tiny_causal_lm("llama", seed=1))
    comps = universe_components(view)
    patch = CircuitPatch(view, comps)
    reference = patch.record(batch["corrupt_ids"], batch["attention_mask"])
    with pytest.raises(KeyError, match="no component 'L9.q'"):
        with patch.apply({"L9.q": torch.ones(4, 16)}, reference):
            pass
    with pytest.raises(ValueError, match=r"keep\['L0.q'\] has shape"):
        with patch.apply({"L0.q": torch.ones(3, 16)}, reference):
            pass
    from lit_svd.models.intervene import build_components

    gpt2 = make_view(tiny_causal_lm("gpt2"))
    with pytest.raises(ValueError, match="joint qk"):
        CircuitPatch(gpt2, build_components(gpt2, ["qk"]))
