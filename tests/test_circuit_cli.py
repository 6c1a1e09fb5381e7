"""``python -m lit_svd test --config configs/circuits/<model>_<task>.yaml`` end to end on a tiny Llama: every output
file is written and agrees with results.json; the shipped configs parse; bad options stop before the model loads.
Needs ``lit_svd.modules.circuits`` (the graph module)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import networkx as nx
import pytest
import yaml
from test_circuit_config import in_process, no_model  # noqa: F401  (a fixture)
from test_circuit_outputs import _Page

from lit_svd.cli import main
from lit_svd.results import CircuitResult, load_result

pytest.importorskip("lit_svd.modules.circuits")

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "circuits"
NAMES = ("smollm2_ioi", "smollm2_gp", "smollm2_gt", "gemma3_270m_ioi")
SMALL = {  # a tiny run: 8 test prompts in two batches, 4 edges checked against 4 random readers
    "--data.init_args.n_train": "0",
    "--data.init_args.n_val": "0",
    "--data.init_args.n_test": "8",
    "--data.init_args.batch_size": "4",
    "--model.init_args.n_check": "4",
    "--model.init_args.n_random": "4",
    "--model.init_args.threshold": "0.1",
    "--trainer.enable_progress_bar": "false",
}


@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_configs_parse(capsys, name):
    with pytest.raises(SystemExit) as code:
        main(["test", "--config", str(CONFIGS / f"{name}.yaml"), "--print_config"])
    assert code.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["model"]["class_path"] == "lit_svd.modules.circuits.CircuitGraphModule"
    args = cfg["model"]["init_args"]
    assert args["model"] == ("gemma3-270m" if name.startswith("gemma") else "smollm2-135m")
    assert (args["threshold"], args["depth"], args["readers"], args["unit"]) == (0.002, 2, ["qk", "ov"], "direction")
    assert cfg["data"]["init_args"]["task"] == name.rsplit("_", 1)[1] and cfg["data"]["init_args"]["n_test"] == 128
    assert [c["class_path"] for c in cfg["trainer"]["callbacks"]] == ["lit_svd.callbacks.circuits.CircuitReport"]


@pytest.mark.parametrize(
    "args,text",
    [
        (["--model.init_args.threshold", "2"], "threshold=2.0: must lie in (0, 1)"),
        (["--model.init_args.depth", "31"], "depth=31: must be an integer in 1 .. 30 (the model's layers)"),
        (["--model.init_args.readers", "[mlp]"], "readers: 'mlp' is not a reader kind"),
    ],
)
def test_the_shipped_config_fails_before_the_model_loads(capsys, no_model, args, text):  # noqa: F811
    lines = in_process(capsys, "test", "--config", str(CONFIGS / "smollm2_ioi.yaml"), *args)
    assert 1 <= len(lines) <= 2 and text in lines[0], lines


def mask_run(folder: Path, model_dir: str) -> tuple[Path, set]:
    """A finished mask run's masks.pt over every OV map of the tiny model, keeping every even direction."""
    import torch

    from lit_svd.models import view as make_view
    from lit_svd.models.intervene import build_components
    from lit_svd.models.loading import load_causal_lm

    view = make_view(load_causal_lm(model_dir)[0])
    lambdas = {c.name: torch.full(c.shape, 1e-4) for c in build_components(view, ["ov"])}
    kept = set()
    for name, lam in lambdas.items():
        lam[:, ::2] = 0.9
        kept |= {(int(name.split(".")[0][1:]), g, k) for g in range(lam.shape[0]) for k in range(0, lam.shape[1], 2)}
    folder.mkdir(parents=True)
    torch.save({"lambdas": lambdas, "threshold": 1e-3, "model": model_dir}, folder / "masks.pt")
    return folder, kept


def test_a_tiny_llama_run_writes_every_output(tiny_dirs, tmp_path):
    model = tiny_dirs["llama"]
    masks, kept = mask_run(tmp_path / "masks", model)
    out = tmp_path / "out"
    args = ["test", "--config", str(CONFIGS / "smollm2_ioi.yaml"), "--trainer.default_root_dir", str(out)]
    args += ["--model.init_args.model", model, "--data.init_args.tokenizer", model]
    args += ["--trainer.callbacks.init_args.mask_run", str(masks)]
    main(args + [x for kv in SMALL.items() for x in kv])
    (folder,) = {p.parent for p in out.rglob("results.json")}
    names = {p.name for p in folder.iterdir()}
    assert {"results.json", "edges.csv", "nodes.csv", "graph.json", "graph.graphml", "circuit.html"} <= names
    assert "circuit_graph.png" in names
    res = load_result(folder)
    assert isinstance(res, CircuitResult) and res.n_prompts == 8 and res.task == "ioi" and res.edges
    assert res.counts["edges"] == len(res.edges) and 0 < res.counts["checked"] <= 4
    assert res.options["threshold"] == 0.1 and res.metric["gap"] == pytest.approx(
        res.metric["clean"] - res.metric["corrupted"]
    )
    keys = sorted((e["writer"], e["reader"], e["reader_kind"]) for e in res.edges)
    addresses = sorted(n["address"] for n in res.nodes)
    assert {k for e in keys for k in e[:2]} == set(addresses)  # every node is on an edge
    # graph.json: the same nodes and edges as results.json
    graph = json.loads((folder / "graph.json").read_text())
    assert graph["nodes"] == res.to_dict()["nodes"] and graph["edges"] == res.to_dict()["edges"]
    # GraphML: the same graph
    g = nx.read_graphml(folder / "graph.graphml", force_multigraph=True)
    assert sorted(g.nodes) == addresses and sorted(g.edges(keys=True)) == keys
    for e in res.edges:
        assert g.edges[e["writer"], e["reader"], e["reader_kind"]]["weight"] == pytest.approx(e["weight"], rel=1e-12)
    # CSV: one row per edge, the weights of results.json
    with open(folder / "edges.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["writer"], r["reader"], r["reader_kind"]) for r in rows] == [
        (e["writer"], e["reader"], e["reader_kind"]) for e in res.edges
    ]
    assert [float(r["weight"]) for r in rows] == pytest.approx([e["weight"] for e in res.edges], rel=1e-12)
    # the page: every node and edge drawn, nothing loaded from anywhere
    page = (folder / "circuit.html").read_text()
    parser = _Page()
    parser.feed(page)
    assert sorted(parser.svg_nodes) == addresses and sorted(parser.svg_edges) == keys
    assert parser.urls == [] and "http://" not in page and "https://" not in page
    # agreement with the mask run: the graph's OV direction nodes among its kept directions, counted here
    (row,) = res.agreement
    ov = {(n["layer"], n["group"], n["index"]) for n in res.nodes if n["kind"] == "ov"}
    assert row["source"] == "mask" and row["units"] == 2 * 4 * 16 and row["n_source"] == len(kept) == 64
    assert (row["n_graph"], row["overlap"]) == (len(ov), len(ov & kept))
    assert row["expected"] == pytest.approx(len(ov) * 64 / 128)
