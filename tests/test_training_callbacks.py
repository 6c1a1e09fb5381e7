"""Mechanisms during training: MountsCallback, SpectrumCallback and SADCallback on a tiny LM fit.

Checked against independent computations: the mount rows against the mounts ``test`` run
(``MountsAnalysisModule``) on the trained weights and the same probe batch; the spectra against dense
SVDs of the dense per-head products; the TensorBoard event files against the callbacks' histories; the
probe against every training batch (no token the callbacks score is a training window); DDP against
one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lit_svd.analysis.spectrum import effective_rank, spectrum_rows, top_k_energy
from lit_svd.callbacks.mounts_training import MountsCallback
from lit_svd.callbacks.sad import SADCallback
from lit_svd.callbacks.spectrum import SpectrumCallback
from lit_svd.callbacks.training import held_out_probe
from lit_svd.models.hooks import Hook, hooks
from lit_svd.modules.language_model import LanguageModelModule
from tests.helpers import quiet_trainer

ROOT = Path(__file__).resolve().parents[1]
SEQ, WINDOWS = 16, 4
TILES = {"o": 8, "down": 32}
MOUNT_KW = dict(sites=["o", "down"], tile_widths=TILES, modes_per_tile=2, modes_sweep=[1, 2, 4], k_active=4, seed=0)
STEER_KW = dict(null_control=True, steer_texts=2, steer_tokens=8, steer_mounts=2)


def tiny_run(tmp_path, tokenizer, valid: str, probe: str, steps: int = 4):
    from lightning.pytorch.loggers import TensorBoardLogger

    from lit_svd.datamodules.text import TextDataModule

    dm = TextDataModule(tokenizer, path=valid, seq_len=SEQ, n_tokens=SEQ * 24, batch_size=4)
    module = LanguageModelModule(
        n_layers=2, d_model=32, n_heads=4, max_positions=32, vocab_top_k=256, warmup_steps=1, lr=3e-3
    )
    cbs = [
        SADCallback(every_n_steps=2, n_probe=WINDOWS, probe_path=probe, probe_seq_len=SEQ, log_spaced=False),
        MountsCallback(
            probe,
            every_n_steps=2,
            probe_windows=WINDOWS,
            probe_seq_len=SEQ,
            steer=True,
            figures=True,
            **MOUNT_KW,
            **STEER_KW,
        ),
        SpectrumCallback(every_n_steps=2, top_k=3, figures=True),
    ]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=cbs,
        limit_val_batches=0,
        logger=TensorBoardLogger(tmp_path, name="tb"),
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    return trainer, module, dm, cbs


def read_events(folder: Path) -> tuple[dict[str, dict[int, float]], set[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    return scalars, set(acc.Tags()["images"])


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, tokenizer, wikitext_valid):
    tmp = tmp_path_factory.mktemp("train_cb")
    probe = str(Path(wikitext_valid).with_name("test.txt"))
    trainer, module, dm, cbs = tiny_run(tmp, tokenizer, wikitext_valid, probe)
    calls = []  # (grad enabled, ids) of every forward of the model during fit

    def record(mod, args, kwargs):
        calls.append((torch.is_grad_enabled(), args[0].detach().clone()))

    module.configure_model = _with_embed_hook(module, record, calls)
    trainer.fit(module, datamodule=dm)
    module._hook_ctx.__exit__(None, None, None)
    return dict(trainer=trainer, module=module, dm=dm, cbs=cbs, calls=calls, probe=probe)


def _with_embed_hook(module, record, calls):
    """configure_model that builds the model, then hooks its token embedding for the rest of fit."""
    build = module.configure_model

    def configure():
        build()
        module._hook_ctx = hooks(Hook(module.lm.get_input_embeddings(), record, "pre"))
        module._hook_ctx.__enter__()

    return configure


def test_tensorboard_tags_name_site_layer_head_and_hold_the_history(fitted):
    trainer, (sad, mounts, spec) = fitted["trainer"], fitted["cbs"]
    assert [h["step"] for h in mounts.history] == [0, 2, 4] == [h["step"] for h in spec.history]
    scalars, images = read_events(Path(trainer.log_dir))
    for tag in (
        "mounts/o/layer0/lift_tiled",
        "mounts/down/layer1/lift_random",
        "mounts/o/layer1/coverage_lift/modes=4",
        "mounts/down/layer0/identity_rel_err",
        "mounts/pass_fraction",
        "spectrum/qk/layer0/head3/effective_rank",
        "spectrum/ov/layer1/head0/d1/sigma",
        "spectrum/ov/layer1/head0/d4/match_cos",
        "spectrum/qk/layer0/head2/directions_kept",
        "spectrum/mlp_in/layer1/top3_energy",
        "spectrum/mlp_out/mean_effective_rank",
        "mounts/o/layer1/null/pass",
        "mounts/down/layer0/steer_rho",
        "sad/L1H2/sparsity",
        "sad/L0H0/sparsity_rotated",
        "sad/L0H0/sparsity_null",
    ):
        assert tag in scalars, tag
    assert not [t for t in scalars if t.endswith("/s1") or "sigma0" in t]  # directions are d1.. (from 1)
    assert not [t for t in scalars if "inst" in t]  # named by meaning, not by index
    assert {"mounts/depth", "spectrum/values"} <= images
    # every logged value is the callback's own
    for h in mounts.history:
        row = next(r for r in h["rows"] if (r["site"], r["layer"]) == ("down", 1))
        assert scalars["mounts/down/layer1/lift_tiled"][h["step"]] == pytest.approx(row["lift_tiled"], rel=1e-6)
    for h in spec.history:
        row = next(r for r in h["rows"] if (r["matrix"], r["layer"], r["head"]) == ("qk", 0, 3))
        assert scalars["spectrum/qk/layer0/head3/effective_rank"][h["step"]] == pytest.approx(
            row["effective_rank"], rel=1e-6
        )
    # the weights moved, and so did what the callbacks see
    first, last = mounts.history[0]["rows"][0], mounts.history[-1]["rows"][0]
    assert first["lift_tiled"] != last["lift_tiled"]
    results = json.loads((Path(trainer.log_dir) / "results.json").read_text())
    assert results["experiment"] == "sad_training"
    assert [h["step"] for h in results["mounts_training"]["history"]] == [0, 2, 4]
    assert len(results["spectrum"]["history"]) == 3
    assert "sparsity_null" in sad.history[-1] and "sparsity_null" not in sad.history[0]  # default: null at the last
    for name in (
        "mounts_training.png",
        "mounts_depth.png",
        "spectrum_training.png",
        "spectrum_values.png",
        "spectrum_tracked.png",
    ):
        assert (Path(trainer.log_dir) / name).is_file()


def test_mount_rows_equal_the_test_run_on_the_same_batch(fitted, tmp_path, tokenizer):
    """The last measurement (step 4, final weights) against MountsAnalysisModule ``test`` on the same windows."""
    from lit_svd.modules.mounts import MountsAnalysisModule

    _trainer, module, mounts = fitted["trainer"], fitted["module"], fitted["cbs"][1]
    folder = tmp_path / "trained"
    module.lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    ids, mask = mounts.probe
    test_module = MountsAnalysisModule(model=str(folder), effective_paths=False, **STEER_KW, **MOUNT_KW)
    loader = torch.utils.data.DataLoader(
        [{"input_ids": i, "attention_mask": m} for i, m in zip(ids, mask)], batch_size=len(ids)
    )
    quiet_trainer().test(test_module, dataloaders=loader, verbose=False)
    got = mounts.history[-1]["rows"]
    assert len(got) == len(test_module.rows) == 4
    pairs = [(a, b) for a, b in zip(got, test_module.rows)] + [
        (a["null"], b["null"]) for a, b in zip(got, test_module.rows)
    ]
    assert all("steer_rho" in a for a, _ in pairs)  # C1's statistic on both the real mounts and their null
    for a, b in pairs:
        assert a["n_tokens"] == b["n_tokens"] == WINDOWS * SEQ and a["layer"] == b["layer"]
        assert a["checks"] == b["checks"]
        assert a["identity_rel_err"] < 1e-5 and b["identity_rel_err"] < 1e-5  # float32 rounding, not a difference
        for key, value in a.items():
            if key == "identity_rel_err":
                continue
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-8), (a["layer"], key)
            elif isinstance(value, list) and value and isinstance(value[0], float):
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-8), (a["layer"], key)


def test_nothing_is_computed_on_training_tokens(fitted, tokenizer):
    calls, module, mounts, sad = fitted["calls"], fitted["module"], fitted["cbs"][1], fitted["cbs"][0]
    probe = {tuple(w.tolist()) for w in mounts.probe[0]}
    assert probe == {tuple(w.tolist()) for w in module.map_ids(sad.probe[0])}  # SAD keeps tokenizer ids
    from lit_svd.datamodules.text import read_local_text, tokenize_texts

    full = tokenize_texts(tokenizer, read_local_text(fitted["probe"]))  # the whole file, as before the shortcut
    assert torch.equal(sad.probe[0].reshape(-1), full[: WINDOWS * SEQ])
    trained = {tuple(w.tolist()) for grad, ids in calls if grad for w in ids}
    scored = [ids for grad, ids in calls if not grad]
    assert trained and scored
    assert not probe & trained
    windows = [list(w) for w in probe]

    def in_probe(w: list[int]) -> bool:  # a probe window or a piece of one (steering: prefix, then last token)
        return any(p[j : j + len(w)] == w for p in windows for j in range(len(p) - len(w) + 1))

    for ids in scored:  # every forward the callbacks ran read probe windows only
        assert all(in_probe(w.tolist()) for w in ids)
    assert any(ids.shape[1] == SEQ for ids in scored) and any(ids.shape[1] == 1 for ids in scored)
    # the probe file being the training text fails in one line
    with pytest.raises(ValueError, match="probe_path=.*part of the training text"):
        held_out_probe(fitted["trainer"], module, fitted["dm"].path, 2, SEQ)


def test_spectra_match_dense_svds(fitted):
    module, spec = fitted["module"], fitted["cbs"][2]
    view = module.view
    rows = spec.history[-1]["rows"]
    assert [{k: v for k, v in r.items() if k != "tracked"} for r in rows] == spectrum_rows(view, [0, 1], 3)
    for r in rows:  # the tracked values are this step's singular values at the matched positions
        t = r["tracked"]
        assert t["sigma"] == [r["S"][p] for p in t["position"]] and len(t["sigma"]) == 4
    w = view.attn(1)
    with torch.no_grad():  # head 2's OV as one dense matrix, bias row first
        dense = (torch.cat([w.b_V[:, None], w.W_V], 1).double() @ w.W_O.double())[2]
    S = torch.linalg.svdvals(dense)[:8]
    row = next(r for r in rows if (r["matrix"], r["layer"], r["head"]) == ("ov", 1, 2))
    assert torch.tensor(row["S"], dtype=torch.float64) == pytest.approx(S, rel=1e-6, abs=1e-9)
    # effective rank and energy against their definitions, and their extremes
    p = S / S.sum()
    assert row["effective_rank"] == pytest.approx(torch.exp(-(p * p.log()).sum()).item(), rel=1e-9)
    assert row["top_k_energy"] == pytest.approx(((S[:3] ** 2).sum() / (S**2).sum()).item(), rel=1e-9)
    assert effective_rank(torch.tensor([3.0, 0.0, 0.0])).item() == pytest.approx(1.0)
    assert effective_rank(torch.ones(5)).item() == pytest.approx(5.0)
    assert top_k_energy(torch.tensor([2.0, 1.0, 1.0]), 1).item() == pytest.approx(4 / 6)


DDP_SCRIPT = ROOT / "tests" / "ddp_training_script.py"


def run_script(out: Path, devices: int, valid: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(DDP_SCRIPT), str(out), str(devices), valid],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "values.json").read_text())


@pytest.mark.slow
def test_ddp_two_processes_give_one_process_values(tmp_path, wikitext_valid):
    two = run_script(tmp_path / "two", 2, wikitext_valid)
    one = run_script(tmp_path / "one", 1, wikitext_valid)
    # step 0 (same seeded weights): the DDP run's callback values equal one process's
    for key in ("mounts", "spectrum", "sad"):
        assert two[key][0]["step"] == one[key][0]["step"] == 0
        assert two[key][0]["values"] == pytest.approx(one[key][0]["values"], rel=1e-6, abs=1e-9, nan_ok=True), key
    # last step (weights trained on two shards): the DDP values equal one process scoring the same weights
    assert two["mounts"][-1]["values"] == pytest.approx(two["recomputed"]["mounts"], rel=1e-6, abs=1e-9)
    assert two["spectrum"][-1]["values"] == pytest.approx(two["recomputed"]["spectrum"], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # Qwen2: the q / k / v biases train with their maps
def test_finetune_trains_only_the_chosen_maps_on_the_answer(tiny_dirs, arch):
    """Only layer 1's attention maps move; the loss is the cross-entropy of the answer token alone."""
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import answer_logits
    from lit_svd.modules.language_model import FineTuneLMModule

    module = FineTuneLMModule(model=tiny_dirs[arch], trainable="attention", layers=[1], lr=1e-2, warmup_steps=0)
    before = {n: p.detach().clone() for n, p in module.lm.named_parameters()}
    view = module.view
    expected = {id(p) for s in ("q", "k", "v", "o") for p in view.site_module(1, s).parameters()}
    assert {id(p) for p in module.lm.parameters() if p.requires_grad} == expected
    dm = TaskDataModule("ioi", tiny_dirs[arch], n_train=16, n_val=8, n_test=8, batch_size=8)
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        logits = answer_logits(
            module.lm(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"]).logits, batch["answer_pos"]
        )
        loss, diff = module.loss_and_diff(batch)
    assert loss.item() == pytest.approx(torch.nn.functional.cross_entropy(logits, batch["correct_id"]).item(), rel=1e-5)
    assert diff.item() == pytest.approx(
        (logits.gather(1, batch["correct_id"][:, None]) - logits.gather(1, batch["wrong_id"][:, None])).mean().item(),
        rel=1e-5,
    )
    pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(module, datamodule=dm)
    moved = {n for n, p in module.lm.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved == {n for n, p in module.lm.named_parameters() if id(p) in expected}
    with pytest.raises(ValueError, match="model.trainable='heads'"):
        FineTuneLMModule(model=tiny_dirs[arch], trainable="heads")


@pytest.mark.parametrize("name", ["tiny_lm_mechanisms", "smollm2_finetune_ioi"])
def test_training_configs_parse(name, capsys):
    """Both training configs parse against the classes' signatures (nothing is loaded)."""
    from lit_svd.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(ROOT / "configs" / "training" / f"{name}.yaml"), "--print_config"])
    assert stop.value.code in (0, None)
    out = capsys.readouterr().out
    assert "MountsCallback" in out and "SpectrumCallback" in out and "probe_path" in out
