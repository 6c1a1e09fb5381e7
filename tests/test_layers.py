"""The layer contract (pyproject's [tool.importlinter], run by `make lint`) holds, and it can fail: the same
check on a copy of the package where a bottom-layer module imports a reporter reports the contract broken."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True)


def test_the_package_keeps_its_layers():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_an_import_against_the_layers_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "lit_svd", tmp_path / "lit_svd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    linalg = tmp_path / "lit_svd" / "linalg.py"
    linalg.write_text(linalg.read_text() + "\nfrom lit_svd.callbacks import masks  # noqa: E402,F401\n")
    done = lint(tmp_path)
    assert done.returncode == 1
    assert "BROKEN" in done.stdout and "lit_svd.linalg -> lit_svd.callbacks.masks" in done.stdout
