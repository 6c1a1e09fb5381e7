"""The direction mask trained under the faithfulness curve's own ablation (``configs/masks/*_faithful.yaml``): every
unkept direction of the q, k, ov and MLP maps (null directions left out) patched toward the corrupted prompt at every
position. Its masked forward against a hand-written patch of the HF forward and against the clean and corrupted HF
forwards (float64 tiny models), the loss and schedule options, and the trained ranking on the planted circuit."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from lit_svd.analysis.faithfulness import MIB_SIZES, Universe, faithfulness_curves, universe_components
from lit_svd.analysis.masks import alpha_at, metric_distance
from lit_svd.analysis.rankings import mask_order_scores, mask_ranking, random_ranking
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.linalg import NULL_RTOL
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, first_input, hooks
from lit_svd.modules import DirectionMaskModule
from tests.planted import planted_llama

FAITHFUL = dict(components=["q", "k", "ov", "mlp"], ablation="patch", positions="all", drop_null=True)


def _module(folder: str, **kwargs) -> DirectionMaskModule:
    return DirectionMaskModule(model=folder, dtype="float64", **{**FAITHFUL, **kwargs})


def _batch(tokenizer, n: int = 6) -> dict:
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=n, batch_size=n, seed=0)
    return next(iter(dm.test_dataloader()))


def _answer_logits(model, ids: torch.Tensor, batch: dict) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits
    return logits[torch.arange(len(ids)), batch["answer_pos"]]


def _dense_v(view, kind: str, layer: int, k: int) -> torch.Tensor:
    """``[G, d_out, k]``: the first ``k`` right singular vectors of an independent dense float64 SVD of the view's
    augmented map of ``kind`` (per head, KV head or layer)."""
    if kind == "ov":
        M = view.ov(layer).dense()
    elif kind == "q":
        M = view.q_map(layer)
    elif kind == "k":
        M = view.k_map(layer)[:: view.n_heads // view.n_kv_heads]
    else:
        M = getattr(view, kind)(layer)[None]
    _, S, Vh = torch.linalg.svd(M.double(), full_matrices=False)
    assert (S[:, :k] > NULL_RTOL * S[:, :1]).all()
    return Vh[:, :k].mT


SITES = {"q": "q", "k": "k", "ov": "o", "mlp_in": "up", "mlp_gate": "gate", "mlp_out": "down"}


def _hand_patch_hooks(view, drop_v: dict, corrupted: dict | None, store: dict) -> list[Hook]:
    """Forward hooks on every masked site. Recording (``corrupted`` None): each site's output per group (``ov``: each
    head's write ``z_h W_O[h]``) into ``store``. Patching: ``out += P_drop (out_corrupt - out)`` per group, ``P_drop``
    the orthogonal projection on the unkept directions' ``v`` (``drop_v``)."""
    specs = []
    for name, v_drop in drop_v.items():
        layer, kind = int(name.split(".")[0][1:]), name.split(".")[1]
        site = SITES[kind]
        norm = view.head_norm_module(layer, site) if kind in ("q", "k") else None
        module = norm if norm is not None else view.site_module(layer, site)

        def hook(mod, args, kwargs, out, name=name, layer=layer, kind=kind, site=site, norm=norm, v=v_drop):
            own = view.head_norm_output(out) if norm is not None else view.site_output(layer, site, out)
            if kind == "ov":
                z = first_input(args, kwargs)
                z = z.reshape(*z.shape[:-1], view.n_heads, -1)
                groups = torch.einsum("bthe,hed->bthd", z, view.attn(layer).W_O.to(z.dtype))
            else:
                groups = own.reshape(*own.shape[:-1], v.shape[0], -1)
            if corrupted is None:
                store[name] = groups
                return out
            delta = torch.einsum("bthd,hdk,hek->bthe", corrupted[name] - groups, v, v)
            delta = delta.sum(-2) if kind == "ov" else delta.flatten(-2)
            new = own + delta
            return (
                view.with_head_norm_output(out, new)
                if norm is not None
                else view.with_site_output(layer, site, out, new)
            )

        specs.append(Hook(module, hook, "post"))
    return specs


@torch.no_grad()
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3", "qwen2"])
def test_the_faithful_mask_equals_a_hand_written_patch_of_the_hf_forward(tiny_dirs, tokenizer, arch):
    """Random hard masks: the module's masked forward (its ``Intervention`` with the recorded corrupted coefficients)
    equals the HF forward with hand-written hooks that move every unkept direction of every map to its corrupted
    value at every position (projections from independent dense SVDs), to 1e-7 of the logits' scale."""
    module = _module(tiny_dirs[arch])
    model, view = module.lm, module.view
    batch = _batch(tokenizer)
    g = torch.Generator().manual_seed(0)
    scales = {c.name: (torch.rand(c.shape, generator=g) < 0.6).double() for c in module.components}
    got = module.answer_logits(batch["clean_ids"], batch, scales, module.reference(batch))

    drop_v = {}
    for c in module.components:
        v = _dense_v(view, c.kind, c.layer, c.shape[1])
        drop_v[c.name] = v * (1 - scales[c.name]).unsqueeze(-2)  # the unkept directions' v, the kept ones zeroed
    store: dict = {}
    with hooks(*_hand_patch_hooks(view, drop_v, None, store)):
        corrupt_logits = _answer_logits(model, batch["corrupt_ids"], batch)
    with hooks(*_hand_patch_hooks(view, drop_v, store, {})):
        want = _answer_logits(model, batch["clean_ids"], batch)
    clean = _answer_logits(model, batch["clean_ids"], batch)
    scale = clean.abs().max()
    assert (got - want).abs().max() <= 1e-7 * scale, (got - want).abs().max()
    assert (want - clean).abs().max() > 1e-3 * scale and (want - corrupt_logits).abs().max() > 1e-3 * scale  # neither


@torch.no_grad()
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_the_hard_masked_forward_is_the_faithfulness_curves_circuit(tiny_dirs, tokenizer, arch):
    """A random hard mask: the module's masked forward equals the faithfulness curve's circuit with the same kept
    directions (``models.patching.CircuitPatch``, every other direction patched to the corrupted prompt at every
    position; the same float64 components), to 1e-9 of the logits' scale: the mask trains on what the curve scores."""
    from lit_svd.models.patching import CircuitPatch

    module = _module(tiny_dirs[arch])
    batch = _batch(tokenizer)
    g = torch.Generator().manual_seed(1)
    keep = {c.name: torch.rand(c.shape, generator=g) < 0.5 for c in module.components}
    got = module.answer_logits(
        batch["clean_ids"], batch, {n: k.double() for n, k in keep.items()}, module.reference(batch)
    )
    patch = CircuitPatch(module.view, module.components)
    with patch.apply(keep, patch.record(batch["corrupt_ids"], batch["attention_mask"])):
        want = _answer_logits(module.lm, batch["clean_ids"], batch)
    clean = _answer_logits(module.lm, batch["clean_ids"], batch)
    assert (got - want).abs().max() <= 1e-9 * clean.abs().max(), (got - want).abs().max()
    assert (want - clean).abs().max() > 1e-3 * clean.abs().max()


@torch.no_grad()
@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "gemma3", "qwen2", "qwen3"])
def test_all_kept_is_the_clean_forward_and_none_kept_the_corrupted_one(tiny_dirs, tokenizer, arch):
    module = _module(tiny_dirs[arch])
    batch = _batch(tokenizer)
    reference = module.reference(batch)
    ones = {c.name: torch.ones(c.shape, dtype=torch.float64) for c in module.components}
    zeros = {n: torch.zeros_like(t) for n, t in ones.items()}
    clean = _answer_logits(module.lm, batch["clean_ids"], batch)
    corrupt = _answer_logits(module.lm, batch["corrupt_ids"], batch)
    scale = clean.abs().max()
    assert (corrupt - clean).abs().max() > 1e-3 * scale  # the prompts differ where it matters
    full = module.answer_logits(batch["clean_ids"], batch, ones, reference)
    empty = module.answer_logits(batch["clean_ids"], batch, zeros, reference)
    assert (full - clean).abs().max() <= 1e-7 * scale
    assert (empty - corrupt).abs().max() <= 1e-7 * scale
    # the module masks exactly the faithfulness universe
    universe = Universe(universe_components(module.view))
    assert [(c.name, c.shape) for c in module.components] == list(zip(universe.names, universe.shapes, strict=True))


def test_metric_distance_and_alpha_schedule():
    full, corrupt = torch.tensor([3.0, 1.0]), torch.tensor([1.0, -1.0])  # gap 2
    assert float(metric_distance(full, full, corrupt)) == 0
    assert float(metric_distance(corrupt, full, corrupt)) == pytest.approx(1.0)
    assert float(metric_distance(torch.tensor([4.0, 1.0]), full, corrupt)) == pytest.approx(0.125)  # (1/2)^2 / 2
    assert alpha_at(1e-4, None, 50, 100) == 1e-4
    assert [alpha_at(1e-4, 1e-2, s, 100) for s in (0, 50, 100, 150)] == pytest.approx([1e-4, 1e-3, 1e-2, 1e-2])
    with pytest.raises(ValueError, match="alpha_final"):
        DirectionMaskModule(model="smollm2-135m", alpha=0.0, alpha_final=1e-3)
    with pytest.raises(ValueError, match="loss"):
        DirectionMaskModule(model="smollm2-135m", loss="mse")


def test_the_ranking_reads_the_last_kept_step_then_the_logit(tiny_dirs):
    """``mask_order_scores``: by ``last_kept``, then by the logit (no ties where lambda underflows to 0)."""
    module = _module(tiny_dirs["llama"])
    universe = Universe(universe_components(module.view))
    g = torch.Generator().manual_seed(0)
    logits = {n: -200 * torch.rand(s, generator=g) for n, s in zip(universe.names, universe.shapes, strict=True)}
    last = {n: torch.randint(0, 3, s, generator=g) for n, s in zip(universe.names, universe.shapes, strict=True)}
    state = {"lambdas": {n: t.float().sigmoid() for n, t in logits.items()}, "logits": logits, "last_kept": last}
    scores, by = mask_order_scores(universe, state)
    flat_logit, flat_last = universe.flatten(logits), universe.flatten(last)
    assert by == "last_kept, logit" and (universe.flatten(state["lambdas"]) == 0).sum() > 10  # underflowed lambdas
    ranking, _ = mask_ranking(universe, state)
    key = [(float(flat_last[i]), float(flat_logit[i])) for i in ranking]
    assert key == sorted(key, reverse=True)
    assert mask_order_scores(universe, {"lambdas": state["lambdas"], "logits": logits})[1] == "logit"


def test_on_the_planted_circuit_the_trained_ranking_puts_live_directions_first(tokenizer, tmp_path):
    """The planted tiny Llama (only head L1.h0 writes): a faithful mask trained with the metric loss (40 steps) ranks
    only live directions (L1's q head 0, k KV head 0, ov head 0) in its first 24, and its faithfulness curve (on
    other prompts) beats three random rankings by more than 0.2 CPR."""
    planted_llama().save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    module = _module(str(tmp_path), loss="metric", alpha=1e-3, lr=0.5, soft_steps=10, steps_per_batch=2)
    module.lm.set_attn_implementation("sdpa")
    dm = TaskDataModule("ioi", tokenizer, n_train=32, n_val=0, n_test=0, batch_size=8, seed=1)
    pl.Trainer(
        max_steps=40,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    ).fit(module, dm)
    comps = universe_components(module.view)
    universe = Universe(comps)
    ranking, info = mask_ranking(universe, module.masks_state())
    assert info["ranked_by"] == "last_kept, logit" and info["directions_scored"] == len(universe)
    live = set()
    for name in ("L1.q", "L1.k", "L1.ov"):
        sl = universe.slice(name)
        live |= set(range(sl.start, sl.start + 16))  # head 0 / KV head 0: the first group of each map
    assert set(ranking[:24].tolist()) <= live
    rankings = {"mask": ranking, **{f"random_{s}": random_ranking(len(universe), s) for s in range(3)}}
    other = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=16, batch_size=16, seed=0)  # new prompts
    assert not {tuple(e.clean_ids) for e in other.splits["test"].examples} & {
        tuple(e.clean_ids) for e in dm.splits["train"].examples
    }
    curves, info = faithfulness_curves(module.view, comps, list(other.test_dataloader()), rankings, "ioi", MIB_SIZES)
    assert abs(info["m_full"] - info["m_empty"]) > 1e-2
    for axis in ("raw", "fair"):
        cpr = {n: c[axis].cpr for n, c in curves.items()}
        print(axis, {n: round(v, 3) for n, v in cpr.items()}, sorted(ranking.tolist().index(i) for i in live)[24:])
        assert cpr["mask"] > max(cpr[f"random_{s}"] for s in range(3)) + 0.2, (axis, cpr)
        assert math.isfinite(curves["mask"][axis].cmd)


@torch.no_grad()
@pytest.mark.parametrize("kind", ["q", "k"])
def test_q_and_k_masks_follow_the_positions_and_the_reference(tokenizer, kind):
    """On a rotary model ``q`` / ``k`` masks are patched like OV and MLP masks: every direction at lambda 0 with the
    answer position's corrupted coefficients as reference = the corrupted projection copied there alone (the shipped
    ``positions: answer`` runs patch q and k at the answer position; only a joint ``qk`` mask zero-ablates)."""
    from lit_svd.models.hooks import capture
    from lit_svd.models.intervene import Intervention, build_component
    from lit_svd.models.tiny import tiny_causal_lm

    model = tiny_causal_lm("llama", seed=0).double()
    view = make_view(model)
    comp = build_component(view, kind, 1, dtype=torch.float64)
    iv = Intervention(view, [comp])
    batch = _batch(tokenizer)
    pos, rows = batch["answer_pos"], torch.arange(len(batch["answer_pos"]))
    with iv.record(positions=pos) as ref:
        model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])
    with iv.apply({comp.name: torch.zeros(comp.shape, dtype=torch.float64)}, positions=pos, reference=ref):
        got = _answer_logits(model, batch["clean_ids"], batch)
    site = view.site_module(1, kind)
    with capture({"act": site}, "post") as store:
        model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])

    def hook(mod, args, kwargs, out):
        out = out.clone()
        out[rows, pos] = store["act"][rows, pos]
        return out

    with hooks(Hook(site, hook, "post")):
        want = _answer_logits(model, batch["clean_ids"], batch)
    clean = _answer_logits(model, batch["clean_ids"], batch)
    assert (got - want).abs().max() <= 1e-9 * clean.abs().max()
    assert (want - clean).abs().max() > 1e-4 * clean.abs().max()
