"""The command line: --print_config, overrides, unknown keys, output relocation, TensorBoard contents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lit_svd.cli import main

REPO = Path(__file__).resolve().parents[1]
SINGLE_PAIR = str(REPO / "configs" / "toy" / "single_pair.yaml")
FAST = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def run_cli(args: list[str]) -> None:
    main(args)


def test_print_config_shows_model_data_and_overrides(capsys):
    with pytest.raises(SystemExit) as code:
        run_cli(["fit", "--config", SINGLE_PAIR, "--model.init_args.lambda_attn", "0.25", "--print_config"])
    assert code.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["model"]["class_path"] == "lit_svd.modules.ToyAlignmentModule" or cfg["model"]["class_path"].endswith(
        "ToyAlignmentModule"
    )
    assert cfg["model"]["init_args"]["lambda_attn"] == 0.25
    assert cfg["model"]["init_args"]["template"] == {"pair": [0, 1, 1.0]}
    assert cfg["data"]["init_args"]["n_features"] == 20


def test_unknown_config_key_fails_with_one_line(capsys):
    with pytest.raises(SystemExit) as code:
        run_cli(["fit", "--config", SINGLE_PAIR, "--model.init_args.lambda_atn", "0.5"])
    assert code.value.code != 0
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln.lower()]
    assert len(err_lines) == 1 and "lambda_atn" in err_lines[0], err_lines


def test_bad_value_fails_before_training(tmp_path, capsys):
    with pytest.raises((ValueError, SystemExit)) as err:
        run_cli(
            [
                "fit",
                "--config",
                SINGLE_PAIR,
                "--model.init_args.template",
                '{"pair": [0, 25, 1.0]}',
                "--trainer.default_root_dir",
                str(tmp_path),
            ]
        )
    text = str(err.value) + capsys.readouterr().err
    assert "key_feature=25 is outside [0, n_features=20)" in text
    assert not list(tmp_path.rglob("results.json"))


def read_scalars(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    return scalars, acc.Tags()["images"]


@pytest.mark.slow
def test_fit_relocates_output_and_tensorboard_shows_alignment_rising(tmp_path):
    """A short single-pair fit: everything lands under default_root_dir; the event file has the alignment
    curves, spectra and heatmaps, and the mean |cos| at the end is well above the start."""
    root = tmp_path / "elsewhere"
    run_cli(
        [
            "fit",
            "--config",
            SINGLE_PAIR,
            "--trainer.default_root_dir",
            str(root),
            "--trainer.max_steps",
            "150",
            "--data.init_args.batch_size",
            "128",
            "--model.init_args.lambda_attn",
            "0.5",
            *FAST,
        ]
    )
    results = list(root.rglob("results.json"))
    assert len(results) == 1
    run = results[0].parent
    assert {"heatmap.png", "spectra.png", "alignment_dynamics.png"} <= {p.name for p in run.glob("*.png")}
    res = json.loads(results[0].read_text())
    assert res["experiment"] == "toy_alignment" and res["global_step"] == 150
    inst = res["instances"][0]
    assert inst["lambda"] == 0.5 and inst["seed"] == 0
    assert {"query_feature", "key_feature", "target", "singular_index", "cos_query", "cos_key"} <= set(inst["pairs"][0])

    scalars, images = read_scalars(run)
    for tag in (
        "alignment/mean_abs_cos",
        "alignment/mean_abs_cos/seed=0",
        "alignment/pair0_cos_query/seed=0",
        "spectrum/d1/sigma/seed=0",
        "spectrum/d1/match_cos/seed=0",
        "spectrum/directions_kept/seed=0",
        "spectrum/sigma_ratio/seed=0",
        "train/loss",
    ):
        assert tag in scalars, tag
    assert not [t for t in scalars if "sigma0" in t]  # singular values are numbered from 1
    # d1 is followed, not re-read from the sorted spectrum: its last value is sigma_1 of the end (it stays on top)
    assert scalars["spectrum/d1/sigma/seed=0"][-1][1] == pytest.approx(inst["singular_values"][0], rel=1e-5)
    assert res["tracked_directions"][-1]["step"] == 150
    assert {"heatmap/cos_W_U/seed=0", "heatmap/cos_W_V/seed=0", "heatmap", "spectra"} <= set(images)
    curve = scalars["alignment/mean_abs_cos/seed=0"]
    assert curve[0][0] == 0 and curve[-1][0] == 150
    assert curve[0][1] < 0.8 and curve[-1][1] > 0.95 and curve[-1][1] > curve[0][1] + 0.2
    # the final scalar is the value written to results.json
    assert curve[-1][1] == pytest.approx(inst["mean_abs_cos"], abs=1e-6)


def test_progress_shows_steps_and_alignment_without_adverts(tmp_path, capsys):
    """A step-based run counts optimizer steps (``step N/max_steps``, never ``Epoch 0/-2``), shows the toy's
    mean |cos| and no logger advert, deprecation note or ``v_num``."""
    run_cli(
        [
            "fit",
            "--config",
            SINGLE_PAIR,
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.max_steps",
            "30",
            "--trainer.enable_model_summary=false",
        ]
    )
    captured = capsys.readouterr()
    shown = (captured.out + captured.err).replace("\r", "\n")
    assert "step 30/30" in shown and "|cos|=" in shown, shown[-2000:]
    for noise in ("Epoch", "v_num", "litlogger", "Tip:", "deprecated", "GPU available"):
        assert noise not in shown, noise


def test_step_bar_labels_known_metrics():
    from lit_svd.progress import bar_metrics

    assert bar_metrics({"train/kl": 0.2214, "train/kept_fraction": 0.0748, "train/l1": 3.0}) == {
        "KL": "0.221",
        "kept": "7.48%",
    }
    assert bar_metrics({"train/custom": 1.5, "v_num": 3}) == {"custom": "1.5"}


def test_every_argument_of_every_class_has_its_own_help_line():
    """``--model.help CLASS`` prints each argument's line of the class docstring: one ``name: text`` per argument
    (a line naming several arguments at once is not matched to any of them), and a summary line first."""
    import inspect

    import docstring_parser

    import lit_svd.callbacks as callbacks
    import lit_svd.datamodules as datamodules
    import lit_svd.modules as modules

    for package in (modules, datamodules, callbacks):
        for name in dir(package):
            cls = getattr(package, name)
            if not inspect.isclass(cls):
                continue
            doc = docstring_parser.parse(cls.__doc__ or "")
            params = [
                name
                for name, p in inspect.signature(cls.__init__).parameters.items()
                if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
            missing = [p for p in params if p not in {d.arg_name for d in doc.params}]
            assert not missing, f"{name}: no docstring line for {missing}"
            assert doc.short_description and not doc.short_description.startswith("Args"), name


def test_model_help_renders_the_docstring(capsys):
    with pytest.raises(SystemExit) as code:
        run_cli(["fit", "--model.help", "DirectionMaskModule"])
    assert code.value.code == 0
    out = capsys.readouterr().out
    assert "Learn a mask over the singular directions" in out
    assert "--model.ablation {zero,patch}" in out and "AdamW learning rate" in out
