"""The Python API (lit_svd/api.py) against the command line: the same settings give the same results.json
(provenance's time, command and commit excepted), by name and on one model object (``ls.model``: SAD, masks, the
direction check, the circuit graph and faithfulness, one SVD per (layer, kind)), a model the user loaded gives the
results of its saved twin, the tables have the columns docs/api.md lists, and a bad keyword fails in one line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lit_svd as ls
from lit_svd import api
from lit_svd.model_names import ModelUnavailableError
from lit_svd.models.loading import local_name
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
    data.pop("timing", None)  # a circuit graph's wall times
    data.pop("wall_s", None)  # faithfulness's test loop
    for curve in (data.get("faithfulness") or {}).values():
        curve.pop("seconds", None)  # each faithfulness curve's wall time
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
    folder = cli_run(
        ["test", "--config", "configs/sad/smollm2_ioi.yaml", "--model.init_args.model", "tiny-llama"]
        + ["--data.init_args.tokenizer", "tiny-llama", "--data.init_args.n_test", "8", "--data.init_args.batch_size"]
        + ["4", "--model.init_args.min_pairs", "2"],
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


# --- one model object, every method: the CLI's results.json, one SVD per (layer, kind) --------------------------
CIRCUITS = {"n_test": 8, "batch_size": 4, "n_train": 16, "n_val": 8, "depth": 1, "n_check": 2, "n_random": 4}
FAITH = {"n_test": 8, "batch_size": 4, "methods": ["eap_heads", "random"], "random_seeds": [0], "sizes": [0.1, 1.0]}
NO_RUNS = {"mask_run": None, "graph_run": None}


def cli_of(keys: dict, config: str, subcommand: str = "test") -> list[str]:
    """The CLI arguments of the API keywords ``keys`` on ``config`` (the scheme of lit_svd.commands, written out)."""
    from lit_svd.commands import cli_key, cli_value, read_config

    cfg = read_config(ROOT / config)
    args = [subcommand, "--config", config, "--model.init_args.model", "tiny-llama"]
    args += ["--data.init_args.tokenizer", "tiny-llama"]
    return args + [a for k, v in keys.items() for a in (f"--{cli_key(k, cfg)}", cli_value(v))]


@pytest.fixture(scope="module")
def tiny_model():
    """``tiny-llama`` loaded once; every map SVD it computes is counted (``models.svds.map_svd``)."""
    import lit_svd.models.svds as svds

    counted: dict = {}
    real = svds.map_svd

    def counting(view, layer, kind):
        counted[(layer, kind)] = counted.get((layer, kind), 0) + 1
        return real(view, layer, kind)

    svds.map_svd = counting
    try:
        yield ls.model("tiny-llama"), counted
    finally:
        svds.map_svd = real


def test_the_model_object_runs_sad_and_masks_as_the_cli_does(tmp_path, tiny_model):
    m, _ = tiny_model
    assert "Model('tiny-llama')" in repr(m) and len(repr(m).splitlines()) <= 5
    sad = cli_run(cli_of({"min_pairs": 2, "n_test": 8, "batch_size": 4}, "configs/sad/smollm2_ioi.yaml"), tmp_path)
    assert content(m.sad(task="ioi", out=tmp_path, **SAD, **FAST).folder) == content(sad)
    masks = cli_run(cli_of(MASKS, "configs/masks/smollm2_ioi.yaml", "fit"), tmp_path / "masks")
    result = m.masks(task="ioi", out=tmp_path / "masks", **MASKS, **FAST)
    assert content(result.folder) == content(masks) and type(result).__name__ == "MaskResult"
    assert list(result.table().columns) == documented_columns("MaskResult")

    args = ["test", "--config", "configs/masks/smollm2_ioi_directions.yaml", "--model.init_args.run", str(masks)]
    cli_check = cli_run([*args, *check_data_args(masks), "--model.init_args.n_random", "4"], tmp_path / "check")
    check = m.directions(masks, n_random=4, out=tmp_path / "check", **FAST)  # the CLI's mask run, read by both
    assert content(check.folder) == content(cli_check)
    assert type(check).__name__ == "DirectionCheckResult" and check.run == str(masks)
    assert list(check.table().columns) == documented_columns("DirectionCheckResult")
    assert check.n_directions == len(check.table())


def check_data_args(run: Path) -> list[str]:
    """The mask run's data section as CLI overrides (what the direction check takes from the run)."""
    import yaml

    from lit_svd.commands import cli_value

    data = yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"]
    kept = {k: v for k, v in data.items() if k not in ("batch_size", "num_workers")}
    return [a for k, v in kept.items() for a in (f"--data.init_args.{k}", cli_value(v))]


def test_the_model_object_runs_the_circuit_graph_and_faithfulness_as_the_cli_does(tmp_path, tiny_model):
    m, _ = tiny_model
    graph = cli_run(cli_of(CIRCUITS, "configs/circuits/smollm2_ioi.yaml"), tmp_path / "graph")
    assert content(m.circuit(task="ioi", out=tmp_path / "graph", **CIRCUITS, **FAST).folder) == content(graph)
    keys = {**FAITH, **NO_RUNS}
    faith = cli_run(cli_of(keys, "configs/faithfulness/smollm2_ioi.yaml"), tmp_path / "faith")
    result = m.faithfulness(task="ioi", out=tmp_path / "faith", **keys, **FAST)
    assert content(result.folder) == content(faith) and type(result).__name__ == "FaithfulnessResult"


def test_one_svd_per_layer_and_kind_per_model_object(tiny_model):
    """After SAD, masks, the direction check, the circuit graph and faithfulness on one model object (the tests
    above): every map was decomposed once (SmolLM2's layout: q, k, ov, mlp_in, mlp_gate, mlp_out per layer)."""
    m, counted = tiny_model
    assert counted, "no SVD was computed through the model object"
    assert set(counted.values()) == {1}, counted
    assert {(l, k) for l in range(2) for k in ("q", "k", "ov", "mlp_in", "mlp_gate", "mlp_out", "qk")} == set(counted)
    assert dict(m.svds.computed) == counted


def test_a_model_loaded_by_the_user_gives_the_results_of_its_saved_twin(tmp_path):
    """A Hugging Face model the user loaded (``from_pretrained`` of the saved ``tiny-llama`` folder), handed in under
    another name: its SAD rows and headline equal those of the name, loaded by the run itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = local_name("tiny-llama")
    hf = AutoModelForCausalLM.from_pretrained(folder)
    m = ls.model(hf, AutoTokenizer.from_pretrained(folder), name="my-llama")
    mine = m.sad(task="ioi", out=tmp_path / "mine", **SAD, **FAST)
    named = ls.sad("tiny-llama", task="ioi", out=tmp_path / "named", **SAD, **FAST)
    assert mine.model == "my-llama" and named.model == "tiny-llama"
    assert mine.heads == named.heads and mine.headline == named.headline


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
    from lit_svd.commands import cli_key, cli_value, config_for

    config = {
        "model": {"class_path": "lit_svd.modules.sad.SADAnalysisModule"},
        "data": {"class_path": "TaskDataModule"},
    }
    assert cli_key("min_pairs", config) == "model.init_args.min_pairs"
    assert cli_key("dtype", config) == "model.init_args.dtype"  # a loading option, from the base module
    assert cli_key("n_test", config) == "data.init_args.n_test"
    assert cli_key("max_steps", config) == "trainer.max_steps"
    assert cli_key("data__seed", config) == "data.init_args.seed"
    assert (
        cli_key("trainer__callbacks__init_args__every_n_steps", config) == "trainer.callbacks.init_args.every_n_steps"
    )
    assert cli_key("data.init_args.n_test", config) == "data.init_args.n_test"
    assert cli_key("out", config) == "trainer.default_root_dir"
    assert cli_value(None) == "null" and cli_value([1, 2]) == "[1, 2]" and cli_value(True) == "true"
    path, fixed = config_for("masks", "gemma3-270m", "gp")
    assert path.name == "gemma3_270m_gp.yaml" and fixed == {}
    path, fixed = config_for("sad", "tiny-llama", "gt")  # no SAD GT config: the IOI one with the task set
    assert path.name == "smollm2_ioi.yaml" and fixed == {"data.init_args.task": "gt"}
    with pytest.raises(ModelUnavailableError, match="^model='tiny-nope': no such tiny model; allowed: tiny-gpt2"):
        local_name("tiny-nope")
    assert local_name("tiny-llama").endswith("llama-seed0")  # what load_causal_lm("tiny-llama") loads


def test_every_method_of_the_registry_is_in_the_api():
    from lit_svd.registry import METHODS

    for name, spec in METHODS.items():
        assert (
            getattr(ls, name).__name__ == name and spec.summary.split()[0].lower() in getattr(ls, name).__doc__.lower()
        )
        assert name in dir(ls) and name in dir(api.Model(object()))


def test_importing_lit_svd_stays_cheap():
    code = "import sys, lit_svd as ls; f = ls.sad; print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
