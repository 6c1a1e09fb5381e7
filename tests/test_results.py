"""Typed results: every method's result round-trips through JSON, carries its provenance, frames its rows and
saves them; the NaN policy; the one reader of finished runs (``lit_svd.runs``); figures from results alone."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest

import lit_svd
import lit_svd.figures  # noqa: F401  (registers every type's figures function)
from lit_svd import results as R
from lit_svd.runs import find_results, load_run


def sample(cls: type[R.Result]) -> R.Result:
    """An instance of ``cls`` with every field set to a value of its declared type (rows where rows go)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in cls.content_fields():
        kind = str(hints[f.name])
        if "list" in kind:
            values[f.name] = []
        elif "dict" in kind:
            values[f.name] = {"a": 1}
        elif "bool" in kind:
            values[f.name] = True
        elif "float" in kind:
            values[f.name] = 0.5
        elif "int" in kind:
            values[f.name] = 3
        else:
            values[f.name] = "x"
    if cls is R.FaithfulnessResult:  # its rows read curves: one ranking's curves of two sizes on two axes
        curve = {"sizes": [0.5, 1.0], "n_kept": [1, 2], "raw_size": [0.5, 1.0], "fair_size": [0.4, 1.0],
                 "values": [0.2, 1.0], "metric": [0.1, 0.5], "cpr": 0.3, "cmd": 0.4, "seconds": 1.5}  # fmt: skip
        scores = {"cpr": {"raw": 0.3, "fair": 0.3}, "cmd": {"raw": 0.4, "fair": 0.4}}
        values["faithfulness"] = {"eap_heads": {"rankings": {"signed": {"raw": curve, "fair": curve}}, **scores}}
    if cls is R.EdgeCircuitResult:  # its rows and headline read curves: one curve of two sizes
        curve = {"sizes": [0.5, 1.0], "n_edges": [1, 2], "weighted": [0.5, 1.0], "values": [0.2, 1.0]}
        values["curves"] = {"directions_signed_fair": {**curve, "metric": [0.1, 0.5], "cpr": 0.3, "cmd": 0.4,
                                                       "seconds": 1.5}}  # fmt: skip
    return cls(**values)


@pytest.mark.parametrize("cls", R.TYPES, ids=lambda c: c.__name__)
def test_every_result_round_trips_through_json(cls, tmp_path):
    res = sample(cls)
    res.provenance = R.Provenance.collect(config={"model": {"init_args": {"seed": 1}}}, seeds={"global": 0})
    res.extra = {"a_section_of_another_callback": {"k": [1, 2]}}
    text = res.to_json()
    back = R.load_result(json.loads(text))
    assert type(back) is cls and back == res  # every field, the provenance and the unknown keys
    assert back.to_json() == text
    path = res.save(tmp_path)
    assert R.load_result(path) == res and R.load_result(tmp_path) == res
    assert set(cls.describe()) == {"experiment", "provenance", *json.loads(text)} - {"a_section_of_another_callback"}
    assert all(d.split(": ", 1)[1] for d in cls.describe().values())  # every field is described


def test_provenance_block_and_its_fields():
    p = R.Provenance.collect(config={"x": 1}, seeds={"model": 3}, device="cpu").__dict__
    assert p["schema_version"] == R.SCHEMA_VERSION and p["lit_svd_version"] == lit_svd.__version__
    assert set(p["versions"]) == {"python", "torch", "transformers", "lightning"} and p["versions"]["torch"]
    assert p["device"] == "cpu" and p["seeds"] == {"model": 3} and p["config"] == {"x": 1}
    assert p["git_commit"] is None or len(p["git_commit"]) == 40
    assert set(p) == {f.name for f in dataclasses.fields(R.Provenance)}


def test_the_json_key_of_a_field_and_the_wrong_experiment():
    res = sample(R.SADResult)
    content = res.to_dict()
    assert content["experiment"] == "sad" and "summary" in content and "headline" not in content
    assert res.summary == content
    with pytest.raises(ValueError, match="not a MaskResult"):
        R.MaskResult.from_dict(content)
    with pytest.raises(ValueError, match="has no 'model' key"):
        R.SADResult.from_dict({"experiment": "sad"})
    with pytest.raises(ValueError, match="unknown"):
        R.load_result({"experiment": "nothing_like_it"})


def test_nan_policy_fails_by_default_and_writes_null_where_declared(tmp_path):
    res = sample(R.MaskResult)
    res.kl_hard = math.nan
    with pytest.raises(ValueError, match="kl_hard is nan"):
        res.to_json()
    training = R.TrainingResult(overall={"mean_sparsity_first": math.nan}, history=[{"step": 0, "x": [math.nan]}])
    content = json.loads(training.to_json())
    assert content["summary"] == {"mean_sparsity_first": None} and content["history"][0]["x"] == [None]
    assert content["experiment"] == "sad_training"
    assert R.TrainingResult(spectrum={"top_k": 4}).to_dict() == {"experiment": "training", "spectrum": {"top_k": 4}}


def test_tables_and_their_csv(tmp_path):
    res = sample(R.MountsResult)
    res.sites = [
        {"site": "o", "layer": 0, "lift_tiled": 0.25, "coverage_lift": [0.1, 0.2], "checks": {"A1": True, "C1": None}},
        {"site": "o", "layer": 1, "lift_tiled": 0.5, "coverage_lift": [0.3, 0.4], "checks": {"A1": False, "C1": None}},
    ]
    df = res.table()
    assert list(df.columns) == ["site", "layer", "lift_tiled", "coverage_lift", "check_A1", "check_C1"]
    assert df["lift_tiled"].tolist() == [0.25, 0.5] and df["coverage_lift"].tolist() == ["0.1;0.2", "0.3;0.4"]
    res.save(tmp_path)
    lines = (tmp_path / "sites.csv").read_text().splitlines()
    assert lines == [
        "site,layer,lift_tiled,coverage_lift,check_A1,check_C1",
        "o,0,0.25,0.1;0.2,1,",
        "o,1,0.5,0.3;0.4,0,",
    ]
    check = sample(R.DirectionCheckResult)
    check.table_csv = "directions.csv"
    assert list(check.table().columns) == list(R.directions.COLUMNS) and check.table().empty
    check.save(tmp_path)
    assert (tmp_path / "directions.csv").read_text().startswith("component,kind,layer,head,direction,sigma,block,")


def test_runs_reads_a_finished_folder_and_names_what_is_missing(tmp_path):
    res = sample(R.MaskResult)
    res.save(tmp_path / "run")
    (tmp_path / "run" / "config.yaml").write_text("model:\n  init_args:\n    model: m\n")
    run = load_run(tmp_path / "run", need=("config", "results"))
    assert (
        run.init_args("model") == {"model": "m"} and run.result == res and run.content["experiment"] == "direction_mask"
    )
    with pytest.raises(FileNotFoundError, match=r"masks\.pt: no masks\.pt; give the folder of a finished mask run"):
        load_run(tmp_path / "run", need=("masks",), what="mask run")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_run(tmp_path / "nowhere")
    assert [type(r) for _, r in find_results([tmp_path])] == [R.MaskResult]
    with pytest.raises(ValueError, match="not 'sad'"):
        find_results([tmp_path], "sad")


def test_figures_are_drawn_from_a_result_read_back_from_json():
    res = R.MaskThresholdsResult(
        source="runs/a/lightning_logs/version_0",
        max_kl=0.25,
        chosen_on="val",
        thresholds=[
            {"threshold": t, "kept_fraction": k, "val": {"kl_hard": v}, "test": {"kl_hard": v + 0.01}}
            for t, k, v in ((0.01, 0.3, 0.05), (0.1, 0.1, 0.2), (0.5, 0.02, 0.9))
        ],
        chosen=None,
    )
    res.chosen = res.thresholds[1]
    figs = R.load_result(json.loads(res.to_json())).figures
    (ax,) = figs["mask_thresholds"].axes
    got = [float(y) for line in ax.lines[:2] for y in line.get_ydata()]
    assert got == pytest.approx([0.05, 0.2, 0.9, 0.06, 0.21, 0.91])
    assert [float(x) for x in ax.lines[2].get_xdata()] == [10.0]  # the choice, ringed at its kept %


@pytest.mark.slow
def test_a_cli_run_writes_its_provenance(tmp_path):
    """``python -m lit_svd fit``: results.json's provenance holds the resolved config (config.yaml's content),
    the seeds, the versions and the device; the table file is written beside it."""
    import yaml
    from helpers import ROOT, only_results, run_lit_svd

    config = str(ROOT / "configs" / "toy" / "single_pair.yaml")
    run_lit_svd(
        ["fit", "--config", config, "--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path)], tmp_path
    )
    res, folder = only_results(tmp_path)
    prov = res["provenance"]
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    assert prov["config"]["model"] == saved["model"] and prov["config"]["trainer"]["max_steps"] == 3
    assert prov["seeds"]["global"] == saved["seed_everything"] and prov["device"] == "cpu"
    assert prov["lit_svd_version"] == lit_svd.__version__ and prov["schema_version"] == R.SCHEMA_VERSION
    assert prov["command"][1:3] == ["fit", "--config"]
    result = R.load_result(folder)
    assert isinstance(result, R.ToyAlignmentResult) and result.global_step == 3
    assert (folder / "instances.csv").read_text().splitlines()[0].startswith("index,seed,lambda")
