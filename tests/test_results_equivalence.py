"""bench/results_equivalence.py as a test: one reduced run of each method reproduces every key of the stored
reference (bench/results_equivalence_reference.json), so a refactor that changes a result fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_reference_key_is_reproduced(wikitext_valid):  # the text runs read WikiText (else skipped)
    env = {**os.environ, "LIT_SVD_SHARED": str(Path(wikitext_valid).parents[2])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "results_equivalence.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = [line for line in done.stdout.splitlines() if line.startswith(("[equivalence]", "    "))]
    assert done.returncode == 0, "\n".join(report[-60:]) + done.stderr[-2000:]
    assert sum("SAME" in line for line in report) == 5, report
