"""Head-level attribution patching (lit_svd.analysis.attribution) against an independent central finite difference
of the task metric along each head's (and MLP's) clean-to-corrupted path, written here with its own hooks, on
float64 tiny models run end to end in float64 (SDPA attention, tests/helpers.exact_rms_norms). The tiny Llama and
Gemma-3 are grouped-query models (4 query heads on 2 and 1 KV heads): TransformerLens 4.3 refuses edge attribution
on such models. Tolerance: 1e-6 of the largest |attribution| (central difference with eps 1e-4: its truncation
error is O(eps^2))."""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.attribution import attributions, batch_attributions
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.metrics import task_scorer
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, hooks
from lit_svd.models.tiny import tiny_causal_lm
from tests.helpers import exact_rms_norms

EPS = 1e-4


def _batch(tokenizer, n=6):
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=n, batch_size=n, seed=0)
    return next(iter(dm.test_dataloader()))


def _mean_metric(model, batch):
    logits = model(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"]).logits
    rows = torch.arange(len(batch["answer_pos"]))
    return float(task_scorer("ioi").metric(logits[rows, batch["answer_pos"]], batch).mean())


def _along(module, kind, part, delta, eps):
    """A hook adding ``eps * delta`` to ``part`` (a slice of the last dim) of the module's input / output."""

    def pre(mod, args, kwargs):
        x = args[0].clone()
        x[..., part] += eps * delta[..., part]
        return (x, *args[1:]), kwargs

    def post(mod, args, kwargs, out):
        out = out.clone()
        out[..., part] += eps * delta[..., part]
        return out

    return Hook(module, pre if kind == "pre" else post, kind)


@torch.no_grad()
@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_attribution_equals_the_finite_difference_of_patching(tokenizer, arch):
    model = tiny_causal_lm(arch, seed=2).double()
    model.set_attn_implementation("sdpa")  # HF's eager softmax computes in float32
    view = make_view(model)
    batch = _batch(tokenizer)
    with exact_rms_norms(model):
        got = batch_attributions(view, batch, "ioi")
        feeds = {}
        for ids in ("clean_ids", "corrupt_ids"):
            mods = {(l, s): view.site_module(l, s) for l in range(view.n_layers) for s in ("o", "down")}
            with capture({k: m for k, m in mods.items() if k[1] == "o"}, "pre") as z:
                with capture({k: m for k, m in mods.items() if k[1] == "down"}, "post") as out:
                    model(input_ids=batch[ids], attention_mask=batch["attention_mask"])
            feeds[ids] = {**z, **out}
        want_heads = torch.zeros(view.n_layers, view.n_heads, dtype=torch.float64)
        want_mlps = torch.zeros(view.n_layers, dtype=torch.float64)
        dh = view.d_head
        for l in range(view.n_layers):
            units = [("o", slice(h * dh, (h + 1) * dh), "pre", h) for h in range(view.n_heads)]
            units.append(("down", slice(None), "post", None))
            for site, part, kind, h in units:
                delta = feeds["corrupt_ids"][l, site] - feeds["clean_ids"][l, site]
                f = []
                for eps in (EPS, -EPS):
                    with hooks(_along(view.site_module(l, site), kind, part, delta, eps)):
                        f.append(_mean_metric(model, batch))
                slope = (f[0] - f[1]) / (2 * EPS)  # d m / d eps along clean -> corrupted
                if h is None:
                    want_mlps[l] = -slope
                else:
                    want_heads[l, h] = -slope
    scale = max(want_heads.abs().max(), want_mlps.abs().max())
    assert scale > 1e-5  # the heads and MLPs of the random model do move the metric
    assert (got.heads - want_heads).abs().max() <= 1e-6 * scale
    assert (got.mlps - want_mlps).abs().max() <= 1e-6 * scale
    assert view.n_kv_heads < view.n_heads or arch == "gpt2"


@torch.no_grad()
def test_attributions_over_batches_are_the_prompt_weighted_mean(tokenizer):
    model = tiny_causal_lm("llama", seed=2).double()
    model.set_attn_implementation("sdpa")
    view = make_view(model)
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=7, batch_size=7, seed=0)
    whole = batch_attributions(view, next(iter(dm.test_dataloader())), "ioi")
    dm.batch_size = 3
    parts = attributions(view, dm.test_dataloader(), "ioi")
    assert parts.prompts == 7
    assert torch.allclose(parts.heads, whole.heads, rtol=0, atol=1e-10 * whole.heads.abs().max())
    assert torch.allclose(parts.mlps, whole.mlps, rtol=0, atol=1e-10 * whole.mlps.abs().max())
