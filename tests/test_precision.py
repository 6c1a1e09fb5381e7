"""The frozen model in bfloat16 / float16, the analysis maths in float32 / float64.

Each method run on a tiny model in bf16 against the same run in float32 (tolerances stated per test: bf16
keeps 8 bits of mantissa, a relative rounding of 2^-9 ~ 0.002 per operation), and the analysis tensors
checked to be float32 / float64. The view of a bf16 model is compared with the view of a float32 model holding
the same (bf16-rounded) values to 1e-6: the weights are read in float32 before any arithmetic (folding in bf16
would differ by ~4e-3).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from lit_svd.models import view as make_view
from lit_svd.models.intervene import build_components
from lit_svd.models.loading import torch_dtype
from lit_svd.models.tiny import tiny_causal_lm
from tests.helpers import run_test

TINY_TILES = {"q": 32, "k": 16, "v": 16, "o": 32, "gate": 32, "up": 32, "down": 64}


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox", "llama", "gemma2", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_view_of_a_half_precision_model_reads_float32_weights_exactly(arch, dtype):
    half = tiny_causal_lm(arch, seed=0).to(dtype)
    rounded = tiny_causal_lm(arch, seed=0).to(dtype).to(torch.float32)  # the same values, held in float32
    vh, vr = make_view(half), make_view(rounded)
    assert vh.model_dtype == dtype and vh._dtype == torch.float32
    for layer in range(vh.n_layers):
        for name, a, b in [
            *((f"attn.{k}", getattr(vh.attn(layer), k), getattr(vr.attn(layer), k)) for k in ("W_Q", "b_K", "W_O")),
            ("mlp_in", vh.mlp_in(layer), vr.mlp_in(layer)),
            ("mlp_out", vh.mlp_out(layer), vr.mlp_out(layer)),
            ("qk.A", vh.qk(layer, -2).A, vr.qk(layer, -2).A),
            ("ov.B", vh.ov(layer).B, vr.ov(layer).B),
            ("site_weight", vh.site_weight(layer, "o")[0], vr.site_weight(layer, "o")[0]),
        ]:
            assert a.dtype == torch.float32, name
            # float32 summation order only (strided views vs copies): 1e-6, far below bf16's 4e-3 rounding
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"{arch} L{layer} {name}")
    assert torch.equal(vh.unembed()[0], vr.unembed()[0]) and vh.unembed()[0].dtype == torch.float32
    assert torch.equal(vh.W_E, vr.W_E) and vh.W_E.dtype == torch.float32
    resid = torch.randn(2, 5, vh.d_model).to(dtype)
    assert vh.normalized("attn", 0, resid).dtype == torch.float32


def test_bad_dtype_fails_naming_the_key():
    with pytest.raises(ValueError, match=r"model.dtype='int8' is not supported; choose one of float32, float64"):
        torch_dtype("int8", "model.dtype")


def _vocab_copies(model, ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Last-position logits of a ``logits_to_keep=1`` forward and how many ``aten::copy_`` calls in it
    copy a tensor as large as the vocabulary matrix (a per-example copy of the unembedding)."""
    from torch.profiler import ProfilerActivity, profile

    vocab = model.get_output_embeddings().weight.numel()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        logits = model(input_ids=ids, logits_to_keep=1).logits[:, -1]
    big = [e for e in prof.events() if e.name == "aten::copy_" and any(_numel(s) >= vocab for s in e.input_shapes if s)]
    return logits, len(big)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_bf16_last_position_logits_do_not_copy_the_unembedding_per_example(tiny_dirs):
    """A frozen bf16 model's ``logits_to_keep=1`` forward of a batch: through ``load_causal_lm`` the vocabulary
    product is one plain product (no copy of the unembedding); the same model without the loader's pre-hook
    copies it once per example (the case the hook exists for: 16.8 GB at Llama-3.1-8B, 16 prompts), and the
    logits agree exactly with a forward of every position."""
    from lit_svd.models.loading import load_causal_lm

    lm, _ = load_causal_lm(tiny_dirs["llama"], dtype="bfloat16")
    for p in lm.parameters():
        p.requires_grad_(False)  # frozen, as every module holds it
    ids = torch.randint(0, 2000, (4, 12), generator=torch.Generator().manual_seed(0))
    logits, copies = _vocab_copies(lm, ids)
    assert copies == 0
    with torch.no_grad():
        every = lm(input_ids=ids).logits[:, -1]
    assert torch.equal(logits, every)
    bare = tiny_causal_lm("llama", seed=0).to(torch.bfloat16).eval().requires_grad_(False)
    _, bare_copies = _vocab_copies(bare, ids)
    assert bare_copies >= 1  # the control: torch's unfolded bf16 product does copy it


# --- each method in bf16 against float32 on a tiny Llama --------------------------------------------
@pytest.fixture(scope="module")
def tiny_llama(tiny_dirs):
    return tiny_dirs["llama"]


def _batches(n=3, b=4, L=24):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 2000, (b, L), generator=g)} for _ in range(n)]


def test_sad_in_bf16_is_close_to_float32_and_decomposes_in_float32(tiny_llama):
    from lit_svd.modules.sad import SADAnalysisModule

    got = {}
    for dt in ("float32", "bfloat16"):
        m = SADAnalysisModule(model=tiny_llama, dtype=dt, min_pairs=1, input_key="input_ids", null_draws=4)
        assert m.lm.dtype == torch_dtype(dt)
        run_test(m, _batches())
        assert all(b.U.dtype == torch.float32 for b in m.bases.values())
        assert all(t.dtype == torch.float64 for t in m.stats.metric_state.values())
        got[dt] = m.results()["heads"]
    f32, b16 = got["float32"], got["bfloat16"]
    assert [(h["layer"], h["head"]) for h in f32] == [(h["layer"], h["head"]) for h in b16]
    # attention patterns move by bf16 rounding, so a few pairs near the threshold flip: counts within 3 %
    for a, b in zip(f32, b16):
        assert b["n_pairs"] == pytest.approx(a["n_pairs"], rel=0.03)
        assert b["sparsity"] == pytest.approx(a["sparsity"], abs=0.01)
        assert b["sparsity_null_p05"] == pytest.approx(a["sparsity_null_p05"], abs=0.01)
    worst = max(abs(a["sparsity"] - b["sparsity"]) for a, b in zip(f32, b16))
    assert worst > 0  # the bf16 run did run in bf16


def test_mounts_in_bf16_are_close_to_float32_with_float32_plans(tiny_llama):
    from lit_svd.modules.mounts import MountsAnalysisModule

    rows = {}
    for dt in ("float32", "bfloat16"):
        m = MountsAnalysisModule(
            model=tiny_llama,
            dtype=dt,
            tile_widths=TINY_TILES,
            modes_sweep=[1, 2, 4],
            layers=[1],
            sites=["q", "o", "down"],
            steer_texts=2,
            steer_mounts=2,
            rules={"c1_min_layer": 0},
        )
        run_test(m, _batches())
        rows[dt] = {(r["site"], r["layer"]): r for r in m.rows}
        plan = m.plans["L1_q"] if getattr(m, "plans", None) else None
        if plan is not None:
            assert plan.W.dtype == torch.float32
    assert rows["float32"].keys() == rows["bfloat16"].keys()
    for key, a in rows["float32"].items():
        b = rows["bfloat16"][key]
        for field in ("lift_tiled", "lift_svd", "coverage_lift", "span_ceiling"):
            if isinstance(a.get(field), float):
                assert b[field] == pytest.approx(a[field], abs=0.01), (key, field)


def _mask_fit(model_dir, tokenizer, dtype):
    from lit_svd.callbacks import DirectionMaskReport
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    pl.seed_everything(0, verbose=False)
    module = DirectionMaskModule(
        model=model_dir, lr=0.5, alpha=1e-2, init=0.6, threshold=0.3, ablation="patch", steps_per_batch=2, dtype=dtype
    )
    dm = TaskDataModule("ioi", tokenizer, n_train=8, n_val=8, n_test=0, batch_size=8)
    out = tempfile.mkdtemp()
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        default_root_dir=out,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[DirectionMaskReport()],
    )
    trainer.fit(module, dm)
    return module, json.loads((Path(trainer.log_dir) / "results.json").read_text())


def test_masks_in_bf16_train_float32_parameters_close_to_float32(tiny_llama, tokenizer):
    m32, r32 = _mask_fit(tiny_llama, tokenizer, "float32")
    m16, r16 = _mask_fit(tiny_llama, tokenizer, "bfloat16")
    assert m16.lm.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in m16.theta.values())
    batch = next(iter(m16.trainer.datamodule.train_dataloader()))
    assert m16.answer_logits(batch["clean_ids"], batch).dtype == torch.float32  # KL and loss in float32
    for key in ("kl_soft", "kl_hard"):  # KL of a few 1e-3: within 10 % of itself
        assert r16[key] == pytest.approx(r32[key], rel=0.1, abs=1e-4), key
    for key in ("logit_diff_full", "logit_diff_soft"):
        assert r16[key] == pytest.approx(r32[key], abs=0.01), key
    lam32, lam16 = (torch.cat([p.detach().flatten() for p in m.theta.values()]) for m in (m32, m16))
    assert torch.allclose(lam16, lam32, atol=0.05) and not torch.equal(lam16, lam32)


def _kept_run(folder: Path, model_dir: str) -> Path:
    """A finished mask run (masks.pt, config.yaml) keeping a few OV directions of the tiny Llama."""
    view = make_view(tiny_causal_lm("llama"))
    lambdas = {c.name: torch.full(c.shape, 1e-4) for c in build_components(view, ["qk", "ov", "mlp"])}
    for name, g, k in (("L0.ov", 0, 0), ("L0.ov", 2, 1), ("L1.ov", 3, 0)):
        lambdas[name][g, k] = 0.9
    folder.mkdir(parents=True)
    torch.save(
        {"lambdas": lambdas, "threshold": 1e-3, "model": model_dir, "hparams": {"fold_norms": True}},
        folder / "masks.pt",
    )
    data = {"task": "ioi", "n_train": 8, "n_val": 4, "n_test": 6, "batch_size": 6, "seed": 0, "test_last": True}
    config = {"class_path": "lit_svd.datamodules.tasks.TaskDataModule", "init_args": {**data, "tokenizer": model_dir}}
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": config}))
    return folder


def test_causal_check_in_bf16_gives_the_float32_z(tiny_llama, tokenizer, tmp_path):
    from lit_svd.callbacks.direction_report import DirectionReport
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules.direction_check import DirectionCheckModule

    run = _kept_run(tmp_path / "run", tiny_llama)
    z = {}
    for dt in ("float32", "bfloat16"):
        pl.seed_everything(0, verbose=False)
        module = DirectionCheckModule(run=str(run), n_random=8, dtype=dt)
        assert module.lm.dtype == torch_dtype(dt)
        dm = TaskDataModule("ioi", tiny_llama, n_train=8, n_val=4, n_test=6, batch_size=6, seed=0, test_last=True)
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            logger=False,
            default_root_dir=str(tmp_path / dt),
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[DirectionReport()],
        )
        trainer.test(module, dm, verbose=False)
        z[dt] = module.table
    assert len(z["float32"]) == 3
    # the tiny random model's patch effects are ~3e-3 logits, its logits ~1: bf16 logits carry ~4e-3 of rounding
    # each, so effects (means over 6 prompts) agree to 1e-3 and z (effect over a null spread of ~2e-3) is not
    # compared here; SmolLM2's z in bf16 and float32 are in docs/scale.md
    for a, b in zip(z["float32"], z["bfloat16"]):
        assert (a["component"], a["head"], a["direction"]) == (b["component"], b["head"], b["direction"])
        assert b["sigma"] == pytest.approx(a["sigma"], rel=1e-2)  # the SVD of bf16-rounded weights
        assert b["effect"] == pytest.approx(a["effect"], abs=1e-3)
        assert b["null_mean"] == pytest.approx(a["null_mean"], abs=1e-3)
    assert any(a["effect"] != b["effect"] for a, b in zip(z["float32"], z["bfloat16"]))
