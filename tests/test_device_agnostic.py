"""GPU readiness, checked where no GPU is: the per-batch hot paths of every method create no tensor on an
implicit device, every config takes ``--trainer.accelerator gpu --trainer.devices N``, and (marked ``cuda``,
skipped without CUDA) the methods give on a GPU what they give on the CPU.

A factory call (``torch.zeros``, ``torch.arange``, ``torch.tensor``, ...) without ``device=`` makes a CPU
tensor, which on a GPU run either fails against the activations or silently moves data back and forth. The
watcher records every such call made from lit_svd code while a hot path runs. Seeded draws with an explicit
``generator=`` are exempt: they are made on the CPU on purpose (the same numbers on every device) and moved.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.overrides import TorchFunctionMode

import lit_svd

PACKAGE = os.path.dirname(os.path.abspath(lit_svd.__file__))
ROOT = Path(PACKAGE).parent
FACTORIES = {
    "zeros",
    "ones",
    "full",
    "empty",
    "eye",
    "arange",
    "linspace",
    "tensor",
    "randn",
    "rand",
    "randint",
    "randperm",
}


class ImplicitDevices(TorchFunctionMode):
    """Records ``file:line`` of every factory call from lit_svd code that names no device (nor a generator)."""

    def __init__(self):
        super().__init__()
        self.found: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in FACTORIES and "device" not in kwargs and "generator" not in kwargs:
            frame = inspect.currentframe().f_back
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(PACKAGE):
                self.found.add(f"{os.path.relpath(frame.f_code.co_filename, ROOT)}:{frame.f_lineno}")
        return func(*args, **kwargs)


def watch(monkeypatch, cls, name: str, watcher: ImplicitDevices) -> None:
    """Run ``cls.name`` (a hot path) under ``watcher``."""
    original = getattr(cls, name)

    def watched(self, *args, **kwargs):
        with watcher:
            return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, watched)


def test_the_watcher_catches_an_implicit_cpu_tensor():
    """The check can fail: bare factory calls in lit_svd code are reported (here the data module's collate,
    CPU by design: Lightning moves its batches), seeded draws and calls with a device are not."""
    from lit_svd.analysis import mounts as M
    from lit_svd.datamodules.text import collate_windows

    w = ImplicitDevices()
    with w:
        M.random_units(4, 2, seed=0)  # seeded: exempt
        M.column_sample_mounts(torch.randn(4, 6), 2)  # every tensor on W's device
    assert not w.found
    with w:
        collate_windows([(0, torch.arange(3))], pad_id=0, seq_len=4)
    assert {f.rsplit(":", 1)[0] for f in w.found} == {"lit_svd/datamodules/text.py"} and len(w.found) == 3


def test_mounts_scoring_and_steering_name_their_devices(tiny_dirs, monkeypatch):
    from lit_svd.modules import mounts as mod

    w = ImplicitDevices()
    watch(monkeypatch, mod.MountsAnalysisModule, "_score_batch", w)
    watch(monkeypatch, mod.MountsAnalysisModule, "_steer", w)
    tiles = {"q": 32, "k": 16, "v": 16, "o": 32, "gate": 32, "up": 32, "down": 64}
    module = mod.MountsAnalysisModule(
        model=tiny_dirs["llama"], tile_widths=tiles, modes_sweep=[1, 2], steer_texts=2, steer_mounts=2, null_stride=2
    )
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(0, 2000, (2, 12), generator=g)} for _ in range(3)]
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    trainer.test(module, dataloaders=torch.utils.data.DataLoader(data, batch_size=None), verbose=False)
    assert module.rows and not w.found, sorted(w.found)


def test_sad_decomposition_names_its_devices(tiny_dirs, tokenizer, monkeypatch):
    from lit_svd.modules.sad import SADAnalysisModule

    w = ImplicitDevices()
    watch(monkeypatch, SADAnalysisModule, "analyse_batch", w)
    module = SADAnalysisModule(model=tiny_dirs["gemma3"], null_draws=2, null_stride=2, min_pairs=1)
    module.on_test_start()  # the bases: built once, outside the hot path
    enc = tokenizer(["When Mary and John went to the store, John gave", "Then Anna and Tom went"], padding=True)
    with torch.no_grad():
        module.analyse_batch(torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"]))  # no index
        module.analyse_batch(torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"]), torch.tensor([0, 1]))
    assert module.results()["n_prompts"] == 4 and not w.found, sorted(w.found)


def test_mask_training_and_evaluation_name_their_devices(tiny_dirs, tokenizer, tmp_path, monkeypatch):
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    w = ImplicitDevices()
    for name in ("training_step", "test_step"):
        watch(monkeypatch, DirectionMaskModule, name, w)
    module = DirectionMaskModule(
        model=tiny_dirs["llama"], ablation="patch", straight_through=True, soft_steps=1, steps_per_batch=2
    )
    dm = TaskDataModule("ioi", tokenizer, n_train=4, n_val=0, n_test=4, batch_size=4)
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, dm)
    trainer.test(module, dm, verbose=False)
    assert not w.found, sorted(w.found)


def test_direction_check_names_its_devices(tiny_dirs, tmp_path, monkeypatch):
    from test_direction_report import _mask_run, _test

    from lit_svd.modules.direction_check import DirectionCheckModule

    w = ImplicitDevices()
    watch(monkeypatch, DirectionCheckModule, "test_step", w)
    run = _mask_run(tmp_path / "run", tiny_dirs["llama"], {"L0.ov": [(0, 0), (2, 1)], "L1.ov": [(3, 0)]})
    res = _test("smollm2_ioi_directions.yaml", run, tiny_dirs["llama"], tmp_path / "out")
    assert len(res["directions"]) == 3 and not w.found, sorted(w.found)


def test_toy_training_names_its_devices(monkeypatch):
    from lit_svd.datamodules.toy import sample_sparse_features
    from lit_svd.modules.toy import ToyAlignmentModule

    w = ImplicitDevices()
    mod = ToyAlignmentModule(n_features=6, d_model=4, d_head=[3, 2], n_instances=2)
    feats = sample_sparse_features(torch.Generator().manual_seed(0), 5, 2, 6, torch.tensor([0.5, 0.8]))
    with w:
        mod.losses(feats)
    assert not w.found, sorted(w.found)


# --- configs on a GPU ------------------------------------------------------------------------------------
CONFIGS = sorted((ROOT / "configs").glob("*/*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_config_parses_with_gpu_devices(config, tiny_dirs):
    """``--trainer.accelerator gpu --trainer.devices 2`` parses on every config (nothing pins the CPU in a way
    that the command line cannot override); building the Trainer needs the GPU and is the GPU check's job.
    Hub-only models are swapped for a local tiny one (the CLI checks names before parsing further)."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from lit_svd.cli_lightning import LitSVDCLI

    class ParseOnly(LitSVDCLI):
        def instantiate_classes(self) -> None:  # no model, data or trainer: parsing is what is checked
            pass

    text = config.read_text()
    local = []
    if re.search(r"^\s+model: ", text, re.M):
        local += ["--model.init_args.model", tiny_dirs["llama"]]
    if re.search(r"^\s+tokenizer: ", text, re.M):
        local += ["--data.init_args.tokenizer", tiny_dirs["llama"]]
    cli = ParseOnly(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        args=["--config", str(config), "--trainer.accelerator", "gpu", "--trainer.devices", "2"] + local,
    )
    trainer = cli.config["trainer"]
    assert trainer["accelerator"] == "gpu" and int(trainer["devices"]) == 2
    assert not re.search(r"^\s*(device|map_location)\s*:\s*cpu", text, re.M), "a model option pins the CPU"


# --- on a real GPU (skipped here) ------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mounts_on_cuda_equal_the_cpu(tiny_dirs):
    from lit_svd.modules.mounts import MountsAnalysisModule

    tiles = {"q": 32, "k": 16, "v": 16, "o": 32, "gate": 32, "up": 32, "down": 64}
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(0, 2000, (2, 12), generator=g)} for _ in range(3)]
    rows = {}
    for accelerator in ("cpu", "gpu"):
        module = MountsAnalysisModule(model=tiny_dirs["llama"], tile_widths=tiles, modes_sweep=[1, 2], steer_texts=2)
        trainer = pl.Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False)
        trainer.test(module, dataloaders=torch.utils.data.DataLoader(data, batch_size=None), verbose=False)
        rows[accelerator] = json.loads(json.dumps(module.rows))
    for a, b in zip(rows["cpu"], rows["gpu"]):
        assert a["checks"] == b["checks"]
        assert b["lift_tiled"] == pytest.approx(a["lift_tiled"], abs=1e-4)
        assert b["span_ceiling"] == pytest.approx(a["span_ceiling"], abs=1e-4)


def test_a_mount_plan_moves_whole_and_keeps_its_atoms_views_of_proj():
    """``SitePlan.to``: every tensor on the new device (``meta`` stands in for a GPU), the coverage atoms still
    slices of the one projection matrix (no second copy), nothing else changed."""
    import dataclasses

    from lit_svd.analysis import mounts as M

    W = torch.randn(24, 40, generator=torch.Generator().manual_seed(0))
    plan = M.plan_site(W, 8, 2, [1, 2], k_active=3, linear=True, bias=torch.ones(24))
    moved = plan.to("meta")

    def tensors(obj):
        if isinstance(obj, torch.Tensor):
            yield obj
        elif dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                yield from tensors(getattr(obj, f.name))
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from tensors(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from tensors(v)

    before, after = list(tensors(plan)), list(tensors(moved))
    assert len(before) == len(after) > 20 and all(t.device.type == "meta" for t in after)
    assert [(t.shape, t.dtype) for t in before] == [(t.shape, t.dtype) for t in after]
    for _, tiled, rand in moved.coverage:
        assert tiled.D._base is moved.proj and rand.D._base is moved.proj
    assert moved.blocks == plan.blocks and moved.tiles == plan.tiles and plan.to("cpu").proj is plan.proj
