"""Set-ups shared by several test files (the shared fixtures are in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run_lit_svd(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m lit_svd ARGS`` in a subprocess (offline, this checkout first on the path, one thread unless
    OMP_NUM_THREADS says otherwise); a failed run fails the test with the tail of its stderr."""
    Path(cwd).mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "lit_svd", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def only_results(folder: Path) -> tuple[dict, Path]:
    """The one results.json written under ``folder`` and the run folder holding it."""
    found = sorted(Path(folder).rglob("results.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text()), found[0].parent


@contextmanager
def exact_rms_norms(model):
    """Within the block every RMSNorm of ``model`` computes in its input's dtype. HF's RMSNorms upcast to
    float32 and back whatever the model's dtype, so a float64 model is only float32-exact at its norms; with
    this it runs in float64 end to end (but for the eager softmax, whose weights the tests read back as they
    are). Same maths as HF's: ``w * x / rms(x)``, Gemma ``(1 + w) * x / rms(x)``."""
    patched = []
    for mod in model.modules():
        name = type(mod).__name__
        if not name.endswith("RMSNorm"):
            continue
        eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
        gemma = name.startswith("Gemma")

        def forward(x, mod=mod, eps=eps, gemma=gemma):
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            return y * (1.0 + mod.weight) if gemma else mod.weight * y

        mod.forward = forward
        patched.append(mod)
    try:
        yield model
    finally:
        for mod in patched:
            del mod.forward


def quiet_trainer(devices: int = 1, folder: str | Path | None = None, **options):
    """A CPU Trainer without logger, checkpoints, progress bar or model summary; ``devices`` > 1: DDP over gloo (the
    DDP scripts); ``folder``: its default_root_dir (where a report callback writes); ``options``: other Trainer
    arguments (callbacks, max_steps, ...)."""
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        logger=False,
        default_root_dir=None if folder is None else str(folder),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


def run_test(module, batches: list, folder: str | Path | None = None, callbacks: list | None = None):
    """``trainer.test`` of ``module`` over ``batches`` (one batch each) in this process, quietly (``quiet_trainer``);
    ``folder``: the run's default_root_dir. Returns ``module``."""
    trainer = quiet_trainer(folder=folder, callbacks=callbacks)
    trainer.test(module, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)
    return module


def built_cli(*args: str):
    """The LightningCLI of ``python -m lit_svd ARGS`` (``--config ...`` and overrides) built in this process, not run:
    its ``model``, ``datamodule`` and ``trainer``."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from lit_svd.cli_lightning import LitSVDCLI

    subclasses = dict(subclass_mode_model=True, subclass_mode_data=True)
    return LitSVDCLI(LightningModule, LightningDataModule, **subclasses, run=False, args=list(args))


@contextmanager
def exact_softmax():
    """Within the block a softmax asked to compute a float64 input in float32 (HF's eager attention upcasts its
    scores so) computes in float64: finite differences through attention patterns then resolve below float32's
    rounding."""
    real = torch.nn.functional.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        if x.dtype == torch.float64 and dtype == torch.float32:
            dtype = torch.float64
        return real(x, dim=dim, dtype=dtype)

    torch.nn.functional.softmax = softmax
    try:
        yield
    finally:
        torch.nn.functional.softmax = real


def fit_masks(model_dir, tokenizer, tmp_path, **kwargs):
    """A 4-step direction-mask run on 8 IOI prompts (lr 0.5, alpha 1e-2, init 0.6, threshold 0.3 unless ``kwargs``
    say otherwise) with the report callback: ``(module, log folder)``."""
    import lightning.pytorch as pl

    from lit_svd.callbacks import DirectionMaskReport
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    module = DirectionMaskModule(model=model_dir, **{"lr": 0.5, "alpha": 1e-2, "init": 0.6, "threshold": 0.3, **kwargs})
    dm = TaskDataModule("ioi", tokenizer, n_train=8, n_val=8, n_test=0, batch_size=8)
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(tmp_path),
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[DirectionMaskReport(steer_component="L1.ov", steer_head=0, steer_direction=0)],
    )
    trainer.fit(module, dm)
    return module, Path(trainer.log_dir)
