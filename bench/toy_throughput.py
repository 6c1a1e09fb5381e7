"""Toy model throughput, both sides measured in one run (not a test).

1. steps/s of a Lightning fit against a minimal plain-PyTorch loop over the same model, data stream and
   batch size (target: Lightning >= 0.8x the plain loop);
2. time per step of a 32-instance ensemble against a single instance (target: <= 2x).

Each measurement is repeated and the median is reported; the sides alternate so that load from other
processes on a shared machine hits both alike.
    python bench/toy_throughput.py [--steps 300] [--repeats 3] [--threads 1] [--batch 256] [--skip-ensemble]
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning.pytorch as pl
import torch
from conditions import report_conditions  # bench/conditions.py

from lit_svd.datamodules.toy import SparseFeatureDataModule
from lit_svd.modules.toy import ToyAlignmentModule

SINGLE_PAIR = dict(n_features=20, d_model=10, d_head=10, template={"pair": [0, 1, 1.0]}, lr=3e-3)
DATA = dict(n_features=20, n_keys=8, p=0.1, batch_size=256)
WARMUP = 20


class StepTimer(pl.Callback):
    """Wall time from the end of warm-up step WARMUP to the end of training."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == WARMUP:
            self.t0 = time.perf_counter()

    def on_train_end(self, trainer, module):
        self.seconds = time.perf_counter() - self.t0


def lightning_steps_per_s(n_instances: int, steps: int) -> float:
    timer = StepTimer()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps + WARMUP,
        logger=False,
        callbacks=[timer],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        ToyAlignmentModule(n_instances=n_instances, **SINGLE_PAIR),
        SparseFeatureDataModule(n_instances=n_instances, **DATA),
    )
    return steps / timer.seconds


def plain_steps_per_s(n_instances: int, steps: int) -> float:
    module = ToyAlignmentModule(n_instances=n_instances, **SINGLE_PAIR)
    opt = module.configure_optimizers()
    stream = iter(SparseFeatureDataModule(n_instances=n_instances, **DATA).train_dataloader())
    for step in range(steps + WARMUP):
        if step == WARMUP:
            t0 = time.perf_counter()
        recon, attn = module.losses(next(stream))
        loss = (recon + module.lambda_attn * attn).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return steps / (time.perf_counter() - t0)


def median_of(fn, repeats: int, *args) -> float:
    return statistics.median(fn(*args) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=DATA["batch_size"], help="samples per instance per step")
    ap.add_argument("--skip-ensemble", action="store_true", help="only Lightning against the plain loop")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    report_conditions()
    DATA["batch_size"] = args.batch
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    lit, plain, ens, one = [], [], [], []
    for _ in range(args.repeats):  # alternate the sides
        lit.append(lightning_steps_per_s(1, args.steps))
        plain.append(plain_steps_per_s(1, args.steps))
        if not args.skip_ensemble:
            ens.append(plain_steps_per_s(32, args.steps))
            one.append(plain_steps_per_s(1, args.steps))
    lit_s, plain_s = statistics.median(lit), statistics.median(plain)
    print(
        f"threads={args.threads} steps={args.steps} repeats={args.repeats} batch={DATA['batch_size']} "
        f"N={SINGLE_PAIR['n_features']} D={SINGLE_PAIR['d_model']} H={SINGLE_PAIR['d_head']}"
    )
    print(f"Lightning fit      : {lit_s:8.1f} steps/s")
    print(f"plain PyTorch loop : {plain_s:8.1f} steps/s")
    print(f"ratio Lightning / plain = {lit_s / plain_s:.2f}x  (target >= 0.8x)")
    if args.skip_ensemble:
        return
    ens_s, one_s = statistics.median(ens), statistics.median(one)
    print(f"1 instance         : {1e3 / one_s:8.2f} ms/step")
    print(f"32-instance ensemble: {1e3 / ens_s:8.2f} ms/step")
    print(f"ratio 32 / 1 time per step = {one_s / ens_s:.2f}x  (target <= 2x; 32 separate runs would be 32x)")


if __name__ == "__main__":
    main()
