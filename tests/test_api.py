"""The Python API (lit_svd/api.py) against the command line: the same settings give the same results.json
(provenance's time, command and commit excepted), the tables have the columns docs/api.md lists, and a bad
keyword fails in one line naming it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lit_svd as ls
from lit_svd import api
from tests.helpers import ROOT, run_lit_svd

pytestmark = pytest.mark.slow  # whole runs (tiny models), a CLI subprocess each
FAST = {"enable_progress_bar": False, "enable_model_summary": False}
FAST_ARGS = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
SAD = {"n_test": 8, "batch_size": 4, "min_pairs": 2}
MASKS = {
    "max_steps": 6,
    "max_time": None,
    "soft_steps": 2,
    "steps_per_batch": 2,
    "n_train": 16,
    "n_val": 8,
    "n_test": 8,
    "batch_size": 4,
    "trajectory_every": 2,
}
RUN_ONLY = ("created", "command", "git_commit", "git_dirty")  # what ran, not what was measured


def content(folder: Path) -> dict:
    data = json.loads((Path(folder) / "results.json").read_text())
    for key in RUN_ONLY:
        data["provenance"].pop(key)
    data.pop("train_wall_s", None)  # a mask run's training wall time
    return data


def cli_run(args: list[str], root: Path) -> Path:
    """The CLI in a subprocess into ``root`` (the API's run goes into the same root: version_0 vs version_1,
    so that default_root_dir in the resolved config is the same)."""
    run_lit_svd([*args, *FAST_ARGS, "--trainer.default_root_dir", str(root)], cwd=ROOT)
    (found,) = root.rglob("results.json")
    return found.parent


def test_toy_api_equals_cli(tmp_path):
    folder = cli_run(
        [
            "fit",
            "--config",
            "configs/toy/single_pair.yaml",
            "--trainer.max_steps",
            "20",
            "--data.init_args.batch_size",
            "64",
        ],
        tmp_path,
    )
    result = ls.run("configs/toy/single_pair.yaml", max_steps=20, batch_size=64, out=tmp_path, **FAST)
    assert result.folder != folder and type(result).__name__ == "ToyAlignmentResult"
    assert content(result.folder) == content(folder)
    assert result.summary == json.loads((result.folder / "results.json").read_text())


def test_sad_on_a_tiny_model_api_equals_cli(tmp_path):
    tiny = api.resolve_model("tiny-llama")
    folder = cli_run(
        ["test", "--config", "configs/sad/smollm2_ioi.yaml", "--model.init_args.model", tiny]
        + ["--data.init_args.tokenizer", tiny, "--data.init_args.n_test", "8", "--data.init_args.batch_size", "4"]
        + ["--model.init_args.min_pairs", "2"],
        tmp_path,
    )
    result = ls.sad("tiny-llama", task="ioi", out=tmp_path, **SAD, **FAST)
    assert content(result.folder) == content(folder)
    command = result.provenance.command  # the CLI command that reproduces the API's run
    assert command[:4] == ["python -m lit_svd", "test", "--config", str(ROOT / "configs/sad/smollm2_ioi.yaml")]
    assert "--data.init_args.n_test=8" in command and sys.argv[0] != "python -m lit_svd"
    assert list(result.table().columns) == documented_columns("SADResult")
    assert len(result.table()) == 2 * 4  # 2 layers x 4 heads
    html = result._repr_html_()
    assert "<table" in html and html.count("data:image/png;base64,") == len(result.figures) == 2


def test_masks_and_directions_on_a_tiny_model_api_equals_cli(tmp_path):
    tiny = api.resolve_model("tiny-llama")
    args = ["fit", "--config", "configs/masks/smollm2_ioi.yaml", "--model.init_args.model", tiny]
    args += ["--data.init_args.tokenizer", tiny, "--trainer.max_time", "null"]
    args += ["--trainer.callbacks.init_args.trajectory_every", "2", "--trainer.max_steps", "6"]
    for key in ("soft_steps", "steps_per_batch"):
        args += [f"--model.init_args.{key}", str(MASKS[key])]
    for key in ("n_train", "n_val", "n_test", "batch_size"):
        args += [f"--data.init_args.{key}", str(MASKS[key])]
    folder = cli_run(args, tmp_path / "masks")
    result = ls.masks("tiny-llama", task="ioi", out=tmp_path / "masks", **MASKS, **FAST)
    assert content(result.folder) == content(folder)
    assert list(result.table().columns) == documented_columns("MaskResult")

    check = ls.directions(result, n_random=4, out=tmp_path / "check", **FAST)
    assert type(check).__name__ == "DirectionCheckResult" and check.run == str(result.folder)
    assert list(check.table().columns) == documented_columns("DirectionCheckResult")
    assert check.n_directions == len(check.table())


def test_mounts_table_columns_as_documented(tmp_path, wikitext_valid):
    result = ls.mounts(
        "tiny-llama",
        path=wikitext_valid,
        seq_len=32,
        test_tokens=256,
        batch_size=4,
        tile_widths={"q": 16, "k": 16, "v": 16, "o": 32, "gate": 32, "up": 32, "down": 64},
        modes_sweep=[1, 2],
        k_active=2,
        steer_mounts=1,
        steer_texts=1,
        steer_tokens=4,
        out=tmp_path,
        **FAST,
    )
    assert list(result.table().columns) == documented_columns("MountsResult")
    assert result.n_site_layers == len(result.table()) == 7 * 2


def documented_columns(name: str) -> list[str]:
    """The columns docs/api.md lists for a result type's table (a line "`NAME.table()` columns: `a`, `b`")."""
    text = (ROOT / "docs" / "api.md").read_text()
    line = re.search(rf"`{name}\.table\(\)` columns: (.*)", text)
    assert line, f"docs/api.md lists no columns for {name}"
    return re.findall(r"`([^`]+)`", line.group(1))


@pytest.mark.parametrize(
    ("call", "keys", "expected"),
    [
        (
            "masks",
            {"lrr": 1},
            r"^lrr: no such option of DirectionMaskModule, TaskDataModule, DirectionMaskReport or the Trainer"
            r" \(did you mean lr\?\)$",
        ),
        (
            "sad",
            {"seed": 1},
            r"^seed: taken by SADAnalysisModule and TaskDataModule; write model__seed= or data__seed=$",
        ),
        ("masks", {"ablation": "foo"}, r"^model\.init_args\.ablation: must be one of 'zero', 'patch', got foo"),
        ("masks", {"steps_per_batch": 0}, r"^steps_per_batch=0 is invalid; give an integer >= 1$"),
    ],
)
def test_a_bad_keyword_fails_in_one_line_naming_it(call, keys, expected, tmp_path):
    with pytest.raises(ValueError) as err:
        getattr(ls, call)("tiny-llama", out=tmp_path, **keys)
    assert "\n" not in str(err.value) and re.search(expected, str(err.value)), str(err.value)
    assert not list(tmp_path.rglob("results.json"))


def test_keyword_scheme():
    config = {
        "model": {"class_path": "lit_svd.modules.sad.SADAnalysisModule"},
        "data": {"class_path": "TaskDataModule"},
    }
    assert api.cli_key("min_pairs", config) == "model.init_args.min_pairs"
    assert api.cli_key("n_test", config) == "data.init_args.n_test"
    assert api.cli_key("max_steps", config) == "trainer.max_steps"
    assert api.cli_key("data__seed", config) == "data.init_args.seed"
    assert (
        api.cli_key("trainer__callbacks__init_args__every_n_steps", config)
        == "trainer.callbacks.init_args.every_n_steps"
    )
    assert api.cli_key("data.init_args.n_test", config) == "data.init_args.n_test"
    assert api.cli_key("out", config) == "trainer.default_root_dir"
    assert api.cli_value(None) == "null" and api.cli_value([1, 2]) == "[1, 2]" and api.cli_value(True) == "true"
    path, fixed = api.config_for("masks", "gemma3-270m", "gp")
    assert path.name == "gemma3_270m_gp.yaml" and fixed == {}
    path, fixed = api.config_for("sad", "tiny-llama", "gt")  # no SAD GT config: the IOI one with the task set
    assert path.name == "smollm2_ioi.yaml" and fixed == {"data.init_args.task": "gt"}
    with pytest.raises(ValueError, match="^model='tiny-nope': no such tiny model; allowed: tiny-gpt2"):
        api.resolve_model("tiny-nope")


def test_importing_lit_svd_stays_cheap():
    code = "import sys, lit_svd as ls; f = ls.sad; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
