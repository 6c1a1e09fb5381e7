"""cli_tools errors in the CLI's form: exit code 2, two stderr lines (the message naming the option or the
path, then a hint), no traceback; ``--debug`` gives the traceback instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_svd.cli_tools import main

ROOT = Path(__file__).resolve().parents[1]


def two_lines(capsys, *argv: str) -> list[str]:
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and err[1].startswith("hint"), err
    return err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["mask-thresholds", "RUN", "--out", "x", "--thresholds", "1.5"], "--thresholds [1.5]: every threshold"),
        (["mask-blocks", "nowhere", "--out", "x"], "nowhere: not a folder; give the folder of a finished direction"),
        (["mask-curve", "nowhere"], "nowhere: no results.json"),
        (["compare-directions", "a", "b", "--out", "x", "--top", "0"], "--top 0: must be a positive integer"),
        (["evaluate", "--n-test", "0"], "--n-test 0: give at least one test prompt"),
        (["evaluate", "--task", "ioii"], "argument --task: invalid choice: 'ioii'"),
        (["mask-curve"], "the following arguments are required: runs"),
        (["mask-thresholds", "RUN", "--thresholds", "x"], "argument --thresholds: invalid float value: 'x'"),
        (["no-such-tool"], "invalid choice: 'no-such-tool'"),
    ],
)
def test_tool_errors_end_in_two_lines(capsys, tmp_path, argv, message):
    argv = [str(tmp_path / a) if a in ("RUN", "nowhere") else a for a in argv]
    if "RUN" in str(argv) or any(a.endswith("RUN") for a in argv):
        (tmp_path / "RUN").mkdir(exist_ok=True)
    err = two_lines(capsys, *argv)
    assert message in err[0]


def test_a_mask_run_without_masks_names_the_file(capsys, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("model: {}\n")
    err = two_lines(capsys, "mask-thresholds", str(tmp_path / "run"), "--out", str(tmp_path / "o"))
    assert (
        err[0]
        == f"error: {tmp_path / 'run' / 'masks.pt'}: no masks.pt; give the folder of a finished direction-mask run"
    )


def test_the_command_line_and_debug(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "lit_svd", "mask-blocks", str(tmp_path / "nowhere"), "--out", "x"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 2 and "Traceback" not in done.stderr
    debug = subprocess.run([*args, "--debug"], env=env, capture_output=True, text=True, timeout=120)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "not a folder" in debug.stderr
