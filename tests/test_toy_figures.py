"""Every toy figure plots what results.json records: the figures are drawn from the result read back from
the written results.json (``figures.toy.figures``: a pure function of the result), and the data behind each
(read back from the matplotlib artists) is checked against that file, on short frozen-feature sweeps."""

import json
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

import lit_svd.callbacks.alignment as alignment_cb
from lit_svd.callbacks import SVDAlignmentCallback
from lit_svd.datamodules.toy import SparseFeatureDataModule
from lit_svd.figures.toy import figures as toy_figures
from lit_svd.modules.toy import ToyAlignmentModule
from lit_svd.results.toy import ToyAlignmentResult


def fit_and_capture(tmp_path, monkeypatch, n_instances, **model_kw):
    torch.manual_seed(0)
    model = ToyAlignmentModule(n_features=8, template={"pair": [0, 1, 1.0]}, frozen_features=True, lr=1e-2, **model_kw)
    dm = SparseFeatureDataModule(n_features=8, n_keys=4, p=0.3, n_instances=n_instances, batch_size=32, seed=0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=30,
        default_root_dir=tmp_path,
        logger=False,
        callbacks=[SVDAlignmentCallback(every_n_steps=10)],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    path = Path(tmp_path) / "results.json"
    written = sorted(p.stem for p in Path(tmp_path).glob("*.png"))
    figures = toy_figures(ToyAlignmentResult.from_json(path))
    assert written == sorted(figures)  # the run wrote exactly the figures of its result
    return json.loads(path.read_text()), figures


def ydata(line):
    return np.asarray(line.get_ydata(), dtype=float)


def check_common(res, figures):
    inst = res["instances"]
    spectra = figures["spectra"].axes[0].lines
    assert len(spectra) == len(inst)
    for line, i in zip(spectra, inst):
        s = np.asarray(i["singular_values"])
        np.testing.assert_allclose(ydata(line), s / s[0], rtol=1e-6)
    dyn = figures["alignment_dynamics"].axes[0].lines
    for n, line in enumerate(dyn):
        np.testing.assert_allclose(ydata(line), [h["mean_abs_cos"][n] for h in res["history"]], rtol=1e-6)
        np.testing.assert_array_equal(line.get_xdata(), [h["step"] for h in res["history"]])
    heat = figures["heatmap"].axes
    for m in inst[0]["pairs"]:
        k = m["singular_index"]
        if k < heat[0].images[0].get_array().shape[1]:
            assert heat[0].images[0].get_array()[m["query_feature"], k] == pytest.approx(m["cos_query"], rel=1e-5)
            assert heat[1].images[0].get_array()[m["key_feature"], k] == pytest.approx(m["cos_key"], rel=1e-5)


def test_interference_sweep_plots_the_recorded_theorem1_values(tmp_path, monkeypatch):
    """The figure's prediction and raw series are the theorem1 records (singular index 0), its third series
    the pairs' mean |cos| at their recorded indices: the old figure read the least-squares optimum at the
    pair's raw-matched index instead, 0.02 where results.json said 0.9999."""
    targets = [0.0, 2.0, 5.0, 6.5]
    res, figures = fit_and_capture(tmp_path, monkeypatch, 4, d_model=8, d_head=8, interference=targets)
    check_common(res, figures)
    inst = res["instances"]
    assert [i["theorem1"]["singular_index"] for i in inst] == [0] * 4
    lines = figures["interference_sweep"].axes[0].lines
    expected = [
        [i["theorem1"]["cos_u1_prediction"] for i in inst],
        [i["theorem1"]["cos_u1_raw"] for i in inst],
        [i["mean_abs_cos"] for i in inst],
    ]
    assert len(lines) == 3
    for line, want in zip(lines, expected):
        np.testing.assert_allclose(ydata(line), want, rtol=1e-9)
        np.testing.assert_allclose(np.asarray(line.get_xdata(), dtype=float), [i["interference"] for i in inst])
    for i in inst:  # every pair record names the optimum's own index for its prediction cosine
        assert all(m["prediction_index"] == 0 for m in i["pairs"])


def test_superposition_figure_plots_the_recorded_groups(tmp_path, monkeypatch):
    res, figures = fit_and_capture(
        tmp_path, monkeypatch, 8, d_head=None, grid_seeds=2, grid={"d_model": [8, 4], "interference": [None, 5.0]}
    )
    check_common(res, figures)
    groups = res["summary"]["theorem1_groups"]
    assert len(groups) == 4 and all(g["n_seeds"] == 2 for g in groups)
    for g in groups:  # the groups against the instances they summarise
        members = [
            i
            for i in res["instances"]
            if i["d_model"] == g["d_model"] and i["interference_target"] == g["interference_target"]
        ]
        assert len(members) == 2
        assert g["cos_u1_prediction_worst"] == min(m["theorem1"]["cos_u1_prediction"] for m in members)
        assert g["cos_u1_raw_mean"] == pytest.approx(np.mean([m["theorem1"]["cos_u1_raw"] for m in members]))
    lines = iter(figures["theorem1_superposition"].axes[0].lines)
    for d in (8, 4):
        rows = sorted((g for g in groups if g["d_model"] == d), key=lambda g: g["interference_mean"])
        for key in ("cos_u1_prediction", "cos_u1_raw"):
            for stat in ("mean", "worst"):
                line = next(lines)
                np.testing.assert_allclose(ydata(line), [g[f"{key}_{stat}"] for g in rows], rtol=1e-12)
                np.testing.assert_allclose(
                    np.asarray(line.get_xdata(), dtype=float), [g["interference_mean"] for g in rows]
                )


def test_instances_are_named_by_the_settings_that_differ():
    """TensorBoard tags and legends name each instance by its varying settings, never by position."""
    m = ToyAlignmentModule(
        n_features=6, d_model=6, d_head=6, template={"pair": [0, 1, 1.0]}, lambda_attn=[0.3, 1.0, 0.3], seeds=[0, 0, 2]
    )
    assert alignment_cb.instance_tags(m) == ["seed=0,lambda=0.3", "seed=0,lambda=1", "seed=2,lambda=0.3"]
    assert alignment_cb.instance_labels(m) == ["seed 0, lambda 0.3", "seed 0, lambda 1", "seed 2, lambda 0.3"]
    same = ToyAlignmentModule(n_features=6, d_model=6, d_head=6, template={"pair": [0, 1, 1.0]}, seeds=[0, 0])
    assert alignment_cb.instance_tags(same) == ["seed=0#0", "seed=0#1"]  # identical settings stay distinct
    assert alignment_cb.instance_tags(
        ToyAlignmentModule(n_features=6, d_model=6, d_head=6, template={"pair": [0, 1, 1.0]}, seed=3)
    ) == ["seed=3"]
