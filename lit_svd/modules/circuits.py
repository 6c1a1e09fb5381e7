"""CircuitGraphModule: a task's circuit graph of singular directions and the causal check of its top edges, for
``test`` (``python -m lit_svd test --config configs/circuits/<model>_<task>.yaml``).

Per test batch it runs the clean prompts once with the decomposition's activation points, builds every prompt's
graph (``analysis.circuit_graph.GraphBuilder``) and adds it to the edge sums (``EdgeSums``); it keeps the batch
and where each reader was read for the checks. At the end of the epoch the sums of every DDP rank are gathered
and added (so two processes give the graph of one), the merged graph's ``n_check`` strongest direction edges whose
writer can change (head and MLP directions, the embedding; not biases) are checked on every rank's prompts
(``analysis.edge_check``: the edge patched alone against ``n_random`` random readers of the same component), the
check sums gathered and added, and the rows judged.

What the report callback reads (``callbacks/circuits.py``; it never runs the model):

* ``graph``: the merged graph, a ``networkx.MultiDiGraph`` (``analysis.circuit_graph.to_networkx``; graph
  attributes task, model, n_prompts, options, metric);
* ``edge_rows()``: the merged edges as flat dicts (``EdgeSums.edges``); ``node_rows()``: one dict per node
  (key and ``node_attributes``); ``checks``: one row per checked edge (``edge_check.judge_edge``: writer, reader,
  reader_kind, effect, null_mean, null_std, z, percentile, gap, gap_fraction, prompts, passes_z, passes);
* ``sad_terms`` (``sad_terms: true``): ``{(layer, head): mean |c_k| per QK direction}`` over every pair SAD
  analyses on the test prompts, summed over ranks (``analysis.sad.abs_term_sums``);
* ``facts``: ``task``, ``model``, ``n_prompts``, ``options`` (the builder's and the check's: threshold, depth,
  readers, unit, qk_top, rel_gap, n_check, n_random, seed, level, z_pass, min_gap_fraction), ``metric`` (mean
  clean, corrupted and gap = clean - corrupted over the test prompts); ``timing`` (graph_s, check_s, per rank).

``graph_rows()`` returns all of it in one dict (``edges``, ``nodes``, ``checks``, ``facts``, ``timing``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

import torch

from lit_svd.analysis.causal import LEVEL, MIN_GAP_FRACTION, N_RANDOM, Z_PASS
from lit_svd.analysis.circuit_graph import (
    DEFAULT_DEPTH,
    DEFAULT_POSITION_SHARE,
    DEFAULT_QK_TOP,
    DEFAULT_THRESHOLD,
    TRACEABLE,
    EdgeSums,
    GraphBuilder,
    GraphOptions,
    Units,
    node_attributes,
    to_networkx,
)
from lit_svd.analysis.decompose import Decomposer
from lit_svd.analysis.edge_check import Edge, EdgeTotals, check_batch, check_context, judge_edge
from lit_svd.analysis.graph_options import check_circuit_options
from lit_svd.analysis.sad import abs_term_sums, layer_bases
from lit_svd.linalg import REL_GAP
from lit_svd.metrics import task_scorer
from lit_svd.models.base import augment_inputs
from lit_svd.modules.pretrained import PretrainedLMModule

CONSTANT_WRITERS = ("b_Q", "b_K", "b_V", "b_O", "b_in", "b_gate", "b_out", "b_U")


def checkable(edge: dict) -> bool:
    """An edge whose writer differs between the clean and the corrupted prompt (not a bias or norm bias)."""
    w = edge["writer"]
    return w == "embed" or not (w.split(".")[1] in CONSTANT_WRITERS or w.endswith("norm_bias"))


def mean_terms(parts: list[dict[int, tuple[torch.Tensor, torch.Tensor]]]) -> dict[tuple[int, int], list[float]]:
    """``{(layer, head): mean |c_k| per QK direction}`` from every rank's ``{layer: (sums [h, k], pairs [h])}``
    (heads without an analysed pair are left out)."""
    out: dict[tuple[int, int], list[float]] = {}
    for layer in sorted({l for part in parts for l in part}):
        sums = sum(part[layer][0] for part in parts if layer in part)
        counts = sum(part[layer][1] for part in parts if layer in part)
        for h in torch.nonzero(counts > 0).flatten().tolist():
            out[(layer, h)] = (sums[h] / counts[h]).tolist()
    return out


def _gather(obj, trainer):
    """Every rank's ``obj`` (a list, rank order); ``[obj]`` in one process."""
    import torch.distributed as dist

    if trainer is None or trainer.world_size == 1 or not dist.is_available() or not dist.is_initialized():
        return [obj]
    out = [None] * trainer.world_size
    dist.all_gather_object(out, obj)
    return out


class CircuitGraphModule(PretrainedLMModule):
    """A task's circuit graph of singular directions (docs/circuits.md, "Circuit graphs") and its edge checks.

    Args:
        threshold: a writer is kept for a reader when |contribution| >= threshold x sum |contributions|; in (0, 1).
        depth: levels of edges from the metric (1: its direct writers); 1 .. the model's layers.
        readers: readers of a kept head direction traced: qk, ov.
        unit: node unit: direction, block (near-equal singular values), head. Checks need direction.
        qk_top: QK directions traced per (head, destination).
        rel_gap: relative gap of a block (unit: block).
        position_share: a kept head direction is expanded at the positions holding at least this share of its kept
            contributions' |value|; in (0, 1).
        n_check: strongest checkable edges of the merged graph to check (0: none).
        n_random: random readers per checked edge in the null.
        seed: seeds the random readers.
        rows_per_forward: (prompt, probe) rows per patched forward (memory against speed).
        sad_terms: also measure, per head, each QK direction's mean |c_k| over every pair SAD analyses on the test
            prompts (all destinations): the report compares the graph's QK nodes with each graph head's top terms.
    """

    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.graph_options:check_circuit_options"

    def __init__(
        self,
        threshold: float = DEFAULT_THRESHOLD,
        depth: int = DEFAULT_DEPTH,
        readers: Sequence[str] = TRACEABLE,
        unit: Literal["direction", "block", "head"] = "direction",
        qk_top: int = DEFAULT_QK_TOP,
        rel_gap: float = REL_GAP,
        n_check: int = 16,
        n_random: int = N_RANDOM,
        seed: int = 0,
        rows_per_forward: int = 256,
        sad_terms: bool = True,
        position_share: float = DEFAULT_POSITION_SHARE,
        **loading,
    ):
        graph = (threshold, depth, readers, unit, qk_top, rel_gap, position_share)
        check_circuit_options(*graph, n_check, n_random, rows_per_forward, loading.get("fold_norms", True))
        options = GraphOptions(threshold, depth, tuple(readers), unit, qk_top, rel_gap, position_share)
        super().__init__(**loading)
        self.options = options.check(self.view.n_layers)
        self.save_hyperparameters()
        self.task: str | None = None
        self.graph = None
        self.checks: list[dict] = []
        self.facts: dict = {}
        self.timing: dict = {}
        self.sad_terms: dict[tuple[int, int], list[float]] = {}

    @staticmethod
    def check_config(model_args, data_args) -> None:
        """The options against the model's config and tokenizer, before the model loads (the CLI calls it)."""
        from lit_svd.modules.circuit_checks import check_circuit_config

        check_circuit_config(model_args, data_args)

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        self.task = getattr(getattr(dm, "task", None), "name", None)
        if self.task is None:
            raise ValueError("CircuitGraphModule needs a TaskDataModule (data.class_path: ...TaskDataModule)")

    def on_test_start(self) -> None:
        self.dec = Decomposer(self.view)
        self.builder = GraphBuilder(self.dec, self.task, self.options)
        self.units = Units(self.dec, self.options.unit, self.options.rel_gap)
        self.sums = EdgeSums()
        self.kept: list[tuple[dict, object]] = []  # (batch on the CPU, its BatchGraphs)
        self.metric_sums = torch.zeros(3, dtype=torch.float64)  # clean, corrupted, prompts
        self._graph_s = self._sad_s = 0.0
        self._sad_bases: dict = {}
        self._sad_sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (sum |c_k| [h, k], pairs [h])

    @torch.no_grad()
    def test_step(self, batch: dict, batch_idx: int) -> None:
        start = time.monotonic()
        cache = self.view.run_with_cache(self.dec.points(mix=True), batch["clean_ids"], batch["attention_mask"])
        graphs = self.builder.batch(cache, batch)
        self.sums.add(graphs, self.units, len(batch["answer_pos"]))
        graphs.rows = []  # summed: the checks need only where each reader was read (entries)
        self.kept.append(({k: v.cpu() if torch.is_tensor(v) else v for k, v in batch.items()}, graphs))
        self._graph_s += time.monotonic() - start
        if self.hparams.sad_terms:
            start = time.monotonic()
            self._add_sad_terms(cache, batch["attention_mask"])
            self._sad_s += time.monotonic() - start

    def _add_sad_terms(self, cache, attention_mask: torch.Tensor) -> None:
        for layer in range(self.view.n_layers):
            if layer not in self._sad_bases:
                self._sad_bases[layer] = layer_bases(self.view, layer, dtype=self.dec.dtype)
            x = augment_inputs(cache["attn_normalized", layer].to(self.dec.dtype))
            sums, counts = abs_term_sums(self._sad_bases[layer], x, attention_mask.to(x.device))
            if layer in self._sad_sums:
                old_sums, old_counts = self._sad_sums[layer]
                sums, counts = old_sums + sums, old_counts + counts
            self._sad_sums[layer] = (sums, counts)

    def on_test_epoch_end(self) -> None:
        hp, trainer = self.hparams, self.trainer
        sums = EdgeSums()
        for part in _gather(self.sums, trainer):
            sums.merge(part)
        self.sums = sums
        edges = sums.edges()
        start = time.monotonic()
        to_check = [Edge.of(e) for e in edges if checkable(e)][: hp.n_check]
        totals: dict[Edge, EdgeTotals] = {}
        metric = torch.zeros(3, dtype=torch.float64)
        for batch, graphs in self.kept:
            batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            ctx = check_context(self.dec, batch, self.task)
            metric += torch.tensor([float(ctx.m_clean.sum()), float(ctx.m_corrupt.sum()), len(ctx.m_clean)])
            got = check_batch(self.dec, ctx, graphs, to_check, self.task, hp.n_random, hp.seed, hp.rows_per_forward)
            for e, t in got.items():
                totals[e] = totals[e].add(t) if e in totals else t
        check_s = time.monotonic() - start
        all_totals: dict[Edge, EdgeTotals] = {}
        for part, m in _gather((totals, metric), trainer):
            for e, t in part.items():
                all_totals[e] = all_totals[e].add(t) if e in all_totals else t
            self.metric_sums += m
        self.checks = [judge_edge(e, all_totals[e]) for e in to_check if e in all_totals]
        self.sad_terms = mean_terms(_gather(self._sad_sums, trainer))
        clean, corrupt, n = self.metric_sums.tolist()
        n = max(n, 1)
        self.facts = {
            "task": self.task,
            "model": self.model_name,
            "n_prompts": sums.n_prompts,
            "options": {
                **{k: getattr(self.options, k) for k in ("threshold", "position_share", "depth", "unit", "qk_top")},
                "rel_gap": self.options.rel_gap,
                "readers": list(self.options.readers),
                "n_check": hp.n_check,
                "n_random": hp.n_random,
                "seed": hp.seed,
                "level": LEVEL,
                "z_pass": Z_PASS,
                "min_gap_fraction": MIN_GAP_FRACTION,
                "metric_name": task_scorer(self.task).metric_name,
            },
            "metric": {"clean": clean / n, "corrupted": corrupt / n, "gap": (clean - corrupt) / n},
        }
        self.timing = {"graph_s": self._graph_s, "check_s": check_s}
        if hp.sad_terms:
            self.timing["sad_terms_s"] = self._sad_s
        self.graph = to_networkx(edges, self.options.unit, self.view.n_layers)
        self.graph.graph.update({k: self.facts[k] for k in ("task", "model", "n_prompts", "options", "metric")})
        self.kept = []

    # --- what the report reads -------------------------------------------------------------------------------
    def edge_rows(self) -> list[dict]:
        """The merged graph's edges as flat dicts, strongest first."""
        return self.sums.edges()

    def node_rows(self) -> list[dict]:
        """One dict per node of the graph: ``node`` (its key) and ``node_attributes``."""
        return [{"node": k, **node_attributes(k, self.options.unit, self.view.n_layers)} for k in self.graph.nodes]

    def graph_rows(self) -> dict:
        """``edges``, ``nodes``, ``checks``, ``facts``, ``timing`` (module docstring)."""
        return {
            "edges": self.edge_rows(),
            "nodes": self.node_rows(),
            "checks": self.checks,
            "facts": self.facts,
            "timing": self.timing,
        }
