"""One way in: ``lit-svd`` is ``python -m lit_svd`` (the same ``main``); ``--help`` answers at once (no torch) and
lists the LightningCLI's subcommands, the report and the tools; a bad input of each kind (model, task, option, step,
path) fails in two lines before torch or Lightning is imported, through the LightningCLI's door and the report's.

Wall time is bounded generously (shared machines); the import check is what fails a slow path on any machine: a
child that imported torch, Lightning, torchmetrics or transformers names them on stderr (``LIGHT``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_cli_errors import LIGHT as CLI_LIGHT

from lit_svd.registry import TOOLS
from tests.helpers import ROOT

# the fast-error check of tests/test_cli_errors.py, run through the one main
LIGHT = CLI_LIGHT.replace("from lit_svd.cli import main", "from lit_svd.__main__ import main")
WALL_S = 8.0  # generous: under 2 s on a quiet machine (docs/api.md, "Errors"), this leaves room for a busy one


def lit_svd(*args: str, cwd=ROOT) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("LIT_SVD_DEBUG", None)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", LIGHT, *args], cwd=cwd, env=env, capture_output=True, text=True)
    return proc, time.perf_counter() - start


def test_the_script_and_the_module_are_one_main():
    text = (ROOT / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]")[1].split("\n[")[0]
    assert [ln.split("#")[0].strip() for ln in scripts.strip().splitlines()] == ['lit-svd = "lit_svd.__main__:main"']


def test_help_is_fast_and_lists_every_door():
    proc, wall = lit_svd("--help")
    assert proc.returncode == 0 and "HEAVY IMPORTS" not in proc.stderr and wall < WALL_S, (proc.stderr, wall)
    for door in ("fit", "validate", "test", "predict", "report", *TOOLS):
        assert f"\n  {door} " in proc.stdout, door
    for method in ("sad", "masks", "directions", "mounts", "circuits", "faithfulness"):
        assert f"\n  {method} " in proc.stdout, method


@pytest.mark.parametrize(
    "kind, args, first",
    [
        (
            "model",
            ["test", "--config", "configs/sad/smollm2_ioi.yaml", "--model.init_args.model", "no-such-model"],
            "error: model='no-such-model': not an offline alias",
        ),
        ("model", ["report", "no-such-model", "--out", "{tmp}/r"], "error: model='no-such-model': not an offline"),
        ("model", ["report", "tiny-nope", "--out", "{tmp}/r"], "error: model='tiny-nope': no such tiny model"),
        (
            "task",
            ["test", "--config", "configs/sad/smollm2_ioi.yaml", "--data.init_args.task", "ioj"],
            "error: data.init_args.task: must be one of 'ioi'",
        ),
        (
            "option",
            ["test", "--config", "configs/circuits/smollm2_ioi.yaml", "--model.init_args.depth", "99"],
            "error: depth=99: must be an integer in 1 .. 30 (the model's layers)",
        ),
        (
            "option",
            ["test", "--config", "configs/sad/smollm2_ioi.yaml", "--model.init_args.layers", "[30]"],
            "error: model.layers: layer 30 is out of range; the model has 30 layers",
        ),
        (
            "option",
            ["test", "--config", "configs/sad/smollm2_ioi.yaml", "--model.init_args.nulldraws", "2"],
            "error: model.init_args.nulldraws: no such option",
        ),
        ("option", ["report", "smollm2-135m", "--out", "{tmp}/r", "--jobs", "0"], "error: --jobs 0: must be"),
        ("step", ["tset", "--config", "configs/sad/smollm2_ioi.yaml"], "error: 'tset' is not a subcommand"),
        ("step", ["report", "smollm2-135m", "--out", "{tmp}/r", "--steps", "sad,nope"], "error: --steps: 'nope'"),
        ("path", ["test", "--config", "configs/sad/no_such.yaml"], "error: --config configs/sad/no_such.yaml: no such"),
        ("path", ["report", "smollm2-135m", "--out", "{tmp}/file"], "error: --out '{tmp}/file': a file, not a folder"),
    ],
)
def test_bad_input_of_each_kind_fails_in_two_lines_before_torch(tmp_path, kind, args, first):
    (tmp_path / "file").write_text("")
    proc, wall = lit_svd(*(a.format(tmp=tmp_path) for a in args))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stderr[-2000:]
    assert lines[0].startswith(first.format(tmp=tmp_path)), lines
    assert lines[1].startswith(("hint", "offline aliases")), lines
    assert wall < WALL_S, f"{kind}: {wall:.1f} s"
    assert not (tmp_path / "r" / "sad").exists()  # no step started


def test_the_tools_are_callable_from_python(tmp_path):
    import lit_svd as ls

    with pytest.raises(FileNotFoundError, match="no results.json"):
        ls.tool("mask-curve", tmp_path, out=tmp_path / "curve")
