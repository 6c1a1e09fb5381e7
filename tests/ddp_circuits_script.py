"""Run by tests/test_circuits_module.py in a subprocess: ``CircuitGraphModule`` under a 2-process CPU DDP
``trainer.test``; rank 0 writes the module's ``graph_rows()`` (edges, nodes, checks, facts) as JSON.

Usage: python tests/ddp_circuits_script.py OUT_JSON MODEL_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lit_svd.cli import end_process_group  # noqa: E402
from lit_svd.datamodules.tasks import TaskDataModule  # noqa: E402
from lit_svd.modules.circuits import CircuitGraphModule  # noqa: E402
from tests.helpers import exact_rms_norms, quiet_trainer  # noqa: E402
from tests.test_circuits_module import DATA, OPTIONS  # noqa: E402


def main(out: str, model_dir: str) -> None:
    module = CircuitGraphModule(model=model_dir, **OPTIONS)
    dm = TaskDataModule(tokenizer=model_dir, **DATA)
    trainer = quiet_trainer(2, Path(out).parent / "runs")
    with exact_rms_norms(module.lm):  # float64 end to end: the ranks batch other prompts together than one process
        trainer.test(module, datamodule=dm)
    if trainer.is_global_zero:
        rows = module.graph_rows()
        rows.pop("timing")
        Path(out).write_text(json.dumps(rows))


if __name__ == "__main__":
    try:
        main(*sys.argv[1:3])
    finally:
        end_process_group()  # before exit: a live gloo group can abort a finished run
