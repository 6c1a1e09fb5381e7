"""Set-ups shared by several test files (the shared fixtures are in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
