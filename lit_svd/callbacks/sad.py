"""SAD reports: ``SADReport`` (results.json and figures of a ``SADAnalysisModule`` test run) and
``SADCallback`` (SAD during training), with the SAD figures.

``SADCallback`` measures, every ``every_n_steps`` optimiser steps (and before the first and after the
last), the mean Rolls–Tovee sparsity of each head's analysed pairs in its singular basis and in its
Haar-rotated control basis, on a fixed probe set; at the steps ``null_at`` names (default: the last) also
in ``null_draws`` matched-spectrum null heads (same spectrum, random singular vectors; each null head on the
pairs it attends to in the first ``null_probe`` probe sequences):

* language models (a module with a ``view``: ``LanguageModelModule``, ``PretrainedLMModule``): the first
  ``n_probe`` windows of the held-out file ``probe_path``; without it, ``n_probe`` probe windows of the data
  module outside its train / val / test splits (``TextDataModule.probe``; other data modules: the first
  sequences of the validation loader, training loader if there is none), every head;
* the toy model (``ToyAlignmentModule``): the first ``n_probe`` samples of the current batch, one head
  per ensemble instance (query token 0 attending over the key tokens).

Scalars go to TensorBoard as ``sad/<head>/sparsity``, ``sad/<head>/sparsity_rotated``,
``sad/<head>/sparsity_null`` (mean over draws) and ``sad/<head>/sparsity_null_p05``, plus the means over
heads and ``sad/fraction_sparser_than_null``; at the end of fit rank zero writes ``results.json``
(``"experiment": "sad_training"``; the toy: ``sad_results.json``) and ``sad_training.png``.
"""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lit_svd.analysis.sad import (
    DEFAULT_NULL_DRAWS,
    DEFAULT_RECON_TOL,
    check_null_draws,
    check_threshold,
    check_tolerance,
    lm_head_sparsity,
    toy_head_sparsity,
)
from lit_svd.callbacks.provenance import provenance
from lit_svd.callbacks.training import held_out_probe, update_training_result
from lit_svd.figures.sad import figures as sad_figures
from lit_svd.figures.training import sad_training
from lit_svd.linalg import REL_GAP
from lit_svd.option_checks import check_rel_gap
from lit_svd.output import log_scalars, save_figure, save_figures, write_result
from lit_svd.results.sad import SADResult


class SADReport(Callback):
    """Writes a ``SADAnalysisModule`` test run: ``results.json`` (``lit_svd.results.SADResult``, keys in
    docs/sad.md), ``heads.csv`` (its table), ``sad_heatmap.png`` (layer x head maps against the matched null,
    the pair null and the rotated control) and ``sad_n_recon.png`` (N_recon histograms). The module builds
    its rows at the end of its test epoch (on every rank: it syncs the metric states); only rank zero writes.

    Every head row also carries ``basis`` (``analysis.sad.basis_blocks``, computed by the module): the
    numerical rank of its ``Omega(0)``, how many of its basis directions are isolated at ``rel_gap``, and its
    ``top_terms`` largest directions with their block and isolation gap (a term inside a block is
    basis-dependent).

    Args:
        rel_gap: relative gap below which neighbouring singular values share a block.
        top_terms: how many of each head's largest directions are listed with their blocks.
    """

    def __init__(self, rel_gap: float = REL_GAP, top_terms: int = 8):
        self.rel_gap = check_rel_gap(rel_gap)
        if top_terms < 0:
            raise ValueError(f"top_terms={top_terms!r} is invalid; give an integer >= 0")
        self.top_terms = top_terms

    def setup(self, trainer: pl.Trainer, pl_module, stage: str) -> None:
        pl_module.report_basis = (self.rel_gap, self.top_terms)  # the module annotates its rows

    def on_test_end(self, trainer: pl.Trainer, pl_module) -> None:
        rows = dict(pl_module.report_rows)
        rows.pop("experiment")
        result = SADResult(**{_FIELD.get(k, k): v for k, v in rows.items()}, provenance=provenance(trainer, pl_module))
        write_result(trainer, result)
        if trainer.is_global_zero:
            log_scalars(trainer, report_scalars(result.to_dict()), step=0)
            save_figures(trainer, sad_figures(result))


_FIELD = {"summary": "overall"}  # results.json key -> field name


def report_scalars(results: dict) -> dict[str, float]:
    """TensorBoard scalars of a SAD test run: the summary counts and means, and per head its sparsity, the
    matched null's mean and 5th percentile, the pair null and the rotated control."""
    out = {
        f"sad/{k}": float(v)
        for k, v in results["summary"].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
    }
    for r in results["heads"]:
        for key in ("sparsity", "sparsity_null", "sparsity_null_p05", "sparsity_unattended", "sparsity_rotated"):
            if r.get(key) is not None:
                out[f"sad/L{r['layer']}H{r['head']}/{key}"] = float(r[key])
    return out


class SADCallback(Callback):
    """Track SAD sparsity against the rotated control over training (see the module docstring).

    The defaults are for watching a training run at a small cost (the three during-training callbacks add
    <= 10 % to the tiny LM's fit, bench/callback_overhead.py): measurements every 250 steps, no log-spaced
    ones, and the matched null (the expensive part: ~17x a measurement without it at 16 draws) only at the
    last step, on 2 probe sequences. What that gives up: the early dynamics (``log_spaced: true``), the null's
    trajectory (``null_at: every``) and the at-init comparison showing the null is not beaten by an untrained
    model (``null_at: ends``); a null on fewer sequences has a noisier mean per draw, hence a wider
    distribution and a lower 5th percentile, so "sparser than the null" gets harder, not easier.

    Args:
        every_n_steps: measure every this many optimiser steps (and at the start and the end).
        log_spaced: also measure at steps 1, 2, 4, 8, ... (the early, fast part of training).
        n_probe: probe sequences (LM) or samples (toy).
        threshold: attention-weight threshold of an analysed pair, as ``SADAnalysisModule``.
        recon_tol: N_recon tolerance, as ``SADAnalysisModule``.
        seed: seeds the Haar rotation of the control basis and the matched-null draws.
        null_draws: matched-spectrum null heads per head (0: none), as ``SADAnalysisModule``.
        null_at: the measurements with the matched null: "every", "ends" (the first and the last) or "last".
        null_probe: probe sequences (LM) or samples (toy) the null heads read (the first ones; null: all
            ``n_probe``); the singular basis and the rotated control always read all ``n_probe``.
        write_results: write the results and ``sad_training.png`` at the end of fit.
        results_name: the results file; default ``results.json`` for language models and
            ``sad_results.json`` for the toy model (whose own alignment callback writes ``results.json``).
        probe_path: language models: a held-out text file whose first ``n_probe`` windows of
            ``probe_seq_len`` tokens are the probe (null: the data module's probe windows, outside its splits).
        probe_seq_len: tokens per probe window with ``probe_path``.
    """

    def __init__(
        self,
        every_n_steps: int = 250,
        n_probe: int = 8,
        threshold: float | None = None,
        recon_tol: float = DEFAULT_RECON_TOL,
        seed: int = 0,
        log_spaced: bool = False,
        write_results: bool = True,
        results_name: str | None = None,
        null_draws: int = DEFAULT_NULL_DRAWS,
        probe_path: str | None = None,
        probe_seq_len: int = 64,
        null_at: Literal["every", "ends", "last"] = "last",
        null_probe: int | None = 2,
    ):
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r} must be a positive integer")
        if not isinstance(n_probe, int) or n_probe < 1:
            raise ValueError(f"n_probe={n_probe!r} must be a positive integer")
        self.null_draws = check_null_draws(null_draws)
        if null_at not in ("every", "ends", "last"):
            raise ValueError(f"null_at={null_at!r}: allowed are 'every', 'ends', 'last'")
        if null_probe is not None and (not isinstance(null_probe, int) or null_probe < 1):
            raise ValueError(f"null_probe={null_probe!r} must be a positive integer or null (all n_probe)")
        self.null_at, self.null_probe = null_at, null_probe
        self.every_n_steps, self.n_probe = every_n_steps, n_probe
        self.threshold = check_threshold(threshold)
        self.recon_tol = check_tolerance(recon_tol)
        self.seed, self.write, self.log_spaced = seed, write_results, log_spaced
        self.results_name = results_name
        self.probe_path, self.probe_seq_len = probe_path, probe_seq_len
        self.history: list[dict] = []
        self.probe: tuple[Tensor, Tensor] | None = None

    # --- probes ------------------------------------------------------------------------------------
    @staticmethod
    def _is_lm(module) -> bool:
        return hasattr(module, "view") and not hasattr(module, "head_weights")

    def _lm_probe(self, trainer: pl.Trainer) -> tuple[Tensor, Tensor]:
        """The data module's probe windows (outside its train / val / test splits: ``TextDataModule.probe``);
        a data module without them: its first validation, else training, sequences."""
        dm = trainer.datamodule
        if dm is None:
            raise ValueError(
                "SADCallback on a language model needs a datamodule (its probe windows, else its first"
                " validation or training sequences, are the probe); pass datamodule=... to fit"
            )
        if callable(getattr(dm, "probe", None)):
            return dm.probe(self.n_probe)
        try:
            loader = dm.val_dataloader()
        except (NotImplementedError, AttributeError):
            loader = None
        if loader is None or (hasattr(loader, "__len__") and len(loader) == 0):
            loader = dm.train_dataloader()
        ids, masks, n = [], [], 0
        for batch in loader:
            if isinstance(batch, Tensor):
                x, m = batch, torch.ones_like(batch)
            else:
                x = batch["input_ids"] if "input_ids" in batch else batch["clean_ids"]
                m = batch.get("attention_mask", torch.ones_like(x))
            ids.append(x)
            masks.append(m)
            n += x.shape[0]
            if n >= self.n_probe:
                break
        T = max(x.shape[1] for x in ids)
        pad = lambda t: torch.nn.functional.pad(t, (0, T - t.shape[1]))  # noqa: E731  right padding
        return torch.cat([pad(x) for x in ids])[: self.n_probe], torch.cat([pad(m) for m in masks])[: self.n_probe]

    def _null_draws(self, last: bool) -> int:
        due = self.null_at == "every" or last or (self.null_at == "ends" and not self.history)
        return self.null_draws if due else 0

    def _sparsity(self, fn, n: int, draws: int) -> dict:
        """``fn(n_sequences, null_draws)`` on all ``n`` probe sequences, with the null (if due) read from the
        first ``null_probe`` of them; "sparser than the null" compares the head on all with that null."""
        m = n if self.null_probe is None else min(self.null_probe, n)
        if not draws or m == n:
            return fn(n, draws)
        res, null = fn(n, 0), fn(m, draws)
        res.update({k: null[k] for k in ("sparsity_null", "sparsity_null_p05")})
        res["sparser_than_null"] = [bool(a < b) for a, b in zip(res["sparsity"], null["sparsity_null_p05"])]
        return res

    def _measure(self, trainer: pl.Trainer, module, feats: Tensor | None = None, last: bool = False) -> None:
        step = trainer.global_step
        if self.history and self.history[-1]["step"] == step:
            if not last or "sparsity_null" in self.history[-1] or not self._null_draws(True):
                return
            self.history.pop()  # the last step was measured without the null: again, with it
        was_training = module.training
        module.eval()
        try:
            if self._is_lm(module):
                if self.probe is None:
                    self.probe = (
                        held_out_probe(
                            trainer, module, self.probe_path, self.n_probe, self.probe_seq_len, map_ids=False
                        )
                        if self.probe_path
                        else self._lm_probe(trainer)
                    )
                ids, mask = (t.to(module.device) for t in self.probe)
                if hasattr(module, "map_ids"):  # a model trained on a compacted vocabulary
                    ids = module.map_ids(ids)
                res = self._sparsity(
                    lambda n, d: lm_head_sparsity(
                        module.view, ids[:n], mask[:n], self.threshold, self.recon_tol, self.seed, d
                    ),
                    ids.shape[0],
                    self._null_draws(last),
                )
            else:
                if feats is None:
                    return
                W_Q, W_K = module.head_weights()
                W, feats = module.features().detach(), feats[:, : self.n_probe]
                res = self._sparsity(
                    lambda n, d: toy_head_sparsity(
                        W, W_Q, W_K, module.d_heads, feats[:, :n], self.threshold, self.recon_tol, self.seed, d
                    ),
                    feats.shape[1],
                    self._null_draws(last),
                )
        finally:
            module.train(was_training)
        means = history_means(res)
        self.history.append({"step": step, **res, **means})
        scalars = {f"sad/{k}": v for k, v in means.items()}
        for key in ("sparsity", "sparsity_rotated", "sparsity_null", "sparsity_null_p05"):
            for name, v in zip(res["name"], res.get(key, [])):
                scalars[f"sad/{name}/{key}"] = v
        log_scalars(trainer, scalars, step)

    # --- hooks -------------------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        if self._is_lm(pl_module):
            self._measure(trainer, pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._is_lm(pl_module) and trainer.global_step == 0:
            self._measure(trainer, pl_module, batch)  # the toy's untrained head, on the first batch

    def _due(self, step: int) -> bool:
        return step % self.every_n_steps == 0 or (self.log_spaced and step & (step - 1) == 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._due(trainer.global_step) and trainer.global_step != trainer.max_steps:  # the last: on_train_end
            self._measure(trainer, pl_module, None if self._is_lm(pl_module) else batch)
        self._last_batch = batch

    def on_train_end(self, trainer, pl_module) -> None:
        self._measure(
            trainer, pl_module, None if self._is_lm(pl_module) else getattr(self, "_last_batch", None), last=True
        )
        if not self.write or not self.history:
            return
        first, last = self.history[0], self.history[-1]
        summary = {"first_step": first["step"], "last_step": last["step"]}
        for key in history_means(last):
            summary[f"{key}_first"], summary[f"{key}_last"] = first.get(key, float("nan")), last[key]
        name = self.results_name or ("results.json" if self._is_lm(pl_module) else "sad_results.json")
        update_training_result(
            trainer,
            pl_module,
            name,
            threshold=self.threshold,
            recon_tol=self.recon_tol,
            seed=self.seed,
            n_probe=self.n_probe,
            null_draws=self.null_draws,
            null_at=self.null_at,
            null_probe=self.null_probe,
            overall=summary,
            history=self.history,
        )
        if trainer.is_global_zero:
            save_figure(trainer, sad_training(self.history), "sad_training")


def history_means(res: dict) -> dict[str, float]:
    """Means over heads (with pairs) of one measurement, and the fraction of them sparser than their null."""
    out = {}
    for key in ("sparsity", "sparsity_rotated", "sparsity_null", "sparsity_null_p05"):
        if key in res:
            out[f"mean_{key}"] = torch.tensor(res[key], dtype=torch.float64).nanmean().item()
    if "sparser_than_null" in res:
        has = [n > 0 for n in res["n_pairs"]]
        below = [b for b, h in zip(res["sparser_than_null"], has) if h]
        out["fraction_sparser_than_null"] = sum(below) / len(below) if below else float("nan")
    return out
