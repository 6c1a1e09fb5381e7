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


# one option per module and data module that only its constructor judged before (each now has its torch-free
# ``options_check``, which the fast check runs); bench/config_errors_bench.py times these cases for docs/api.md
MODULE_CASES = [
    (
        "toy",
        ["fit", "--config", "configs/toy/single_pair.yaml", "--model.init_args.importance_decay", "2"],
        "error: importance_decay=2.0: must lie in (0, 1]",
    ),
    (
        "toy data",
        ["fit", "--config", "configs/toy/single_pair.yaml", "--data.init_args.p", "1.5"],
        "error: p=1.5: every activation probability must lie in (0, 1]",
    ),
    (
        "mounts",
        ["test", "--config", "configs/mounts/smollm2_wikitext.yaml", "--model.init_args.fit_fraction", "1.5"],
        "error: fit_fraction=1.5 is not allowed: it must lie strictly between 0 and 1",
    ),
    (
        "mounts layers",
        ["test", "--config", "configs/mounts/smollm2_wikitext.yaml", "--model.init_args.layers", "[30]"],
        "error: layers: layer 30 is out of range; the model has 30 layers (0..29)",
    ),
    (
        "text data",
        ["test", "--config", "configs/mounts/smollm2_wikitext.yaml", "--data.init_args.path", "no.txt"],
        "error: path='no.txt' does not exist",
    ),
    (
        "direction check",
        ["test", "--config", "configs/masks/smollm2_ioi_directions.yaml", "--model.init_args.n_random", "1"],
        "error: n_random=1: the null needs at least 2 random directions",
    ),
    (
        "language model",
        ["fit", "--config", "configs/sad/train_tiny_lm.yaml", "--model.init_args.n_heads", "3"],
        "error: model.d_model=128 is not divisible by model.n_heads=3",
    ),
    (
        "fine-tune",
        ["fit", "--config", "configs/training/smollm2_finetune_ioi.yaml", "--model.init_args.layers", "[30]"],
        "error: model.layers: layer 30 is out of range; the model has 30 layers (0..29)",
    ),
    (
        "task data",
        ["validate", "--config", "configs/masks/smollm2_ioi.yaml", "--data.init_args.n_test", "-1"],
        "error: n_test=-1 is invalid; give a non-negative integer",
    ),
    (
        "direction mask",
        ["fit", "--config", "configs/masks/smollm2_ioi.yaml", "--model.init_args.steps_per_batch", "0"],
        "error: steps_per_batch=0 is invalid; give an integer >= 1",
    ),
    (
        "direction mask layers",
        ["fit", "--config", "configs/masks/smollm2_ioi.yaml", "--model.init_args.layers", "[30]"],
        "error: layers: layer 30 is out of range; the model has 30 layers (0..29)",
    ),
    (
        "faithfulness",
        ["test", "--config", "configs/faithfulness/smollm2_ioi.yaml", "--model.init_args.methods", "[mask]"],
        "error: methods has 'mask' but mask_run is null; give the folder of a finished direction-mask run",
    ),
    (
        "faithfulness sizes",
        ["test", "--config", "configs/faithfulness/smollm2_ioi.yaml", "--model.init_args.sizes", "[0.5, 0.1]"],
        "error: sizes=[0.5, 0.1]: give fractions in (0, 1], strictly increasing",
    ),
    (
        "circuit rel_gap",
        ["test", "--config", "configs/circuits/smollm2_ioi.yaml", "--model.init_args.rel_gap", "1.5"],
        "error: rel_gap=1.5 is invalid; the relative gap between blocks must be in [0, 1)",
    ),
]


@pytest.mark.parametrize("case, args, first", MODULE_CASES, ids=[c[0] for c in MODULE_CASES])
def test_a_constructor_check_fails_in_two_lines_before_torch(case, args, first):
    proc, wall = lit_svd(*args)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stderr[-2000:]  # LIGHT adds a line if torch was imported
    assert lines[0] == first or lines[0].startswith(first), lines
    assert lines[1].startswith("hint"), lines
    assert wall < WALL_S, f"{case}: {wall:.1f} s"


def test_the_tools_are_callable_from_python(tmp_path):
    import lit_svd as ls

    with pytest.raises(FileNotFoundError, match="no results.json"):
        ls.tool("mask-curve", tmp_path, out=tmp_path / "curve")
