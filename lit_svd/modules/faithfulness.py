"""FaithfulnessModule: faithfulness curves of several rankings of a model's directions on one task's test prompts,
for ``test`` (``lit_svd.analysis.faithfulness``; docs/circuits.md, "Faithfulness").

The rankings (``methods``): ``eap_heads`` (head-level attribution patching on the same test prompts, computed at
the start of ``test``), ``mask`` (a finished mask run's lambdas, ``mask_run``), ``graph`` (a finished circuit-graph
run's node weights, ``graph_run``), ``random`` (one seeded random order per ``random_seeds``). Every batch records
the corrupted reference once and runs one patched forward per (ranking, size) plus the full and the empty circuit;
the metric sums are torchmetrics states summed over batches and DDP ranks, and the curves are ratios of means at
the end of the epoch (``faithfulness``: ``{method: {"sizes", "n_kept", "values", "metric", "cpr", "cmd",
"seconds"}}``, ``summary``). ``callbacks.faithfulness.FaithfulnessReport`` writes them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

import torch
from torch import Tensor
from torchmetrics import Metric

from lit_svd.analysis.attribution import Attributions, batch_attributions
from lit_svd.analysis.faithfulness import (
    MIB_SIZES,
    CurveSums,
    Universe,
    batch_sums,
    check_sizes,
    curves_from_sums,
    universe_components,
)
from lit_svd.analysis.rankings import GRAPH_RANKINGS, eap_ranking, mask_ranking, random_ranking, run_graph_ranking
from lit_svd.models.intervene import Intervention
from lit_svd.modules.pretrained import PretrainedLMModule
from lit_svd.runs import load_run

Method = Literal["eap_heads", "mask", "graph", "graph_mlp", "random"]


class CurveStates(Metric):
    """Sums over prompts of the metric of the full and empty circuits and of every (ranking, size) circuit."""

    full_state_update = False

    def __init__(self, n_rankings: int, n_sizes: int):
        super().__init__()
        self.add_state("full", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("empty", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("circuits", torch.zeros(n_rankings, n_sizes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("prompts", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, sums: CurveSums, names: Sequence[str]) -> None:
        self.full += sums.full
        self.empty += sums.empty
        self.prompts += sums.prompts
        self.circuits += torch.stack([sums.circuits[n] for n in names]).to(self.circuits)

    def compute(self) -> dict[str, Tensor]:
        return {"full": self.full, "empty": self.empty, "circuits": self.circuits, "prompts": self.prompts}


def check_methods(methods: Sequence[str], mask_run: str | None, graph_run: str | None, seeds: Sequence[int]) -> None:
    """Known methods, each with what it needs; one-line errors naming the key."""
    allowed = get_args(Method)
    if not methods:
        raise ValueError(f"methods=[]: give at least one of {', '.join(allowed)}")
    for m in methods:
        if m not in allowed:
            raise ValueError(f"methods: {m!r} unknown; allowed: {', '.join(allowed)}")
    if "mask" in methods and mask_run is None:
        raise ValueError("methods has 'mask' but mask_run is null; give the folder of a finished direction-mask run")
    for m in GRAPH_RANKINGS:
        if m in methods and graph_run is None:
            raise ValueError(
                f"methods has {m!r} but graph_run is null; give the folder of a finished circuit-graph run"
            )
    if "random" in methods and not seeds:
        raise ValueError("methods has 'random' but random_seeds is empty; give seeds, e.g. [0, 1, 2]")


class FaithfulnessModule(PretrainedLMModule):
    """Faithfulness curves (MIB's grid, CPR, CMD) of several rankings of the model's directions.

    Args:
        model: the model (default: the mask run's, else the graph run's; its other loading options are
            ``PretrainedLMModule``'s).
        mask_run: folder of a finished direction-mask run (``masks.pt``; ``config.yaml`` for the split check).
        graph_run: folder of a finished circuit-graph run (``results.json`` with ``edges``).
        methods: rankings to score: ``eap_heads``, ``mask``, ``graph``, ``graph_mlp`` (the graph with its MLP
            layers' input and gate directions, ``analysis.rankings.mlp_input_scores``), ``random``.
        random_seeds: one random ranking per seed (``random_<seed>``).
        sizes: fractions of the universe's directions kept (MIB: 0.001 ... 1).
        layers: layers of the universe (default all).
    """

    def __init__(
        self,
        model: str | None = None,
        mask_run: str | None = None,
        graph_run: str | None = None,
        methods: Sequence[Method] = ("eap_heads", "mask", "graph", "random"),
        random_seeds: Sequence[int] = (0, 1, 2),
        sizes: Sequence[float] = MIB_SIZES,
        layers: Sequence[int] | None = None,
        **loading,
    ):
        methods = [methods] if isinstance(methods, str) else list(methods)
        check_methods(methods, mask_run, graph_run, random_seeds)
        sizes = check_sizes(sizes)
        masks = load_run(mask_run, need=("masks",), what="direction-mask run").masks if mask_run else None
        if model is None:
            model = masks["model"] if masks else _graph_model(graph_run)
        super().__init__(model=model, **loading)
        self.save_hyperparameters()
        self.sizes, self.methods = sizes, methods
        self.components = universe_components(self.view, layers, progress=True)
        self.universe = Universe(self.components)
        self.intervention = Intervention(self.view, self.components)
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
        self.names = (["eap_heads"] if "eap_heads" in methods else []) + list(self.rankings)
        self.states = CurveStates(len(self.names), len(sizes))
        self.task: str | None = None
        self.faithfulness: dict[str, dict] = {}
        self.summary: dict = {}
        self._seconds: dict[str, float] = {}

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        self.task = getattr(getattr(dm, "task", None), "name", None)
        if self.task is None:
            raise ValueError("faithfulness needs task prompts (ioi, gp or gt): use lit_svd.datamodules.tasks")
        if self.hparams.mask_run:
            check_not_trained_on(self.hparams.mask_run, dm)

    def on_test_start(self) -> None:
        for c in self.components:
            for attr in ("U", "S", "V", "read"):
                t = getattr(c, attr)
                if t is not None:
                    setattr(c, attr, t.to(self.device))
        if "eap_heads" in self.methods:
            start = time.monotonic()
            attr = self._attributions()
            self.rankings = {"eap_heads": None, **self.rankings}
            self.rankings["eap_heads"], self.ranking_info["eap_heads"] = eap_ranking(
                self.universe, attr, self.view.n_kv_heads
            )
            self.ranking_info["eap_heads"]["attribution_s"] = time.monotonic() - start
        self._start = time.monotonic()

    def _attributions(self) -> Attributions:
        """Head and MLP attributions over this rank's test batches, summed over ranks (prompt-weighted mean)."""
        L, H = self.view.n_layers, self.view.n_heads
        heads, mlps, prompts = torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, dtype=torch.float64), 0
        for batch in self.trainer.datamodule.test_dataloader():
            with torch.inference_mode(False):  # Lightning tests in inference mode; attribution needs a gradient
                batch = {k: v.to(self.device).clone() if isinstance(v, Tensor) else v for k, v in batch.items()}
                got = batch_attributions(self.view, batch, self.task)
            heads += got.heads * got.prompts
            mlps += got.mlps * got.prompts
            prompts += got.prompts
        packed = torch.cat([heads.flatten(), mlps, torch.tensor([float(prompts)], dtype=torch.float64)])
        packed = self.trainer.strategy.reduce(packed.to(self.device), reduce_op="sum").cpu()
        n = float(packed[-1])
        return Attributions(packed[: L * H].view(L, H) / n, packed[L * H : L * H + L] / n, int(n))

    @torch.no_grad()
    def test_step(self, batch: dict, batch_idx: int) -> None:
        sums = batch_sums(self.intervention, self.universe, batch, self.rankings, self.sizes, self.task)
        self.states.update(sums, self.names)
        for name, s in sums.seconds.items():
            self._seconds[name] = self._seconds.get(name, 0.0) + s

    def on_test_epoch_end(self) -> None:
        got = self.states.compute()
        sums = CurveSums(
            full=float(got["full"]),
            empty=float(got["empty"]),
            circuits={n: got["circuits"][i].cpu() for i, n in enumerate(self.names)},
            prompts=int(got["prompts"]),
            seconds=self._seconds,
        )
        curves, info = curves_from_sums(sums, self.sizes, len(self.universe))
        self.faithfulness = {name: c.row() for name, c in curves.items()}
        randoms = [r for n, r in self.faithfulness.items() if n.startswith("random_")]
        if randoms:
            cpr = torch.tensor([r["cpr"] for r in randoms], dtype=torch.float64)
            cmd = torch.tensor([r["cmd"] for r in randoms], dtype=torch.float64)
            spread = lambda t: float(t.std()) if len(t) > 1 else 0.0  # noqa: E731
            info["random"] = {"cpr_mean": float(cpr.mean()), "cpr_std": spread(cpr), "cmd_mean": float(cmd.mean()),
                              "cmd_std": spread(cmd), "seeds": len(randoms)}  # fmt: skip
        info["wall_s"] = time.monotonic() - self._start
        info["rankings"] = self.ranking_info
        self.summary = info
        self.states.reset()


def _graph_model(graph_run: str | None) -> str:
    if graph_run is None:
        raise ValueError("model is null and there is no mask_run or graph_run to take it from; give model")
    content = load_run(graph_run, need=("results",), what="circuit-graph run").content
    if not content.get("model"):
        raise ValueError(f"{graph_run}: results.json names no model; give model")
    return content["model"]


def check_not_trained_on(mask_run: str, dm) -> None:
    """None of the test prompts may be in the mask run's training split (its ``config.yaml`` data section)."""
    from lit_svd.datamodules.tasks import TaskDataModule

    found = load_run(mask_run)
    if not found.has("config"):
        return
    args = found.init_args("data")
    args.pop("num_workers", None)
    trained = {tuple(e.clean_ids) for e in TaskDataModule(**args).splits["train"].examples}
    ours = [tuple(e.clean_ids) for e in dm.splits["test"].examples]
    overlap = sum(p in trained for p in ours)
    if overlap:
        raise ValueError(
            f"data: {overlap} of the {len(ours)} test prompts are in the mask run's training split"
            f" ({Path(mask_run) / 'config.yaml'}); use its data section (a test split drawn apart from its training)"
        )
