"""DDP on CPU: two ranks draw different samples, train the same weights, and one results.json is written.

The fit runs in a subprocess (a small script, so Lightning's DDP launcher re-runs it per rank and pytest
itself is never forked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    import lightning.pytorch as pl
    from lit_svd.callbacks import SVDAlignmentCallback
    from lit_svd.cli import end_process_group
    from lit_svd.datamodules import SparseFeatureDataModule
    from lit_svd.modules import ToyAlignmentModule

    class RecordBatches(pl.Callback):
        """Gathers every rank's batch sums and, at the end, every rank's parameters."""
        def __init__(self):
            self.sums = []
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.sums.append(trainer.strategy.all_gather(batch.sum().reshape(1)).flatten().tolist())
        def on_train_end(self, trainer, module):
            w = trainer.strategy.all_gather(module.W_Q.detach().sum().reshape(1)).flatten().tolist()
            if trainer.is_global_zero:
                out = {"world_size": trainer.world_size, "batch_sums": self.sums, "w_q_sums": w}
                open(sys.argv[2], "w").write(json.dumps(out))

    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=4, default_root_dir=sys.argv[1],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[SVDAlignmentCallback(every_n_steps=2), RecordBatches()])
    try:
        trainer.fit(ToyAlignmentModule(n_instances=2), SparseFeatureDataModule(n_instances=2, batch_size=32, seed=5))
    finally:
        end_process_group()  # before exit: a live gloo group can abort a finished run
''')


@pytest.mark.slow
def test_ddp_ranks_draw_different_samples_and_write_one_results_file(tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(SCRIPT)
    record = tmp_path / "record.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), str(record)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(record.read_text())
    assert rec["world_size"] == 2 and len(rec["batch_sums"]) == 4
    for rank0, rank1 in rec["batch_sums"]:
        assert rank0 != rank1  # each rank drew its own samples
    a, b = rec["w_q_sums"]
    assert a == pytest.approx(b, rel=1e-6)  # ... and DDP kept one model
    results = list((tmp_path / "run").rglob("results.json"))
    assert len(results) == 1
    res = json.loads(results[0].read_text())
    assert res["global_step"] == 4 and len(res["instances"]) == 2
    assert [h["step"] for h in res["history"]] == [0, 2, 4]
