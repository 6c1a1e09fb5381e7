"""FaithfulnessModule: faithfulness curves of several rankings of a model's directions on one task's test prompts,
for ``test`` (``lit_svd.analysis.faithfulness``; docs/circuits.md, "Faithfulness").

The rankings (``methods``):

* attribution patching, computed at the start of ``test`` on the first ``attribution_prompts`` prompts of the
  ``attribution_split`` (the training split by default: never the test prompts the curves are scored on):
  ``eap_ig`` and ``eap`` (every direction, ``analysis.direction_attribution``: EAP-IG with ``ig_steps`` points
  along ``ig_path``, EAP at the clean run; both from one set of backwards, EAP being EAP-IG's point 1),
  ``eap_ig_fair`` and ``eap_fair`` (the same attributions divided by each direction's fair-size weight: the
  most attribution per unit of fair size first),
  ``eap_ig_units`` and ``eap_ig_mixed`` (one merged order per unit of fair size over whole units and single
  directions, ``rankings.unit_rankings``: ``eap_ig_units`` keeps every head, KV head and MLP layer whole, by its
  summed EAP-IG, its directions by their own; ``eap_ig_mixed`` keeps MLP layers whole, by head-level EAP-IG, and
  ranks the attention directions singly; ``eap_ig_hybrid`` is ``eap_ig_units`` with each MLP layer scored by
  head-level EAP-IG, the writer path, ``eap_ig_hybrid_heads`` with each query head and MLP layer so scored
  (chosen on the validation splits of SmolLM2 and Gemma-3 IOI, docs/circuits.md)),
  ``eap_ig_heads`` (head-level EAP-IG on the same code path, the head and MLP outputs interpolated; a head's
  score is the sum over its OV directions), ``eap_heads`` (head-level EAP, ``analysis.attribution``). Each is
  ranked twice, signed (``<method>/signed``: scored by CPR) and by magnitude (``<method>/absolute``: scored by
  CMD), as MIB does; a head ranking brings whole heads and MLPs (``rankings.eap_ranking``).
* ``mask`` (a finished mask run's lambdas, ``mask_run``), ``graph`` / ``graph_mlp`` (a finished circuit-graph
  run's node weights, ``graph_run``): one ranking each; ``random`` (one seeded random order per ``random_seeds``).

Every ranking is scored on both size axes (``raw``: fraction of directions; ``fair``: mean fraction of each
unit's directions). Every batch records the corrupted reference once and runs one patched forward per distinct
(ranking, kept count) plus the full and the empty circuit; every prompt's metrics are torchmetrics list states
gathered over batches and DDP ranks (each prompt with its index in the test split, so that the curves list the
prompts in one order whatever the ranks), the curves ratios of means at the end of the epoch with their bootstrap
intervals over the prompts (``faithfulness``: per method ``{"rankings": {ranking: {axis: curve row}}, "cpr": {axis:
...}, "cmd": {axis: ...}}``, ``summary``). With ``eap_ig_heads`` among the methods, ``summary["vs_heads"]`` holds
every other method's CPR (signed) and CMD (absolute) against head EAP-IG's on the same axis, with the interval of
each difference paired over the prompts (``heads_comparison``).
``callbacks.faithfulness.FaithfulnessReport`` writes them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from lit_svd.analysis.area_intervals import paired_differences
from lit_svd.analysis.attribution import Attributions, batch_attributions
from lit_svd.analysis.direction_attribution import (
    WRITER_KINDS,
    IGPath,
    alphas,
    batch_integrands,
    mean_over_points,
    unit_attributions,
)
from lit_svd.analysis.faithfulness import (
    AXES,
    MIB_SIZES,
    CurvePlan,
    CurveSums,
    Universe,
    batch_sums,
    curves_from_sums,
    fair_weights,
    method_scores,
    plan_curves,
    universe_components,
)
from lit_svd.analysis.faithfulness_options import (
    GRAPH_RANKINGS,
    AttributionSplit,
    Method,
    check_faithfulness_options,
)
from lit_svd.analysis.rankings import (
    UNIT_TYPES,
    attribution_rankings,
    eap_ranking,
    mask_ranking,
    per_weight,
    random_ranking,
    run_graph_ranking,
    unit_rankings,
    writer_unit_scores,
)
from lit_svd.models.patching import CircuitPatch
from lit_svd.modules.pretrained import PretrainedLMModule
from lit_svd.option_checks import check_indices
from lit_svd.runs import load_run

# direction methods: (the attribution they rank, ranked per unit of fair size)
DIRECTION_METHODS = {"eap_ig": ("eap_ig", False), "eap": ("eap", False), "eap_ig_fair": ("eap_ig", True),
                     "eap_fair": ("eap", True)}  # fmt: skip
# whole units and single directions (rankings.unit_rankings): method -> (unit types kept whole, unit types scored by
# head-level EAP-IG's writer path rather than their directions' summed EAP-IG, order within a whole unit)
MIXED_METHODS = {"eap_ig_units": (UNIT_TYPES, (), "score"), "eap_ig_mixed": (("mlp",), ("mlp",), "singular"),
                 "eap_ig_hybrid": (UNIT_TYPES, ("mlp",), "score"),
                 "eap_ig_hybrid_heads": (UNIT_TYPES, ("head", "mlp"), "score")}  # fmt: skip
HEAD_METHODS = ("eap_ig_heads", "eap_heads")
WRITER_METHODS = ("eap_ig_heads", *(m for m, (_, writer, _) in MIXED_METHODS.items() if writer))  # writers' pass
ATTRIBUTION_METHODS = (*DIRECTION_METHODS, *MIXED_METHODS, *HEAD_METHODS)
SIGNED, ABSOLUTE = "signed", "absolute"


class CurveStates(Metric):
    """Every prompt's metric of the full and empty circuits and of every planned circuit (``circuits``: ``[P,
    n_circuits]``, the rankings' circuits one after the other) and its index in the split: list states concatenated
    over batches and, under DDP, over ranks (rank by rank, every state alike, so a prompt's entries stay paired)."""

    full_state_update = False

    def __init__(self, n_circuits: int):
        super().__init__()
        self.n_circuits = n_circuits
        for name in ("full", "empty", "circuits", "index"):
            self.add_state(name, [], dist_reduce_fx="cat")

    def update(self, sums: CurveSums, names: Sequence[str]) -> None:
        self.full.append(sums.full.to(self.device, torch.float64))
        self.empty.append(sums.empty.to(self.device, torch.float64))
        self.circuits.append(torch.cat([sums.circuits[n] for n in names]).T.to(self.device, torch.float64))
        self.index.append(sums.index.to(self.device, torch.long))

    def compute(self) -> dict[str, Tensor]:
        if not len(self.full):  # no prompt on any rank
            return {"full": torch.zeros(0, dtype=torch.float64), "empty": torch.zeros(0, dtype=torch.float64),
                    "circuits": torch.zeros((0, self.n_circuits), dtype=torch.float64),
                    "index": torch.zeros(0, dtype=torch.long)}  # fmt: skip
        return {name: dim_zero_cat(getattr(self, name)) for name in ("full", "empty", "circuits", "index")}


class FaithfulnessModule(PretrainedLMModule):
    """Faithfulness curves (MIB's grid, CPR, CMD, raw and fair size axes) of several rankings of the model's
    directions.

    Args:
        model: the model (default: the mask run's, else the graph run's; its other loading options are
            ``PretrainedLMModule``'s).
        mask_run: folder of a finished direction-mask run (``masks.pt``; ``config.yaml`` for the split check).
        graph_run: folder of a finished circuit-graph run (``results.json`` with ``edges``; ``config.yaml`` for the
            split check).
        methods: rankings to score: ``eap_ig``, ``eap`` (direction attribution patching), ``eap_ig_fair``,
            ``eap_fair`` (the same attributions per unit of fair size, ``rankings.per_weight``), ``eap_ig_units``
            (every head, KV head and MLP whole, by summed EAP-IG per unit of fair size, directions within by their
            own), ``eap_ig_mixed`` (whole MLP layers by head-level EAP-IG and single attention directions, in one
            order per unit of fair size), ``eap_ig_hybrid`` (``eap_ig_units`` with each MLP layer scored by
            head-level EAP-IG), ``eap_ig_hybrid_heads`` (``eap_ig_units`` with each query head and MLP layer scored
            by head-level EAP-IG), ``eap_ig_heads``,
            ``eap_heads`` (head level), ``mask``, ``graph``, ``graph_mlp`` (the graph with its MLP layers' input and
            gate directions, ``analysis.rankings.mlp_input_scores``), ``random``.
        random_seeds: one random ranking per seed (``random_<seed>``).
        sizes: MIB's grid of sizes (fractions, 0.001 ... 1), on both axes.
        layers: layers of the universe (default all).
        attribution_split: the split whose prompts the attribution methods are computed on: ``train`` or ``val``
            (never the test prompts the curves are scored on).
        attribution_prompts: how many prompts of that split (its first ones).
        ig_steps: EAP-IG's interpolation points ``k / ig_steps``, ``k = 1 .. ig_steps`` (MIB: 5).
        ig_path: what EAP-IG interpolates: ``joint`` (every direction's scale at once), ``layer`` (one layer at a
            time), ``inputs`` (the residual entering layer 0, MIB's EAP-IG-inputs); docs/circuits.md.
    """

    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.faithfulness_options:check_faithfulness_options"

    def __init__(
        self,
        model: str | None = None,
        mask_run: str | None = None,
        graph_run: str | None = None,
        methods: Sequence[Method] = ("eap_ig", "eap", "eap_ig_heads", "eap_heads", "random"),
        random_seeds: Sequence[int] = (0, 1, 2),
        sizes: Sequence[float] = MIB_SIZES,
        layers: Sequence[int] | None = None,
        attribution_split: AttributionSplit = "train",
        attribution_prompts: int = 64,
        ig_steps: int = 5,
        ig_path: IGPath = "joint",
        **loading,
    ):
        methods, sizes = check_faithfulness_options(
            mask_run, graph_run, methods, random_seeds, sizes, layers, attribution_split, attribution_prompts,
            ig_steps, ig_path,
        )  # fmt: skip
        masks = load_run(mask_run, need=("masks",), what="direction-mask run").masks if mask_run else None
        if model is None:
            model = masks["model"] if masks else _graph_model(graph_run)
        super().__init__(model=model, **loading)
        check_indices("layers", "layer", layers or (), self.view.n_layers)  # the fast check's line, here too
        self.save_hyperparameters()
        self.sizes, self.methods = sizes, methods
        self.components = universe_components(self.view, layers, progress=True)
        self.universe = Universe(self.components)
        self.weights = fair_weights(self.universe)
        self.patch = CircuitPatch(self.view, self.components)
        self.rankings: dict[str, Tensor] = {}
        self.ranking_info: dict[str, dict] = {}
        if "mask" in methods:
            self.rankings["mask"], self.ranking_info["mask"] = mask_ranking(self.universe, masks)
        for m, mlp_inputs in GRAPH_RANKINGS.items():
            if m in methods:
                self.rankings[m], self.ranking_info[m] = run_graph_ranking(
                    self.universe, graph_run, self.view, mlp_inputs=mlp_inputs
                )
        if "random" in methods:
            for s in random_seeds:
                self.rankings[f"random_{s}"] = random_ranking(len(self.universe), s)
        self.task: str | None = None
        self.plan: CurvePlan | None = None
        self.states: CurveStates | None = None
        self.faithfulness: dict[str, dict] = {}
        self.summary: dict = {}
        self._seconds: dict[str, float] = {}

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        self.task = getattr(getattr(dm, "task", None), "name", None)
        if self.task is None:
            raise ValueError("faithfulness needs task prompts (ioi, gp or gt): use lit_svd.datamodules.tasks")
        hp = self.hparams
        if any(m in self.methods for m in ATTRIBUTION_METHODS):
            have = len(dm.splits[hp.attribution_split])
            if have < hp.attribution_prompts:
                raise ValueError(
                    f"attribution_prompts={hp.attribution_prompts} but the {hp.attribution_split} split has {have}"
                    f" prompts; lower it or raise data.n_{hp.attribution_split}"
                )
        if hp.mask_run:
            check_prompts_apart(hp.mask_run, "train", dm, "mask run's training split")
        if hp.graph_run:
            check_prompts_apart(hp.graph_run, "test", dm, "circuit-graph run's prompts")

    # --- rankings from attribution patching -----------------------------------------------------------------
    def _attribution_batches(self) -> list[dict]:
        """This rank's share of the first ``attribution_prompts`` prompts of ``attribution_split``, batched."""
        from torch.utils.data import DataLoader, Subset

        from lit_svd.datamodules.common import ShardSampler

        dm, hp = self.trainer.datamodule, self.hparams
        data = Subset(dm.splits[hp.attribution_split], range(hp.attribution_prompts))
        rank, world = self.trainer.global_rank, self.trainer.world_size
        sampler = ShardSampler(data, num_replicas=world, rank=rank) if world > 1 else None
        loader = DataLoader(data, batch_size=dm.batch_size, collate_fn=dm.collate, sampler=sampler)
        return [{k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in b.items()} for b in loader]

    @property
    def _wants_directions(self) -> bool:
        return any(m in self.methods for m in (*DIRECTION_METHODS, *MIXED_METHODS))

    def _attribution_scores(self) -> dict[str, Tensor]:
        """Per attribution method its flat scores (directions ``[N]``; heads ``[L * H + L]``: heads then MLPs),
        summed over this rank's prompts, then over ranks, divided by the prompts (the mean metric's attribution)."""
        hp, universe = self.hparams, self.universe
        points = alphas(hp.ig_steps)
        writers = [c.name for c in self.components if c.kind in WRITER_KINDS]
        L, H = self.view.n_layers, self.view.n_heads
        totals: dict[str, Tensor] = {}

        def add(name: str, value: Tensor) -> None:
            totals[name] = totals.get(name, torch.zeros_like(value)) + value

        prompts = 0
        for batch in self._attribution_batches():
            with torch.inference_mode(False):  # Lightning tests in inference mode; attribution needs a gradient
                batch = {k: v.clone() if isinstance(v, Tensor) else v for k, v in batch.items()}
                if self._wants_directions:
                    per_point = batch_integrands(self.patch, batch, self.task, points, hp.ig_path)
                    add("eap", universe.flatten(per_point[-1]))  # alpha = 1: the clean run
                    add(
                        "eap_ig",
                        universe.flatten({n: sum(p[n] for p in per_point) for n in per_point[0]}) / len(points),
                    )
                if any(m in self.methods for m in WRITER_METHODS):
                    per_point = batch_integrands(self.patch, batch, self.task, points, hp.ig_path, writers)
                    flat = universe.flatten(mean_over_points(per_point))
                    units = unit_attributions(universe, flat, L, H, 1)
                    add("eap_ig_heads", torch.cat([units.heads.flatten(), units.mlps]))
                if "eap_heads" in self.methods:
                    got = batch_attributions(self.view, batch, self.task)
                    add("eap_heads", torch.cat([got.heads.flatten(), got.mlps]) * got.prompts)
            prompts += len(batch["answer_pos"])
        names = sorted(totals)
        if not names:
            return {}
        packed = torch.cat([*(totals[n] for n in names), torch.tensor([float(prompts)], dtype=torch.float64)])
        packed = self.trainer.strategy.reduce(packed.to(self.device), reduce_op="sum").cpu()
        out, start = {}, 0
        for n in names:
            out[n] = packed[start : start + len(totals[n])] / packed[-1]
            start += len(totals[n])
        return out

    def _attribution_rankings(self) -> None:
        L, H = self.view.n_layers, self.view.n_heads
        start = time.monotonic()
        scores = self._attribution_scores()
        seconds = time.monotonic() - start
        for method in (m for m in ATTRIBUTION_METHODS if m in self.methods):
            if method in MIXED_METHODS:
                whole, writer, within = MIXED_METHODS[method]
                unit_scores = {}
                if writer:
                    s = scores["eap_ig_heads"]
                    heads = Attributions(s[: L * H].view(L, H), s[L * H :], self.hparams.attribution_prompts)
                    unit_scores = writer_unit_scores(self.universe, heads, self.view.n_kv_heads, writer)
                pair = unit_rankings(self.universe, scores["eap_ig"], self.weights, whole, unit_scores, within)
                info = {"whole": list(whole), "writer_path_units": list(writer), "within": within}
            elif method in DIRECTION_METHODS:
                source, fair = DIRECTION_METHODS[method]
                s = scores[source]
                pair = attribution_rankings(per_weight(s, self.weights) if fair else s)
                top = s.abs().argsort(descending=True)[:5]
                info = {"top_directions": [str(self.universe.address(int(i))) for i in top]}
            else:
                s = scores[method]
                attr = Attributions(s[: L * H].view(L, H), s[L * H :], self.hparams.attribution_prompts)
                pair = {}
                for variant in (SIGNED, ABSOLUTE):
                    pair[variant], info = eap_ranking(self.universe, attr, self.view.n_kv_heads, variant == SIGNED)
            for variant, ranking in pair.items():
                self.rankings[f"{method}/{variant}"] = ranking
            prompts = f"{self.hparams.attribution_split}[:{self.hparams.attribution_prompts}]"
            self.ranking_info[method] = {**info, "attribution_s": seconds, "prompts": prompts}
        self.attribution_scores = scores

    # --- curves ---------------------------------------------------------------------------------------------
    def on_test_start(self) -> None:
        self.patch.to(self.device)
        if any(m in self.methods for m in ATTRIBUTION_METHODS):
            self._attribution_rankings()
        self.plan = plan_curves(self.rankings, self.sizes, len(self.universe), AXES, self.weights)
        self.states = CurveStates(sum(len(self.plan.circuits(n)) for n in self.plan.rankings)).to(self.device)
        self._start = time.monotonic()

    @torch.no_grad()
    def test_step(self, batch: dict, batch_idx: int) -> None:
        assert self.plan is not None and self.states is not None
        sums = batch_sums(self.patch, self.universe, batch, self.plan, self.task)
        self.states.update(sums, list(self.plan.rankings))
        for name, s in sums.seconds.items():
            self._seconds[name] = self._seconds.get(name, 0.0) + s

    def on_test_epoch_end(self) -> None:
        assert self.plan is not None and self.states is not None
        got = {name: t.cpu() for name, t in self.states.compute().items()}
        circuits, start = {}, 0
        for name in self.plan.rankings:
            width = len(self.plan.circuits(name))
            circuits[name] = got["circuits"][:, start : start + width].T
            start += width
        sums = CurveSums(got["full"], got["empty"], circuits, got["index"], self._seconds)
        curves, info = curves_from_sums(sums, self.plan)
        self.faithfulness = method_results(curves)
        info["random"] = random_summary(self.faithfulness)
        info["vs_heads"] = heads_comparison(self.faithfulness, info)
        info["wall_s"] = time.monotonic() - self._start
        info["rankings"] = self.ranking_info
        self.summary = info
        self.states.reset()


def method_results(curves: dict) -> dict[str, dict]:
    """Curves by ranking name (``<method>/<signed|absolute>`` or ``<method>``) grouped per method with MIB's two
    scores per axis (``faithfulness.method_scores``)."""
    out: dict[str, dict] = {}
    for name, by_axis in curves.items():
        method, _, variant = name.partition("/")
        out.setdefault(method, {"rankings": {}})["rankings"][variant or "ranking"] = {
            axis: c.row() for axis, c in by_axis.items()
        }
    for method, entry in out.items():
        variants = entry["rankings"]
        signed = f"{method}/{SIGNED}" if SIGNED in variants else method
        absolute = f"{method}/{ABSOLUTE}" if ABSOLUTE in variants else method
        entry.update(method_scores(curves, signed, absolute))
    return out


ANCHOR = "eap_ig_heads"  # the head-level method every other one is compared with (docs/circuits.md)


def heads_comparison(faithfulness: dict, info: dict, anchor: str = ANCHOR) -> dict | None:
    """Per method other than ``anchor`` and per axis: its CPR (signed ranking) and CMD (absolute ranking) against
    ``anchor``'s on the same axis, as the docs' tables compare them, and the 95 % bootstrap interval of each
    difference, paired over the prompts (``cpr_diff_ci``: the method's CPR minus the anchor's; ``cmd_diff_ci``
    likewise; 0 inside: these prompts do not tell the two apart; ``area_intervals.paired_differences``). None
    without the anchor among the methods."""
    if anchor not in faithfulness:
        return None
    rows = {}  # (method, variant, axis) -> curve row, for the pairs
    for method, entry in faithfulness.items():
        for variant, axes in entry["rankings"].items():
            rows.update({f"{method}/{variant}@{axis}": c for axis, c in axes.items()})
    diff = paired_differences(rows, info)

    def curve(method: str, variant: str, axis: str) -> str:
        have = faithfulness[method]["rankings"]
        return f"{method}/{variant if variant in have else 'ranking'}@{axis}"

    out: dict = {}
    for method, entry in faithfulness.items():
        if method == anchor:
            continue
        out[method] = {}
        for axis in entry["cpr"]:
            if axis not in faithfulness[anchor]["cpr"]:
                continue
            cpr, cmd = entry["cpr"][axis], entry["cmd"][axis]
            heads_cpr, heads_cmd = faithfulness[anchor]["cpr"][axis], faithfulness[anchor]["cmd"][axis]
            row = {"cpr": cpr, "heads_cpr": heads_cpr, "cpr_diff": cpr - heads_cpr,
                   "cmd": cmd, "heads_cmd": heads_cmd, "cmd_diff": cmd - heads_cmd}  # fmt: skip
            row |= diff(curve(method, SIGNED, axis), curve(anchor, SIGNED, axis), "cpr")
            row |= diff(curve(method, ABSOLUTE, axis), curve(anchor, ABSOLUTE, axis), "cmd")
            out[method][axis] = row
    return {"anchor": anchor, "methods": out}


def random_summary(faithfulness: dict) -> dict | None:
    """Mean and spread of the random rankings' CPR and CMD per axis (None without random rankings)."""
    randoms = [r for n, r in faithfulness.items() if n.startswith("random_")]
    if not randoms:
        return None
    out: dict = {"seeds": len(randoms)}
    for score in ("cpr", "cmd"):
        for axis in AXES:
            t = torch.tensor([r[score][axis] for r in randoms], dtype=torch.float64)
            out[f"{score}_{axis}_mean"] = float(t.mean())
            out[f"{score}_{axis}_std"] = float(t.std()) if len(t) > 1 else 0.0
    return out


def _graph_model(graph_run: str | None) -> str:
    if graph_run is None:
        raise ValueError("model is null and there is no mask_run or graph_run to take it from; give model")
    content = load_run(graph_run, need=("results",), what="circuit-graph run").content
    if not content.get("model"):
        raise ValueError(f"{graph_run}: results.json names no model; give model")
    return content["model"]


def check_prompts_apart(run: str, split: str, dm, what: str) -> None:
    """None of the test prompts may be in ``split`` of the run's data section (its ``config.yaml``; a run without
    one is not checked)."""
    from lit_svd.datamodules.tasks import TaskDataModule

    found = load_run(run)
    if not found.has("config"):
        return
    args = found.init_args("data")
    args.pop("num_workers", None)
    theirs = {tuple(e.clean_ids) for e in TaskDataModule(**args).splits[split].examples}
    ours = [tuple(e.clean_ids) for e in dm.splits["test"].examples]
    overlap = sum(p in theirs for p in ours)
    if overlap:
        raise ValueError(
            f"data: {overlap} of the {len(ours)} test prompts are in the {what} ({Path(run) / 'config.yaml'});"
            " the curves must be scored on prompts no ranking was built on"
        )
