"""EdgeCircuitModule + EdgeCircuitReport on a tiny Llama: the curves equal ``edge_curves`` computed directly from
``attribute`` on the same prompts (the first training prompts scored, the test prompts curved; 1e-6: float32), the
drawn circuit is the graph curve's circuit at the smallest size reaching ``graph_f`` with that size's f, results.json
reads back as its type, the graph files are written, and bad options fail in one line before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lit_svd.analysis.edge_ablation import EdgeAblation
from lit_svd.analysis.edge_attribution import attribute
from lit_svd.analysis.edge_curves import ScoreFile, curve_specs, edge_curves
from lit_svd.analysis.edge_options import PruneOptions, curve_names
from lit_svd.analysis.edge_pruning import pruned_curves
from lit_svd.analysis.edges import EdgeUniverse
from lit_svd.callbacks.edge_circuits import EdgeCircuitReport
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.modules.edge_circuits import EdgeCircuitModule
from lit_svd.results import load_result

DATA = dict(task="ioi", n_train=12, n_val=2, n_test=6, batch_size=3, seed=0, test_last=True)
SIZES = [0.01, 0.1, 0.5, 1.0]


def test_module_curves_equal_the_direct_computation(tiny_dirs, tmp_path):
    model_dir = tiny_dirs["llama"]
    (tmp_path / "scores").mkdir()
    module = EdgeCircuitModule(
        model=model_dir, methods=["directions", "units", "random"], sizes=SIZES, n_attribution=6, graph_f=0.5,
        n_check=2, n_random=3, top_edges=10, scores_dir=str(tmp_path / "scores"),
    )  # fmt: skip
    dm = TaskDataModule(**DATA, tokenizer=model_dir)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, default_root_dir=tmp_path / "out",
        callbacks=[EdgeCircuitReport()],
    )  # fmt: skip
    trainer.test(module, datamodule=dm)
    assert not any((tmp_path / "scores").iterdir())  # the score and gain files are gone with the test
    result = load_result(tmp_path / "out")
    names = curve_names(["directions", "units", "random"], ["raw", "fair"], [0])
    assert result.experiment == "edge_circuits" and set(result.curves) == set(names)
    assert result.n_prompts == 6 and result.n_train_prompts == 6 and len(result.top_edges) == 10
    assert len(result.table()) == len(names) * len(SIZES)
    for name in ("edge_curves.png", "graph.json", "graph.graphml", "circuit.html", "nodes.csv", "graph_edges.csv"):
        assert (tmp_path / "out" / name).is_file(), name

    universe = EdgeUniverse(module.view)
    train = [dm.collate(dm.splits["train"].examples[i : i + 3]) for i in (0, 3)]
    scores = attribute(universe, train, "ioi")
    want, info = edge_curves(EdgeAblation(universe, "ioi"), list(dm.test_dataloader()), curve_specs(universe, scores,
                             names), SIZES)  # fmt: skip
    assert abs(result.m_full - info["m_full"]) <= 1e-6 and abs(result.m_empty - info["m_empty"]) <= 1e-6
    scale = max(1.0, abs(info["m_full"] - info["m_empty"]))
    for name, c in want.items():
        got = result.curves[name]
        assert got["n_edges"] == c.n_edges, name
        assert max(abs(a - b) for a, b in zip(got["metric"], c.metric)) <= 1e-6 * scale, name

    graph = result.graph
    curve = result.curves[module.hparams.graph_curve]
    size = next((s for s, v in zip(curve["sizes"], curve["values"]) if v >= 0.5), 1.0)
    assert graph["size"] == size and graph["f"] == curve["values"][curve["sizes"].index(size)]
    assert len(graph["checks"]) == 2
    drawn = json.loads((tmp_path / "out" / "graph.json").read_text())
    assert sum(e["n_kept"] for e in drawn["edges"]) == graph["n_edges"]  # every kept direction edge is drawn
    page = (tmp_path / "out" / "circuit.html").read_text()
    assert f"f = {graph['f']:.3f}" in page


@pytest.mark.parametrize("order", ["headblocks", "netblocks", "perweight"])
def test_block_ranking_curves_of_the_module_equal_edge_curves_own(tiny_dirs, tmp_path, order):
    """A block ranking as a module option (``headblocks``; ``netblocks`` / ``perweight``: scores times their block's
    net-over-gross ratio / edge count; signed on the fair axis, absolute on the raw axis): its curves equal
    ``edge_curves`` of ``curve_specs`` on the same scores and prompts, exactly (float64 model; both through score and
    gain files)."""
    names = [f"{order}_signed_fair", f"{order}_abs_raw", "units_signed_raw", "units_abs_raw", "random_directions_0"]
    module = run_module(tiny_dirs["llama"], tmp_path / "out", methods=[order, "units", "random"], curves=names,
                        graph_curve=f"{order}_signed_fair", graph_f=-1e9, dtype="float64")  # fmt: skip
    result = load_result(tmp_path / "out")
    assert list(result.curves) == names and result.graph["drawn"] and result.graph["size"] == SIZES[0]
    vs = module.summary["vs_units"]
    assert set(vs) == {f"{order}_signed_fair", f"{order}_abs_raw"}
    assert vs[f"{order}_signed_fair"]["units_cpr"] == result.curves["units_signed_raw"]["cpr"]
    assert vs[f"{order}_abs_raw"]["cmd"] == result.curves[f"{order}_abs_raw"]["cmd"]
    for name, c in result.curves.items():  # the per-prompt metrics average to the curve's; intervals around it
        per_prompt = torch.tensor(c["prompt_metric"], dtype=torch.float64)
        assert per_prompt.mean(1).tolist() == pytest.approx(c["metric"], abs=1e-12), name
        assert c["cpr_ci"][0] <= c["cpr_ci"][1] and c["cmd_ci"][0] <= c["cmd_ci"][1], name
    lo, hi = vs[f"{order}_signed_fair"]["cpr_diff_ci"]
    assert lo <= hi and vs[f"{order}_abs_raw"]["cmd_diff_ci"][0] <= vs[f"{order}_abs_raw"]["cmd_diff_ci"][1]

    universe = EdgeUniverse(module.view)
    dm = TaskDataModule(**DATA, tokenizer=tiny_dirs["llama"])
    train = [dm.collate(dm.splits["train"].examples[i : i + 3]) for i in (0, 3)]
    store, gains = ScoreFile(universe, tmp_path), ScoreFile(universe, tmp_path, "gains")
    scores = attribute(universe, train, "ioi", store=store, gains=gains)
    specs = curve_specs(universe, scores, names)
    want, info = edge_curves(EdgeAblation(universe, "ioi", gains=gains), list(dm.test_dataloader()), specs, SIZES)
    assert (result.m_full, result.m_empty) == (info["m_full"], info["m_empty"])
    for name, c in want.items():
        got = result.curves[name]
        assert got["n_edges"] == c.n_edges and got["metric"] == c.metric, name
    assert want[f"{order}_signed_fair"].metric != want["random_directions_0"].metric  # not one curve twice


def test_pruned_curves_of_the_module_equal_pruned_curves_own(tiny_dirs, tmp_path):
    """Edge pruning as a module option (``pruned``, ``prunedirs``): its curves (and the graph of the signed
    head-level one) equal ``edge_pruning.pruned_curves`` on the same scores, training prompts and test prompts,
    exactly (float64 model; the direction options passed through); results.json holds each run's objective per step;
    the random curves are head-level (``pruned``) and direction-level (``prunedirs``)."""
    names = ["pruned_signed_raw", "pruned_abs_raw", "prunedirs_signed_fair", "prunedirs_abs_fair",
             "units_signed_raw", "units_abs_raw", "random_units_0", "random_directions_0"]  # fmt: skip
    methods = ["pruned", "prunedirs", "units", "random"]
    assert curve_names(methods, ["raw", "fair"], [0]) == names
    module = run_module(tiny_dirs["llama"], tmp_path / "out", methods=methods,
                        graph_curve="pruned_signed_raw", graph_f=-1e9, dtype="float64", prune_steps=3,
                        prune_prompts=4, prune_keep=0.3, prune_lr=0.2, prune_direction_order="min",
                        prune_direction_start=0.7, prune_chunk=3,
                        prune_direction_step="proportional", prune_direction_lr=0.4)  # fmt: skip
    result = load_result(tmp_path / "out")
    assert list(result.curves) == names and result.graph["drawn"] and result.graph["curve"] == "pruned_signed_raw"
    assert set(result.pruning) == set(names[:4])
    assert len(result.pruning["pruned_abs_raw"]["objective"]) == 3 and result.pruning["pruned_abs_raw"]["prompts"] == 4
    assert result.pruning["pruned_abs_raw"]["chunk"] == 3
    assert len(result.pruning["prunedirs_abs_fair"]["readers_kept"]) == 3
    assert result.pruning["prunedirs_abs_fair"]["direction_order"] == "min"
    assert result.pruning["prunedirs_abs_fair"]["direction_start"] == 0.7
    assert result.pruning["prunedirs_abs_fair"]["direction_step"] == "proportional"
    assert result.pruning["prunedirs_abs_fair"]["direction_lr"] == 0.4
    assert set(module.summary["vs_units"]) == set(names[:4]) and set(module.summary["vs_pruned"]) == set(names[2:4])

    universe = EdgeUniverse(module.view)
    dm = TaskDataModule(**DATA, tokenizer=tiny_dirs["llama"])
    train = [dm.collate(dm.splits["train"].examples[i : i + 3]) for i in (0, 3)]
    store, gains = ScoreFile(universe, tmp_path), ScoreFile(universe, tmp_path, "gains")
    scores = attribute(universe, train, "ioi", store=store, gains=gains)
    ablation = EdgeAblation(universe, "ioi", gains=gains)
    batch = dm.collate(dm.splits["train"].examples[:4])
    options = PruneOptions(steps=3, lr=0.2, keep=0.3, direction_order="min", direction_start=0.7,
                           direction_step="proportional", direction_lr=0.4)  # fmt: skip
    specs, runs = pruned_curves(ablation, batch, scores.units, names[:4], options, chunk=3)
    assert all(runs[n]["objective"] == result.pruning[n]["objective"] for n in names[:4])
    want, _ = edge_curves(ablation, list(dm.test_dataloader()), specs, SIZES)
    for name, c in want.items():
        got = result.curves[name]
        assert got["n_edges"] == c.n_edges and got["metric"] == c.metric, name
    assert want["pruned_signed_raw"].metric != result.curves["units_signed_raw"]["metric"]  # trained: not EAP-IG's


def run_module(model_dir, out, **kwargs) -> EdgeCircuitModule:
    module = EdgeCircuitModule(model=model_dir, sizes=SIZES, n_attribution=6, n_check=1, n_random=2, top_edges=5,
                               **kwargs)  # fmt: skip
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, default_root_dir=out,
                         callbacks=[EdgeCircuitReport()])  # fmt: skip
    trainer.test(module, datamodule=TaskDataModule(**DATA, tokenizer=model_dir))
    return module


@pytest.mark.parametrize("unreached", ["skip", "best"])
def test_a_graph_curve_that_misses_graph_f_warns_and_never_draws_another_circuit(tiny_dirs, tmp_path, unreached):
    """Only the curves asked for are scored; a graph_f no size reaches: a warning naming the best f, then no graph
    (skip) or the circuit at the size of the best f (best), said on the page; the page draws at most page_blocks."""
    with pytest.warns(UserWarning, match="graph_curve=directions_abs_fair never reaches graph_f=100.0 \\(best f"):
        run_module(tiny_dirs["llama"], tmp_path, curves=["directions_abs_fair"], graph_curve="directions_abs_fair",
                   graph_f=100.0, graph_unreached=unreached, page_blocks=2)  # fmt: skip
    result = load_result(tmp_path)
    assert list(result.curves) == ["directions_abs_fair"]
    curve = result.curves["directions_abs_fair"]
    best = max(zip(curve["values"], curve["sizes"]), key=lambda t: (t[0], -t[1]))
    graph = result.graph
    assert f"best f {best[0]:.3f} at size {best[1]}" in graph["note"]
    if unreached == "skip":
        assert graph["drawn"] is False and not (tmp_path / "circuit.html").exists()
        return
    assert graph["drawn"] and graph["chosen_by"] == "best" and graph["size"] == best[1] and graph["f"] == best[0]
    drawn = json.loads((tmp_path / "graph.json").read_text())
    assert sum(e["n_kept"] for e in drawn["edges"]) == graph["n_edges"]  # graph.json: every block
    page = (tmp_path / "circuit.html").read_text()
    assert f"f = {graph['f']:.3f}" in page and "its largest f: no size reaches 100.0" in page
    assert len(drawn["edges"]) <= 2 or f"of the {len(drawn['edges']):,} blocks" in page
    assert page.count('<path class="edge"') <= 2 + len(graph["checks"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"methods": ["heads"]}, "methods: 'heads' unknown"),
        ({"axes": []}, "axes=\\[\\]"),
        ({"graph_curve": "units_signed_fair"}, "graph_curve='units_signed_fair' is not one of the curves"),
        ({"methods": ["random"], "random_seeds": []}, "random_seeds is empty"),
        ({"steps": 0}, "steps=0"),
        ({"n_random": 1}, "n_random=1"),
        ({"graph_size": 0.3}, "graph_size=0.3"),
        ({"fold_norms": False}, "fold_norms=False: the edge universe reads the folded view"),
        ({"curves": ["directions_abs_raw"], "axes": ["fair"]}, "curves: 'directions_abs_raw' is not one of"),
        ({"curves": ["units_abs_raw"]}, "graph_curve='directions_abs_fair' is not one of the curves: units_abs"),
        ({"curves": []}, "curves=\\[\\]"),
        ({"graph_unreached": "largest"}, "graph_unreached='largest': allowed: skip, best"),
        ({"page_blocks": 0}, "page_blocks=0"),
        ({"methods": ["headblock"]}, "methods: 'headblock' unknown; allowed: directions, writer_units, units, blocks"),
        ({"curves": ["headblocks_signed_fair"]}, "curves: 'headblocks_signed_fair' is not one of the options' curves"),
        ({"methods": ["headblocks"], "curves": ["headblocks_signed_fiar"]}, "curves: 'headblocks_signed_fiar' is not"),
        ({"methods": ["directions", "headblocks"], "graph_curve": "blocks_abs_fair"}, "graph_curve='blocks_abs_fair'"),
        ({"methods": ["netblocks"], "curves": ["netblocks_abs_fiar"]}, "curves: 'netblocks_abs_fiar' is not one of"),
        ({"methods": ["pruned"], "curves": ["pruned_abs_fair"]}, "curves: 'pruned_abs_fair' is not one of"),
        ({"prune_keep": 1.0}, "prune_keep=1.0"),
        ({"prune_steps": 0}, "prune_steps=0"),
        ({"prune_direction_order": "max"}, "prune_direction_order='max': allowed: blocks, min"),
        ({"prune_chunk": 0}, "prune_chunk=0"),
        ({"prune_direction_step": "sgd"}, "prune_direction_step='sgd': allowed: adam, proportional"),
        ({"prune_direction_lr": -1.0}, "prune_direction_lr=-1.0: need > 0"),
    ],
)
def test_bad_options_fail_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EdgeCircuitModule(model="no-such-model-is-loaded", **kwargs)


def test_bad_options_fail_before_torch_on_the_command_line(capsys):
    """The command line's fast check (before torch is imported) runs the module's own check."""
    from lit_svd.config_check import check_command_line

    config = Path(__file__).resolve().parents[1] / "configs/edge_circuits/smollm2_ioi.yaml"
    check_command_line(["test", "--config", str(config)])  # the shipped config passes
    with pytest.raises(SystemExit) as err:
        check_command_line(["test", "--config", str(config), "--model.init_args.n_random", "1"])
    assert err.value.code == 2 and "n_random=1: must be an integer >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:  # edge pruning's options: judged by PruneOptions, named as the module's
        check_command_line(["test", "--config", str(config), "--model.init_args.prune_keep", "1.5"])
    assert err.value.code == 2 and "prune_keep=1.5: need each 0 < keep < 1" in capsys.readouterr().err
