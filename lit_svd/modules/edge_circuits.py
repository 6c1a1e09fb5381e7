"""EdgeCircuitModule: edge circuits between directions on one task (docs/circuits.md, "Edge circuits"), for ``test``
(``python -m lit_svd test --config configs/edge_circuits/<model>_<task>.yaml``).

At the start of ``test`` it scores every edge with EAP-IG (``analysis.edge_attribution``) on the first
``n_attribution`` prompts of the data module's *training* split; each test batch is kept; at the end of the epoch
every curve (``analysis.edge_curves``: the rankings at each level, signed and absolute, on the raw and the fair
axis, and random circuits) is scored on the test batches under the edge ablation, and the circuit of one curve at
one size (``graph_curve``; ``graph_size`` or the smallest grid size whose ``f`` reaches ``graph_f``) is turned
into the circuit graph with the causal check of its strongest edges (``analysis.edge_graph``). A curve that never
reaches ``graph_f`` draws nothing (``graph_unreached: skip``) or its best size (``best``), with a warning naming the
best f either way.

What the report callback reads (``callbacks/edge_circuits.py``; it never runs the model): ``curves`` (``{name: curve
row}``), ``summary``, ``facts`` (task, model, prompts, counts, m_full, m_empty, options), ``top_edges``, ``timing``
``graph`` (the circuit graph's nodes, edges and checks, or None) and ``graph_note`` (why no graph was drawn, or
None).

One process: the scores of every direction edge (~10^9 on SmolLM2) stay in one memory-mapped file; under DDP the
module refuses to run.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from tqdm.auto import tqdm

from lit_svd.analysis.area_intervals import paired_differences
from lit_svd.analysis.edge_ablation import EdgeAblation
from lit_svd.analysis.edge_attribution import STEPS, EdgeScores, attribute
from lit_svd.analysis.edge_curves import LEVELS, CurveSpec, ScoreFile, curve_specs, edge_curves, exit_on_sigterm
from lit_svd.analysis.edge_graph import GRAPH_F, PAGE_BLOCKS, check_edges, choose_size, circuit_graph, top_edges
from lit_svd.analysis.edge_options import (
    DIRECTION_ORDERS,
    Axis,
    CutOrder,
    DirectionStep,
    Method,
    PruneOptions,
    Unreached,
    check_edge_options,
    curve_names,
    step_line,
)
from lit_svd.analysis.edge_pruning import OBJECTIVE_OF, pruned_curves
from lit_svd.analysis.edges import EdgeUniverse
from lit_svd.analysis.faithfulness import MIB_SIZES, check_sizes
from lit_svd.modules.pretrained import PretrainedLMModule


class EdgeCircuitModule(PretrainedLMModule):
    """EAP-IG edge circuits between directions, their MIB curves and the graph of one circuit.

    Args:
        methods: edge levels ranked by EAP-IG: directions (reader direction x writer direction), writer_units
            (reader direction x writer unit), units (reader unit x writer unit: MIB's head-level edges); block
            rankings of direction edges (``edge_curves.block_ranking``; curves ``<order>_<signed|abs>_<axis>``):
            blocks, headblocks (blocks by head-level EAP-IG, the signed direction curve of the shipped configs),
            coreblocks; netblocks (direction edges by score times their block's net-over-gross ratio),
            perweight (by score per unit of weighted edge count, ``|s_e| K_w K_r``; both
            ``edge_curves.factor_ranking``); pruned: head-level edges ranked by edge pruning (``edge_pruning``:
            ``pruned_signed_raw`` trained on the metric, ``pruned_abs_raw`` on faithfulness, both from the
            head-level EAP-IG scores); prunedirs: direction edges ranked by edge pruning with a
            logit per block, writer direction and reader direction (``prunedirs_signed_fair`` /
            ``prunedirs_abs_fair``, the fair axis); random: random circuits at each ranked level (direction edges
            for a block or factor order and prunedirs, head-level edges for pruned).
        axes: raw (fraction of the level's edges), fair (weighted edge count: a block counts 1).
        curves: the curves scored, a subset of the options' curves (``curve_names``; null: all of them): each
            direction curve costs minutes on SmolLM2.
        random_seeds: one random curve per seed and level.
        sizes: fractions kept (MIB: 0.001 ... 1).
        steps: integrated-gradient steps (MIB: 5).
        n_attribution: training prompts scored (the first of the data module's training split).
        top_edges: strongest direction edges listed in results.json.
        graph_curve: the curve whose circuit is drawn (null: no graph).
        graph_size: the size drawn (null: the smallest grid size whose f reaches graph_f).
        graph_f: the faithfulness the drawn circuit must reach when graph_size is null.
        graph_unreached: when graph_curve never reaches graph_f: skip (no graph) or best (its size of largest f);
            either way a warning names the best f.
        page_blocks: the most blocks drawn on circuit.html (by the sum of |score| of their kept edges; the checked
            ones always), the rest counted on the page; graph.json and graph.graphml hold every block (null: all).
        n_check: strongest edges of the drawn circuit checked (dropped alone, against random edges of their writer).
        n_random: random edges per check.
        seed: seeds the checks' random edges.
        scores_dir: folder of the memory-mapped edge scores (null: a temporary folder; removed at the end).
        prune_steps: edge pruning's steps (one forward and backward of its prompts each).
        prune_prompts: edge pruning's prompts: the first of the training split.
        prune_chunk: edge pruning's prompts per forward and backward (null: all of them; smaller takes less memory
            for the same gradient).
        prune_keep: the fraction of head-level edges edge pruning trains as its circuit (a list: nested circuits
            trained together, the loss their mean).
        prune_lr: edge pruning's Adam learning rate on the block logits.
        prune_direction_order: prunedirs' curve order (``edge_pruning.order_cut``): blocks (the trained directions
            held, the blocks cut; chosen on SmolLM2 IOI's validation split) or min (one cut of every logit); with
            several prune_keep the smaller nested circuits are trained in it too.
        prune_direction_start: prunedirs' writer and reader logits at the start (above 0: every direction kept,
            step 0 the head-level circuit).
        prune_direction_step: how prunedirs' writer and reader logits step: adam (each logit's own normalised step)
            or proportional (each step proportional to the logit's gradient, the largest prune_direction_lr per
            step).
        prune_direction_lr: prunedirs' rate of the writer and reader logits (null: prune_lr).
        loading: the model's loading options (``PretrainedLMModule``'s; ``fold_norms`` must stay true).
    """

    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.edge_options:check_edge_options"

    def __init__(
        self,
        methods: Sequence[Method] = ("directions", "units", "random"),
        axes: Sequence[Axis] = ("raw", "fair"),
        random_seeds: Sequence[int] = (0,),
        sizes: Sequence[float] = MIB_SIZES,
        steps: int = STEPS,
        n_attribution: int = 64,
        top_edges: int = 200,
        graph_curve: str | None = "directions_abs_fair",
        graph_size: float | None = None,
        graph_f: float = GRAPH_F,
        graph_unreached: Unreached = "skip",
        page_blocks: int | None = PAGE_BLOCKS,
        curves: Sequence[str] | None = None,
        n_check: int = 8,
        n_random: int = 16,
        seed: int = 0,
        scores_dir: str | None = None,
        prune_steps: int = 40,
        prune_prompts: int = 16,
        prune_chunk: int | None = None,
        prune_keep: float | Sequence[float] = 0.2,
        prune_lr: float = 0.05,
        prune_direction_order: CutOrder = "blocks",
        prune_direction_start: float = 0.5,
        prune_direction_step: DirectionStep = "adam",
        prune_direction_lr: float | None = None,
        **loading,
    ):
        methods = [methods] if isinstance(methods, str) else list(methods)
        axes = [axes] if isinstance(axes, str) else list(axes)
        curves = [curves] if isinstance(curves, str) else None if curves is None else list(curves)
        check_edge_options(methods, axes, random_seeds, graph_curve, steps, n_attribution, top_edges, n_check,
                           n_random, loading.get("fold_norms"), curves, graph_unreached, page_blocks, prune_steps,
                           prune_prompts, prune_keep, prune_lr, prune_direction_order, prune_chunk,
                           prune_direction_step, prune_direction_lr)  # fmt: skip
        sizes = check_sizes(sizes)
        if graph_size is not None and graph_size not in sizes:
            raise ValueError(f"graph_size={graph_size}: must be one of sizes {sizes}")
        super().__init__(**loading)
        self.save_hyperparameters()
        self.sizes, self.methods, self.axes = sizes, methods, axes
        self.names = curves if curves is not None else curve_names(methods, axes, random_seeds)
        self.task: str | None = None
        self.kept: list[dict] = []
        self.curves: dict[str, dict] = {}
        self.summary: dict = {}
        self.facts: dict = {}
        self.timing: dict = {}
        self.top: list[dict] = []
        self.graph: dict | None = None
        self.graph_note: str | None = None
        self.scores: EdgeScores | None = None
        self.pruned: dict[str, CurveSpec] = {}
        self.pruning: dict[str, dict] = {}

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        self.task = getattr(getattr(dm, "task", None), "name", None)
        if self.task is None:
            raise ValueError("edge circuits need task prompts (ioi, gp or gt): use lit_svd.datamodules.tasks")
        if self.trainer.world_size > 1:
            raise ValueError("edge circuits run in one process (the edge scores stay in one file); set devices: 1")
        n_train = len(dm.splits["train"])
        pruned = any(n in OBJECTIVE_OF for n in self.names)
        for key in ("n_attribution", "prune_prompts") if pruned else ("n_attribution",):
            if n_train < self.hparams[key]:
                raise ValueError(
                    f"{key}={self.hparams[key]} but the data module's training split has {n_train} prompts; lower"
                    f" {key} or raise data.n_train"
                )

    def on_test_start(self) -> None:
        hp, dm = self.hparams, self.trainer.datamodule
        self._start = time.monotonic()
        with torch.inference_mode(False):  # Lightning tests in inference mode; the attribution takes gradients
            self.universe = EdgeUniverse(self.view)
        self.timing["universe_s"] = time.monotonic() - self._start
        examples = dm.splits["train"].examples[: hp.n_attribution]
        size = dm.batch_size
        batches = [self._to_device(dm.collate(examples[i : i + size])) for i in range(0, len(examples), size)]
        start = time.monotonic()
        self._sigterm = exit_on_sigterm()  # SIGTERM unwinds (and removes the score files) until the test ends
        self._sigterm.__enter__()
        self.store = ScoreFile(self.universe, hp.scores_dir)
        self.gains = ScoreFile(self.universe, hp.scores_dir, "gains")
        with torch.inference_mode(False), torch.enable_grad():
            batches = [{k: v.clone() if isinstance(v, Tensor) else v for k, v in b.items()} for b in batches]
            self.scores = attribute(self.universe, batches, self.task, hp.steps, store=self.store, gains=self.gains)
        self.timing["attribution_s"] = time.monotonic() - start
        self.timing["scores_gb"] = self.store.nbytes / 2**30
        names = [n for n in self.names if n in OBJECTIVE_OF]
        if names:  # edge pruning from the head-level scores, on the first training prompts
            start = time.monotonic()
            batch = self._to_device(dm.collate(dm.splits["train"].examples[: hp.prune_prompts]))
            options = PruneOptions(steps=hp.prune_steps, lr=hp.prune_lr, keep=hp.prune_keep,
                                   direction_start=hp.prune_direction_start,
                                   direction_order=hp.prune_direction_order,
                                   direction_step=hp.prune_direction_step,
                                   direction_lr=hp.prune_direction_lr)  # fmt: skip
            ablation = EdgeAblation(self.universe, self.task, gains=self.gains)
            bar = tqdm(total=len(names) * hp.prune_steps, desc="edge pruning", disable=not self._is_zero())

            def step(name: str, i: int, objective: float) -> None:  # each step's objective on the bar
                bar.set_postfix_str(step_line(name, i, objective), refresh=False)
                bar.update()

            with torch.inference_mode(False), torch.enable_grad(), bar:
                batch = {k: v.clone() if isinstance(v, Tensor) else v for k, v in batch.items()}
                self.pruned, self.pruning = pruned_curves(
                    ablation, batch, self.scores.units, names, options, bar.write, chunk=hp.prune_chunk, on_step=step
                )
            self.timing["pruning_s"] = time.monotonic() - start

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in batch.items()}

    @torch.no_grad()
    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.kept.append(batch)

    def on_test_end(self) -> None:
        # the score files go as soon as the test is over (after an exception: as the process exits, SIGTERM included)
        for name in ("store", "gains"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
                setattr(self, name, None)
        if getattr(self, "_sigterm", None) is not None:
            self._sigterm.__exit__(None, None, None)
            self._sigterm = None

    def on_test_epoch_end(self) -> None:
        hp = self.hparams
        assert self.scores is not None
        u = self.universe
        ablation = EdgeAblation(u, self.task, gains=self.gains)
        specs = self._specs(self.names)
        start = time.monotonic()
        curves, info = edge_curves(ablation, self.kept, specs, self.sizes)
        self.timing["curves_s"] = time.monotonic() - start
        self.curves = {name: c.row() for name, c in curves.items()}
        self.summary = summarize(self.curves, info)
        self.top = top_edges(self.scores, hp.top_edges)
        if hp.graph_curve is not None:
            start = time.monotonic()
            self.graph = self._graph(ablation)
            self.timing["graph_s"] = time.monotonic() - start
        self.facts = {
            "task": self.task,
            "model": self.model_name,
            "n_prompts": info["n_prompts"],
            "n_train_prompts": self.scores.prompts,
            "steps": hp.steps,
            "counts": u.counts(),
            "m_full": info["m_full"],
            "m_empty": info["m_empty"],
            "options": {
                k: hp[k]
                for k in (
                    "methods",
                    "axes",
                    "random_seeds",
                    "sizes",
                    "n_attribution",
                    "graph_curve",
                    "graph_size",
                    "graph_f",
                    "graph_unreached",
                    "page_blocks",
                    "curves",
                    "n_check",
                    "n_random",
                    "seed",
                    "prune_steps",
                    "prune_prompts",
                    "prune_chunk",
                    "prune_keep",
                    "prune_lr",
                    "prune_direction_order",
                    "prune_direction_start",
                    "prune_direction_step",
                    "prune_direction_lr",
                )
            },  # fmt: skip
        }
        if self.pruning:
            self.facts["pruning"] = self.pruning
        self.timing["total_s"] = time.monotonic() - self._start
        self.timing["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        self.kept = []
        self.scores = None

    def _specs(self, names: Sequence[str]) -> dict[str, CurveSpec]:
        """The curves ``names``: EAP-IG's rankings and random circuits (``curve_specs``), edge pruning's (trained at
        the start of the test)."""
        assert self.scores is not None
        specs = curve_specs(self.universe, self.scores, [n for n in names if n not in OBJECTIVE_OF])
        return {n: self.pruned[n] if n in OBJECTIVE_OF else specs[n] for n in names}

    def _graph(self, ablation: EdgeAblation) -> dict | None:
        """The graph of ``graph_curve``'s circuit at the size ``choose_size`` picks (None: none drawn, the reason in
        ``graph_note``), with its own f, counts and how the size was chosen."""
        hp = self.hparams
        assert self.scores is not None
        row = self.curves[hp.graph_curve]
        size, chosen_by, note = choose_size(hp.graph_curve, row, hp.graph_size, hp.graph_f, hp.graph_unreached)
        self.graph_note = note
        if note is not None:
            rank_zero_warn(note)
        if size is None:
            return None
        circuit = self._specs([hp.graph_curve])[hp.graph_curve].circuits([size])[0]
        i = self.sizes.index(size)
        checks = check_edges(ablation, self.kept, circuit[0], self.scores, hp.n_check, hp.n_random, hp.seed)
        graph = circuit_graph(self.universe, self.scores, circuit[0], checks)
        graph.update(curve=hp.graph_curve, size=size, f=row["values"][i], n_edges=row["n_edges"][i],
                     weighted=row["weighted"][i], f_target=hp.graph_f, chosen_by=chosen_by, note=note)  # fmt: skip
        return graph


def summarize(curves: dict[str, dict], info: dict | None = None) -> dict:
    """Per curve CPR and CMD; per ranked level or block order against the head-level edges (``cpr``: signed,
    ``cmd``: absolute); ``vs_units``: every signed curve's CPR and every absolute curve's CMD against the head-level
    edges' own (the configs' signed and absolute direction curves are of different orders); the random curves'
    mean. With ``info`` (``edge_curves``' per-prompt ends) every comparison carries the 95 % bootstrap interval of
    its difference, paired over the prompts (``cpr_diff_ci``: the curve's minus the head-level edges'; likewise
    ``cmd_diff_ci``)."""
    out: dict = {"curves": {n: {"cpr": c["cpr"], "cmd": c["cmd"]} for n, c in curves.items()}}
    units_cpr = curves.get("units_signed_raw", {}).get("cpr")
    units_cmd = curves.get("units_abs_raw", {}).get("cmd")
    diff = paired_differences(curves, info)
    vs_units = {}
    for name, c in curves.items():
        if name.startswith(("units_", "random_")):
            continue
        if "_signed_" in name and units_cpr is not None:
            vs_units[name] = {"cpr": c["cpr"], "units_cpr": units_cpr, "cpr_at_least_units": c["cpr"] >= units_cpr}
            vs_units[name] |= diff(name, "units_signed_raw", "cpr")
        if "_abs_" in name and units_cmd is not None:
            vs_units[name] = {"cmd": c["cmd"], "units_cmd": units_cmd, "cmd_at_most_units": c["cmd"] <= units_cmd}
            vs_units[name] |= diff(name, "units_abs_raw", "cmd")
    if vs_units:
        out["vs_units"] = vs_units
    for sign, key in (("signed", "cpr"), ("abs", "cmd")):  # edge pruning: directions against head-level blocks
        name, anchor = f"prunedirs_{sign}_fair", f"pruned_{sign}_raw"
        if name in curves and anchor in curves:
            out.setdefault("vs_pruned", {})[name] = {key: curves[name][key], "pruned": curves[anchor][key]}
            out["vs_pruned"][name] |= diff(name, anchor, key)
    for level in LEVELS[:2] + DIRECTION_ORDERS:
        for axis in ("fair", "raw"):
            cpr, cmd = curves.get(f"{level}_signed_{axis}"), curves.get(f"{level}_abs_{axis}")
            if cpr is None or cmd is None or units_cpr is None or units_cmd is None:
                continue
            out[f"{level}_vs_units_{axis}"] = {
                "cpr": cpr["cpr"], "units_cpr": units_cpr, "cpr_at_least_units": cpr["cpr"] >= units_cpr,
                "cmd": cmd["cmd"], "units_cmd": units_cmd, "cmd_at_most_units": cmd["cmd"] <= units_cmd,
            }  # fmt: skip
            out[f"{level}_vs_units_{axis}"] |= diff(f"{level}_signed_{axis}", "units_signed_raw", "cpr")
            out[f"{level}_vs_units_{axis}"] |= diff(f"{level}_abs_{axis}", "units_abs_raw", "cmd")
    for level in LEVELS:
        rows = [c for n, c in curves.items() if n.startswith(f"random_{level}_")]
        if rows:
            out[f"random_{level}"] = {
                "cpr_mean": sum(c["cpr"] for c in rows) / len(rows),
                "cmd_mean": sum(c["cmd"] for c in rows) / len(rows),
                "seeds": len(rows),
            }
    return out
