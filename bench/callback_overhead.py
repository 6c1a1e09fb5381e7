"""Overhead of the three during-training callbacks (SAD, mounts, spectrum) at their default settings on the
tiny-LM run of configs/training/tiny_lm_mechanisms.yaml, measured in one run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/callback_overhead.py [--steps 600]

One ``fit`` of the config's model, data and trainer (600 steps, validation every 200 on 4 batches) with the
three callbacks at their defaults (every 250 steps and at the start and the end of fit; SAD on 8 probe
windows with its matched null, 16 draws on 2 windows, at the last measurement; no per-step images; spectra
with 4 tracked directions per matrix); every callback hook is timed, figures and result files included.
Prints the wall time of the fit, the time inside the callbacks (per callback), and the overhead
ratio = callback time / (fit time - callback time), the fraction the callbacks add to the run without them.
Timing both within one fit keeps the two sides under the same machine load.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning.pytorch as pl  # noqa: E402
from conditions import report_conditions  # noqa: E402  (bench/conditions.py)

from lit_svd.callbacks.mounts_training import MountsCallback  # noqa: E402
from lit_svd.callbacks.sad import SADCallback  # noqa: E402
from lit_svd.callbacks.spectrum import SpectrumCallback  # noqa: E402
from lit_svd.datamodules.text import TextDataModule  # noqa: E402
from lit_svd.modules.language_model import LanguageModelModule  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
HOOKS = ("setup", "on_train_start", "on_train_batch_start", "on_train_batch_end", "on_train_end")


def timed(callback, spent: dict[str, float], name: str, at_end: dict[str, float]):
    """Wrap every training hook of ``callback`` so that the time inside it adds to ``spent[name]`` (and, for
    ``on_train_end``, the last measurement, the final figures and the results file, to ``at_end[name]``)."""
    for hook in HOOKS:
        fn = getattr(callback, hook)

        def wrapper(*args, _fn=fn, _hook=hook, **kwargs):
            start = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
                if _hook == "on_train_end":
                    at_end[name] += time.perf_counter() - start

        setattr(callback, hook, wrapper)
    return callback


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    report_conditions()
    probe = str(Path(args.data) / "test.txt")
    spent = {"sad": 0.0, "mounts": 0.0, "spectrum": 0.0}
    at_end = dict(spent)
    callbacks = [
        timed(SADCallback(probe_path=probe), spent, "sad", at_end),
        timed(MountsCallback(probe), spent, "mounts", at_end),
        timed(SpectrumCallback(), spent, "spectrum", at_end),
    ]
    dm = TextDataModule(
        "smollm2-135m",
        path=str(Path(args.data) / "valid.txt"),
        seq_len=64,
        n_tokens=262144,
        val_tokens=2048,
        batch_size=8,
        seed=0,
    )
    pl.seed_everything(0)
    module = LanguageModelModule(
        arch="gpt2", n_layers=2, d_model=128, n_heads=4, max_positions=64, lr=2e-3, warmup_steps=50, seed=0
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=args.steps,
            val_check_interval=200,
            limit_val_batches=4,
            log_every_n_steps=10,
            default_root_dir=tmp,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=False,
            callbacks=callbacks,
        )
        start = time.perf_counter()
        trainer.fit(module, datamodule=dm)
        wall = time.perf_counter() - start
    inside = sum(spent.values())
    print(
        f"fit of {args.steps} steps: {wall:.1f} s wall; inside the callbacks {inside:.1f} s ("
        + ", ".join(f"{k} {v:.1f} s" for k, v in spent.items())
        + ")"
    )
    rest = wall - inside
    print(
        "of which at the end of fit (last measurement, final figures, results): "
        + ", ".join(f"{k} {v:.1f} s" for k, v in at_end.items())
    )
    print(
        f"overhead ratio (callbacks / rest of the fit): {inside / rest:.3f}  [target <= 0.10]; per callback: "
        + ", ".join(f"{k} {v / rest:.3f}" for k, v in spent.items())
    )


if __name__ == "__main__":
    main()
