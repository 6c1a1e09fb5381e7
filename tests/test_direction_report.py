"""The `test` config of a finished mask run end to end on a tiny model: results.json, the CSV and the offline HTML
page list every claimed direction and agree; blocks and readouts against independent computations."""

from __future__ import annotations

import csv
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
import yaml

from lit_svd.models import view as make_view
from lit_svd.models.intervene import build_components
from lit_svd.models.tiny import tiny_causal_lm

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "masks"
DATA = {"task": "ioi", "n_train": 8, "n_val": 4, "n_test": 6, "batch_size": 3, "seed": 0, "test_last": True}


def _mask_run(
    folder: Path, model_dir: str, keep: dict[str, list[tuple[int, int]]], swap=None, arch: str = "llama"
) -> Path:
    """A finished mask run as DirectionMaskReport leaves it: masks.pt, config.yaml (and results.json)."""
    view = make_view(tiny_causal_lm(arch))
    lambdas = {c.name: torch.full(c.shape, 1e-4) for c in build_components(view, ["qk", "ov", "mlp"])}
    for name, pairs in keep.items():
        for g, k in pairs:
            lambdas[name][g, k] = 0.9
    folder.mkdir(parents=True)
    torch.save(
        {"lambdas": lambdas, "threshold": 1e-3, "model": model_dir, "hparams": {"fold_norms": True}},
        folder / "masks.pt",
    )
    data = {"class_path": "lit_svd.datamodules.tasks.TaskDataModule", "init_args": {**DATA, "tokenizer": model_dir}}
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    if swap is not None:
        (folder / "results.json").write_text(json.dumps({"steering_swap": swap}))
    return folder


def _test(config: str, run: Path, model_dir: str, out: Path, *extra: str):
    from lit_svd.cli import main

    args = [
        "test",
        "--config",
        str(CONFIGS / config),
        "--model.init_args.run",
        str(run),
        "--trainer.default_root_dir",
        str(out),
        "--trainer.limit_test_batches",
        "null",
        "--trainer.enable_progress_bar",
        "false",
        "--model.init_args.n_random",
        "4",
    ]
    for key, value in {**DATA, "tokenizer": model_dir}.items():
        args += [f"--data.init_args.{key}", str(value)]
    main(args + list(extra))
    return json.loads((out / "results.json").read_text())


class _Table(HTMLParser):
    """Rows of the page's table body as lists of cell texts."""

    def __init__(self):
        super().__init__()
        self.rows, self.head, self._cell, self._in = [], [], None, None

    def handle_starttag(self, tag, attrs):
        if tag in ("th", "td"):
            self._cell = ""
        if tag == "tr":
            self._in = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "th":
            self.head.append(self._cell)
            self._cell = None
        elif tag == "td":
            self._in.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._in:
            self.rows.append(self._in)


def test_kept_directions_table_csv_and_html(tiny_dirs, tmp_path):
    keep = {"L0.ov": [(0, 0), (0, 3), (2, 1)], "L1.ov": [(3, 0)], "L1.mlp_out": [(0, 2)]}
    run = _mask_run(tmp_path / "run", tiny_dirs["llama"], keep)
    out = tmp_path / "out"
    res = _test("smollm2_ioi_directions.yaml", run, tiny_dirs["llama"], out)
    claimed = {(n, g, k) for n, pairs in keep.items() if n.endswith(".ov") for g, k in pairs}  # kinds: [ov]
    rows = res["directions"]
    assert {(r["component"], r["head"], r["direction"]) for r in rows} == claimed
    assert res["n_prompts"] == DATA["n_test"] and res["n_random"] == 4 and res["claims"] == "kept"
    assert res["fraction_pass"] == sum(r["passes"] for r in rows) / len(rows)
    # both counts: z alone (n_pass) and z with at least MIN_GAP_FRACTION of the clean - corrupted gap (n_pass_gap)
    assert res["n_pass_gap"] == sum(r["passes_gap"] for r in rows) <= res["n_pass"]
    assert res["min_gap_fraction"] == 0.01 and res["metric_gap"] == rows[0]["metric_gap"]
    for r in rows:
        assert r["gap_fraction"] == pytest.approx(-r["effect"] / r["metric_gap"])
        assert r["passes_gap"] == (r["passes"] and abs(r["gap_fraction"]) >= 0.01)
    assert res["fraction_isolated"] == sum(r["isolated"] for r in rows) / len(rows)
    assert res["directions_per_s"] > 0 and res["table_html"] == "directions.html"
    for r in rows:
        assert r["readout"]["side"] == "write" and len(r["readout"]["plus"]) == 8
        assert r["passes"] == (r["z"] >= res["z_pass"])
    # CSV: the same rows and values as results.json
    with open(out / res["table_csv"], newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    for line, r in zip(table, rows):
        assert (line["component"], int(line["head"]), int(line["direction"])) == (
            r["component"],
            r["head"],
            r["direction"],
        )
        assert float(line["z"]) == pytest.approx(r["z"], rel=1e-12) and line["passes"] == str(r["passes"])
        assert float(line["gap"]) == pytest.approx(r["gap"]) and int(line["block_size"]) == r["block"]["size"]
        assert line["readout_plus"].split(" | ") == r["readout"]["plus"]
    # HTML: parses, no network resource, every claimed direction listed once
    page = (out / res["table_html"]).read_text()
    parser = _Table()
    parser.feed(page)
    assert "http://" not in page and "https://" not in page and "<script src" not in page
    col = {name: i for i, name in enumerate(parser.head)}
    listed = {(c[col["component"]], int(c[col["head"]]), int(c[col["direction"]])) for c in parser.rows}
    assert listed == claimed and len(parser.rows) == len(claimed)
    assert (out / "directions_z.png").is_file()


def test_swap_directions_and_other_kinds(tiny_dirs, tmp_path):
    swap = {
        "directions": [
            {"component": "L1.ov", "head": 2, "direction": 0, "separation": 3.0},
            {"component": "L0.ov", "head": 1, "direction": 5, "separation": 2.0},
        ]
    }
    run = _mask_run(tmp_path / "run", tiny_dirs["llama"], {"L0.mlp_in": [(0, 1)]}, swap=swap)
    res = _test("smollm2_gp_directions.yaml", run, tiny_dirs["llama"], tmp_path / "gp", "--data.init_args.task", "ioi")
    assert [(r["component"], r["head"], r["direction"]) for r in res["directions"]] == [
        ("L0.ov", 1, 5),
        ("L1.ov", 2, 0),
    ]
    res = _test(
        "smollm2_ioi_directions.yaml", run, tiny_dirs["llama"], tmp_path / "mlp", "--model.init_args.kinds", "[mlp_in]"
    )
    (row,) = res["directions"]
    assert row["component"] == "L0.mlp_in" and row["readout"]["side"] == "read"


def test_block_columns_against_hand_counts():
    from lit_svd.modules.direction_check import block_columns

    view = make_view(tiny_causal_lm("llama"))
    comp = build_components(view, ["ov"], layers=[0])[0]
    comp.S = torch.tensor([[4.0, 3.9, 2.0, 1.0] + [0.5 / (i + 1) for i in range(comp.shape[1] - 4)]] * comp.shape[0])
    rows = block_columns(comp, [comp.address(g, k) for g, k in [(0, 0), (0, 1), (0, 2), (1, 3)]], rel_gap=0.05)
    assert [(r["block"]["id"], r["block"]["size"], r["block_claimed"], r["isolated"]) for r in rows] == [
        (0, 2, 2, False),
        (0, 2, 2, False),
        (1, 1, 1, True),
        (2, 1, 1, True),
    ]
    assert (rows[1]["block"]["first"], rows[1]["block"]["last"], rows[3]["block"]["first"]) == (0, 1, 3)
    assert rows[0]["gap"] == pytest.approx((3.9 - 2.0) / 3.9, rel=1e-6)  # float32 spectrum
    assert rows[2]["gap"] == pytest.approx(min((3.9 - 2.0) / 3.9, (2.0 - 1.0) / 2.0), rel=1e-6)


def test_read_side_readout_against_embeddings(tiny_dirs):
    """q readout: tokens whose normed embedding has the largest projection on u_k, by brute force."""
    from lit_svd.analysis.readouts import readouts
    from lit_svd.models.loading import load_causal_lm

    model, tok = load_causal_lm(tiny_dirs["llama"])
    view = make_view(model)
    comp = build_components(view, ["q"], layers=[1])[0]
    (row,) = readouts(view, comp, [comp.address(2, 1)], tok, top_k=5)
    E = view.W_E.float()
    x = E * torch.rsqrt(E.pow(2).mean(-1, keepdim=True) + view.norm_affine("attn", 1).eps)
    score = x @ comp.U[2, 1:, 1]
    assert row["plus"] == [tok.decode([t]) for t in score.topk(5).indices.tolist()]
    assert row["minus"] == [tok.decode([t]) for t in (-score).topk(5).indices.tolist()]


def test_a_different_test_split_fails_in_one_line(tiny_dirs, tmp_path):
    run = _mask_run(tmp_path / "run", tiny_dirs["llama"], {"L0.ov": [(0, 0)]})
    with pytest.raises(SystemExit):
        _test("smollm2_ioi_directions.yaml", run, tiny_dirs["llama"], tmp_path / "o", "--data.init_args.seed", "1")
    from lit_svd.modules.direction_check import DirectionCheckModule

    with pytest.raises((ValueError, FileNotFoundError), match="no masks.pt"):
        DirectionCheckModule(run=str(tmp_path))
    with pytest.raises(ValueError, match="no steering_swap"):
        DirectionCheckModule(run=str(run), claims="swap")
    patchable = "^kinds='q' is unknown among the kinds that can be patched; "
    patchable += "choose one of ov, mlp_in, mlp_gate, mlp_out$"
    with pytest.raises(ValueError, match=patchable):
        DirectionCheckModule(run=str(run), kinds=["q"])


def test_max_claims_checks_the_strongest_directions(tiny_dirs, tmp_path):
    keep = {"L0.ov": [(0, 0), (0, 3), (2, 1)], "L1.ov": [(3, 0)]}
    run = _mask_run(tmp_path / "run", tiny_dirs["llama"], keep)
    state = torch.load(run / "masks.pt")
    state["lambdas"]["L0.ov"][0, 3] = 0.5  # the weakest kept direction
    state["lambdas"]["L1.ov"][3, 0] = 0.95  # the strongest
    torch.save(state, run / "masks.pt")
    res = _test(
        "smollm2_ioi_directions.yaml", run, tiny_dirs["llama"], tmp_path / "o", "--model.init_args.max_claims", "2"
    )
    # 0.95 first, then the two at 0.9 by address: L0.ov (0, 0) before (2, 1)
    assert [(r["component"], r["head"], r["direction"]) for r in res["directions"]] == [
        ("L0.ov", 0, 0),
        ("L1.ov", 3, 0),
    ]
    assert res["n_claimed"] == 4 and res["n_directions"] == 2 and res["max_claims"] == 2
    from lit_svd.modules.direction_check import DirectionCheckModule

    everything = DirectionCheckModule(run=str(run))
    assert everything.n_claimed == 4 and sum(len(v) for v in everything.claims.values()) == 4
    with pytest.raises(SystemExit):  # a restricted type: rejected by the config check, before the model loads
        _test(
            "smollm2_ioi_directions.yaml", run, tiny_dirs["llama"], tmp_path / "x", "--model.init_args.max_claims", "0"
        )
