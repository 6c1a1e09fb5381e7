"""The type check (pyproject's [tool.mypy] on linalg, models and analysis, run by `make lint`) passes, and it can
fail: the same check on a copy of the package with a deliberate type error in analysis/ exits non-zero and names it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MYPY = Path(sys.executable).with_name("mypy")

# Two errors the checker is there for: an option outside its Literal, and a None that can reach a Tensor return.
BROKEN = """

def _broken_read(view: ModelView, x: Tensor) -> Tensor:
    return view.normalized("pre", 0, x)


def _broken_factor(view: ModelView, x: Tensor) -> Tensor:
    return view.post_norm_factor("attn", 0, x)
"""


def mypy(root: Path) -> subprocess.CompletedProcess:
    """The project's mypy on ``root`` (a copy of the repository), its cache kept in the copy."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(MYPY), "--cache-dir", str(root / ".mypy_cache")], cwd=root, env=env, capture_output=True, text=True
    )


def test_the_checked_packages_type_check_and_a_type_error_fails(tmp_path):
    shutil.copytree(ROOT / "lit_svd", tmp_path / "lit_svd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    if (ROOT / ".mypy_cache").is_dir():  # `make lint` ran first: reuse what it learned of torch and transformers
        shutil.copytree(ROOT / ".mypy_cache", tmp_path / ".mypy_cache")
    done = mypy(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Success: no issues found" in done.stdout

    decompose = tmp_path / "lit_svd" / "analysis" / "decompose.py"
    source = decompose.read_text()
    decompose.write_text(source + BROKEN)
    first = source.count("\n") + 4  # the line of the first broken return
    done = mypy(tmp_path)
    assert done.returncode == 1, done.stdout
    errors = [ln for ln in done.stdout.splitlines() if ": error:" in ln]
    assert len(errors) == 2, done.stdout
    assert errors[0].startswith(f'lit_svd/analysis/decompose.py:{first}: error: Argument 1 to "normalized"')
    assert errors[0].endswith("[arg-type]") and "Literal['attn', 'mlp', 'final']" in errors[0]
    assert errors[1].startswith(f"lit_svd/analysis/decompose.py:{first + 4}: error: Incompatible return value type")
    assert errors[1].endswith("[return-value]") and '"Tensor | None"' in errors[1]
