"""SAD over a frozen pretrained model: ``python -m lit_svd test --config configs/sad/smollm2_ioi.yaml``.

Every analysed head's pairs are decomposed batch by batch (all heads of a layer at once, with the rotated
control, the matched-spectrum null draws and the pair null) and reduced to per-head sums in
``SADHeadStats`` (named torchmetrics states, summed over DDP ranks), so two processes give the results of
one. With ``layers_per_pass`` the layers are decomposed a group at a time (the first group in Lightning's
test loop, the others over this rank's stored prompts at the end, each pass running only its blocks:
``lit_svd.models.layer_passes``), so memory holds one group's bases and null frames, not all layers'.
``results()`` turns the sums into rows; ``lit_svd.callbacks.sad.SADReport`` writes ``results.json``
(keys in ``docs/sad.md``) and the figures.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric
from tqdm.auto import tqdm

from lit_svd.analysis.sad import (
    DEFAULT_NULL_DRAWS,
    DEFAULT_RECON_TOL,
    PairStats,
    attention_inputs,
    basis_blocks,
    decompose_layer,
    layer_bases,
    null_prompts,
    qk_heads_from_view,
    summarise_heads,
)
from lit_svd.analysis.sad_options import check_sad_options
from lit_svd.models.layer_passes import layer_groups, pass_bounds, run_blocks
from lit_svd.models.svds import view_svd
from lit_svd.modules.pretrained import PretrainedLMModule


class SADHeadStats(Metric):
    """Per (layer, head) sums over analysed pairs (float64): counts, sparsity sums (and squares), N_recon
    histograms; the matched null's pair count and sparsity sum per draw and its pooled histogram; the pair
    null's sums."""

    full_state_update = False
    SUMS = (
        "n_pairs",
        "sparsity",
        "sparsity_sq",
        "sparsity_rotated",
        "n_unattended",
        "sparsity_unattended",
        "sparsity_unattended_sq",
    )
    HISTS = ("recon_hist", "recon_hist_rotated", "recon_hist_null", "recon_hist_unattended")

    def __init__(self, n_layers: int, n_heads: int, n_directions: int, null_draws: int = 0):
        super().__init__()
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        for name in self.SUMS:
            self.add_state(name, z(n_layers, n_heads), dist_reduce_fx="sum")
        for name in self.HISTS:
            self.add_state(name, z(n_layers, n_heads, n_directions), dist_reduce_fx="sum")
        self.add_state("n_pairs_null", z(n_layers, n_heads, null_draws), dist_reduce_fx="sum")
        self.add_state("sparsity_null", z(n_layers, n_heads, null_draws), dist_reduce_fx="sum")
        self.add_state("n_prompts", z(()), dist_reduce_fx="sum")

    def _add(self, name: str, row: int, head: Tensor, values: Tensor) -> None:
        getattr(self, name)[row].index_add_(0, head, values.to(torch.float64))

    def _hist(self, name: str, row: int, head: Tensor, n_recon: Tensor) -> None:
        hist = getattr(self, name)[row]
        k = hist.shape[-1]
        flat = (head.unsqueeze(0) * k + n_recon.long().reshape(-1, head.numel()) - 1).reshape(-1)
        hist.view(-1).index_add_(0, flat, torch.ones(flat.numel(), dtype=torch.float64, device=hist.device))

    def update(self, row: int, stats: PairStats) -> None:
        """Add one layer's pairs (``row`` indexes the analysed layers)."""
        h = stats.head.long().to(self.n_pairs.device)
        self._add("n_pairs", row, h, torch.ones_like(h, dtype=torch.float64))
        self._add("sparsity", row, h, stats.sparsity)
        self._add("sparsity_sq", row, h, stats.sparsity.double() ** 2)
        self._add("sparsity_rotated", row, h, stats.sparsity_rotated)
        self._hist("recon_hist", row, h, stats.n_recon)
        self._hist("recon_hist_rotated", row, h, stats.n_recon_rotated)
        if stats.null is not None:
            nl = stats.null
            hn = nl.head.long().to(h.device)
            key = hn * self.sparsity_null.shape[-1] + nl.draw.long().to(h.device)
            self.n_pairs_null[row].view(-1).index_add_(0, key, torch.ones_like(key, dtype=torch.float64))
            self.sparsity_null[row].view(-1).index_add_(0, key, nl.sparsity.to(torch.float64))
            self._hist("recon_hist_null", row, hn, nl.n_recon)
        if stats.unattended is not None:
            u = stats.unattended
            hu = u.head.long().to(h.device)
            self._add("n_unattended", row, hu, torch.ones_like(hu, dtype=torch.float64))
            self._add("sparsity_unattended", row, hu, u.sparsity)
            self._add("sparsity_unattended_sq", row, hu, u.sparsity.double() ** 2)
            self._hist("recon_hist_unattended", row, hu, u.n_recon)

    def add_prompts(self, n: int) -> None:
        self.n_prompts += n

    def compute(self) -> dict[str, Tensor]:
        return {k: getattr(self, k) for k in (*self.SUMS, *self.HISTS, "n_pairs_null", "sparsity_null", "n_prompts")}


def parse_head_selection(view, layers: list[int] | None, heads: list[list[int]] | None) -> dict[int, list[int]]:
    """``{layer: [heads]}`` from ``layers`` (all heads of each) or ``heads`` (``[layer, head]`` pairs, checked by
    ``check_sad_options``); neither: every head. Out-of-range entries fail with one line (IndexError)."""
    if heads is not None:
        chosen: dict[int, list[int]] = {}
        for pair in heads:
            layer, head = int(pair[0]), int(pair[1])
            view.check_layer(layer)
            view.check_head(head)
            if head not in chosen.setdefault(layer, []):
                chosen[layer].append(head)
        if not chosen:
            raise ValueError("model.heads=[] selects no head; give [layer, head] pairs or null for all heads")
        return {l: sorted(h) for l, h in sorted(chosen.items())}
    layers = list(range(view.n_layers)) if layers is None else [view.check_layer(int(l)) for l in layers]
    if not layers:
        raise ValueError("model.layers=[] selects no layer; give layer indices or null for all layers")
    return {l: list(range(view.n_heads)) for l in sorted(set(layers))}


class SADAnalysisModule(PretrainedLMModule):
    """Sparse attention decomposition of a pretrained model's heads over the test prompts.

    Args:
        layers: analyse every head of these layers (neither ``layers`` nor ``heads``: all heads).
        heads: or these ``[layer, head]`` pairs.
        threshold: a pair is analysed when the head's attention weight is >= threshold (in [0, 1]); null
            (default): the uniform level 1 / (number of visible sources). Relative attention must be > 0.
        recon_tol: N_recon counts directions until the running sum reaches l~ - recon_tol * sum_k |c_k|.
        seed: seeds the Haar rotation of each head's control basis and the matched-spectrum null draws.
        null_draws: random heads with each head's exact spectrum (through its rotary map) per head, fed the
            same inputs and scored on the same pairs; a head is sparser than this null below the draws'
            5th percentile (0: no matched null).
        null_stride: the matched null is scored on every so many-th prompt, by the prompt's index in its split
            (the batch's ``index``; without one, by row in the batch), so DDP and batching do not change the
            subset (1: every prompt, exact; the shipped configs use 4, which keeps the 16 draws and flips 3
            borderline heads of SmolLM2's 270, none of Gemma-3's; see docs/sad.md).
        pair_null: also decompose each head on the visible pairs it does not attend to (the pair null).
        min_pairs: heads with fewer analysed pairs are left out of the summary.
        input_key: the batch key holding token ids (``clean_ids`` for task prompts; ``input_ids`` as fallback).
        layers_per_pass: decompose this many layers per pass over the prompts (null: all in one pass); memory
            holds one group's bases and null frames (SmolLM2 with 16 draws: about 45 MB a layer), the
            results do not change.
    """

    # the options judged before anything loads (the command line's fast check calls it too, before torch)
    options_check = "lit_svd.analysis.sad_options:check_sad_options"

    def __init__(
        self,
        layers: list[int] | None = None,
        heads: list[list[int]] | None = None,
        threshold: float | None = None,
        recon_tol: float = DEFAULT_RECON_TOL,
        seed: int = 0,
        min_pairs: int = 20,
        input_key: str = "clean_ids",
        null_draws: int = DEFAULT_NULL_DRAWS,
        pair_null: bool = True,
        null_stride: int = 1,
        layers_per_pass: int | None = None,
        **loading,
    ):
        check_sad_options(threshold, recon_tol, min_pairs, null_draws, null_stride, layers, heads)
        super().__init__(**loading)
        self.save_hyperparameters()
        self.selection = parse_head_selection(self.view, layers, heads)
        self.layer_list = list(self.selection)
        self.passes = layer_groups(self.layer_list, layers_per_pass)
        k = min(self.view.d_head, self.view.d_model + 1)
        self.stats = SADHeadStats(len(self.layer_list), self.view.n_heads, k, null_draws)
        self.bases: dict[int, object] = {}  # the current pass's layers
        self._batches: list[tuple[Tensor, Tensor, Tensor | None]] = []  # this rank's prompts, for later passes
        self._resume: dict[int, object] = {}  # per batch: the residual stream the next pass starts from
        self._pending = False  # passes after the first still to run
        self._pass = 0  # the pass whose bases are loaded
        # the report's basis annotation (rel_gap, top_terms), set by callbacks.sad.SADReport, and its rows
        self.report_basis: tuple[float, int] | None = None
        self.report_rows: dict | None = None

    def setup(self, stage: str) -> None:
        # Lightning silently skips a test loop without batches: fail instead, with one line
        dm = getattr(self.trainer, "datamodule", None)
        if stage == "test" and dm is not None:
            try:
                n = len(dm.test_dataloader().dataset)
            except (TypeError, AttributeError, NotImplementedError):  # unsized streams are checked at the end
                return
            if n == 0:
                raise ValueError(
                    "the prompt set is empty (0 test prompts); give the datamodule at least one test"
                    " prompt (e.g. data.n_test > 0)"
                )

    def on_test_start(self) -> None:
        self._load_pass(0)

    def _load_pass(self, p: int) -> None:
        """The bases (and null frames) of pass ``p``'s layers; the previous pass's are dropped first."""
        dtype, hp = self.analysis_dtype, self.hparams
        self.bases = {}
        where = f" (pass {p + 1}/{len(self.passes)})" if len(self.passes) > 1 else ""
        for l in tqdm(self.passes[p], desc=f"SAD bases{where}", disable=not self._is_zero()):
            self.bases[l] = layer_bases(self.view, l, self.selection[l], hp.seed, dtype, hp.null_draws)
        self._pass = p

    def _unpack(self, batch) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(ids, attention_mask, index)``; ``index`` (the prompts' indices in their split) when the batch has one."""
        if isinstance(batch, Tensor):
            return batch, torch.ones_like(batch), None
        key = self.hparams.input_key if self.hparams.input_key in batch else "input_ids"
        if key not in batch:
            raise ValueError(
                f"batch has no {self.hparams.input_key!r} or 'input_ids' key (keys: {', '.join(batch)});"
                " set model.input_key"
            )
        ids = batch[key]
        return ids, batch.get("attention_mask", torch.ones_like(ids)), batch.get("index")

    def analyse_batch(
        self, ids: Tensor, mask: Tensor, index: Tensor | None = None, batch_idx: int = 0
    ) -> dict[int, PairStats]:
        """Decompose every selected head of the current pass's layers on one batch; returns the pairs per layer
        (also accumulated). ``index``: the prompts' indices in their split, which pick the matched null's
        prompts (``null_prompts``); ``batch_idx`` keys the residual stream kept for the next pass."""
        if ids.shape[0] == 0:
            raise ValueError("empty batch of prompts; give at least one prompt")
        if not self.bases:
            self.on_test_start()
        p = self._pass
        layers = self.passes[p]
        start, stop, record = pass_bounds(self.passes, p)
        resume = self._resume.pop(batch_idx, None)

        def run(forward):
            out = run_blocks(self.view, forward, start, resume, stop, record)
            if record is not None:
                self._resume[batch_idx] = out

        X = attention_inputs(self.view, ids, mask, layers, run)
        null_rows = null_prompts(ids.shape[0], index, self.hparams.null_stride, ids.device)
        out = {}
        for layer in tqdm(layers, desc="SAD layers", leave=False, disable=not self._is_zero()):
            out[layer] = decompose_layer(
                self.bases[layer],
                X.pop(layer),
                mask,
                self.hparams.threshold,
                self.hparams.recon_tol,
                unattended=self.hparams.pair_null,
                null_rows=null_rows,
            )
            self.stats.update(self.layer_list.index(layer), out[layer])
        if p == 0:
            self.stats.add_prompts(ids.shape[0])
        return out

    def test_step(self, batch, batch_idx: int) -> None:
        ids, mask, index = self._unpack(batch)
        if len(self.passes) > 1:
            self._batches.append((ids, mask, index))
            self._pending = True
        with torch.no_grad():
            self.analyse_batch(ids, mask, index, batch_idx)

    def on_test_epoch_start(self) -> None:
        self.stats.reset()
        self._batches, self._resume, self._pending = [], {}, False
        if self._pass != 0:
            self._load_pass(0)

    @torch.no_grad()
    def _run_later_passes(self) -> None:
        """Passes 2.. over this rank's stored prompts (once; ``results`` calls it too, whichever hook runs first)."""
        if not self._pending:
            return
        for p in range(1, len(self.passes)):
            self._load_pass(p)
            desc = f"SAD pass {p + 1}/{len(self.passes)}"
            for i, batch in enumerate(tqdm(self._batches, desc=desc, disable=not self._is_zero())):
                self.analyse_batch(*batch, batch_idx=i)
        self._batches, self._resume, self._pending = [], {}, False

    def on_test_epoch_end(self) -> None:
        self._run_later_passes()
        if self.report_basis is not None:  # on every rank: results() syncs the metric states
            self.report_rows = self.results(*self.report_basis)

    def results(self, rel_gap: float | None = None, top_terms: int = 8) -> dict:
        """The summary over all ranks (call on every rank: it syncs the metric states). With ``rel_gap``
        every head row also carries ``basis`` (``analysis.sad.basis_blocks``: rank, isolated directions and
        the ``top_terms`` largest with their blocks) and the result ``rel_gap``."""
        self._run_later_passes()
        sums = {k: v.cpu() for k, v in self.stats.compute().items()}
        if int(sums["n_prompts"].item()) == 0:
            raise ValueError("the prompt set is empty: no prompt was analysed; give at least one test prompt")
        if not self.hparams.pair_null:
            sums = {k: v for k, v in sums.items() if "unattended" not in k}
        rows, summary = summarise_heads(
            self.layer_list, [self.selection[l] for l in self.layer_list], sums, self.hparams.min_pairs
        )
        if rel_gap is not None:
            annotate_basis(rows, self.view, rel_gap, top_terms)
        hp = self.hparams
        return {
            "experiment": "sad",
            "model": self.options.model,
            "revision": self.options.revision,
            "model_type": self.view.model_type,
            "n_prompts": int(sums["n_prompts"].item()),
            "n_directions": self.stats.recon_hist.shape[-1],
            "threshold": hp.threshold,
            "threshold_rule": "uniform 1/n_visible" if hp.threshold is None else "fixed",
            "recon_tol": hp.recon_tol,
            "seed": hp.seed,
            "dtype": self.options.dtype,
            "null_draws": hp.null_draws,
            "null_stride": hp.null_stride,
            "pair_null": hp.pair_null,
            "n_layers": self.view.n_layers,
            "n_heads_per_layer": self.view.n_heads,
            "summary": summary,
            "heads": rows,
            **({"rel_gap": rel_gap} if rel_gap is not None else {}),
        }


def annotate_basis(rows: list[dict], view, rel_gap: float, top: int = 8) -> None:
    """Add ``basis`` (blocks of the head's SAD basis, ``basis_blocks``) to every head row."""
    per_layer: dict[int, list[dict]] = {}
    for row in rows:
        if row["layer"] not in per_layer:
            l = row["layer"]
            per_layer[l] = basis_blocks(qk_heads_from_view(view, l), rel_gap, top, view_svd(view, l, "qk"))
        row["basis"] = per_layer[row["layer"]][row["head"]]
