"""SAD reports: ``SADReport`` (results.json and figures of a ``SADAnalysisModule`` test run) and
``SADCallback`` (SAD during training), with the SAD figures.

``SADCallback`` measures, every ``every_n_steps`` optimiser steps (and before the first and after the
last), the mean Rolls–Tovee sparsity of each head's analysed pairs in its singular basis and in its
Haar-rotated control basis, on a fixed probe set; at the steps ``null_at`` names (default: the last) also
in ``null_draws`` matched-spectrum null heads (same spectrum, random singular vectors; each null head on the
pairs it attends to in the first ``null_probe`` probe sequences):

* language models (a module with a ``view``: ``LanguageModelModule``, ``PretrainedLMModule``): the first
  ``n_probe`` windows of the held-out file ``probe_path`` (without it: the first sequences of the
  validation loader, training loader if there is none), every head;
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
import matplotlib.pyplot as plt
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lit_svd.analysis.blocks import check_rel_gap
from lit_svd.analysis.sad import (
    DEFAULT_NULL_DRAWS,
    DEFAULT_RECON_TOL,
    basis_blocks,
    check_null_draws,
    check_threshold,
    check_tolerance,
    lm_head_sparsity,
    qk_heads_from_view,
    toy_head_sparsity,
)
from lit_svd.callbacks.training import held_out_probe, log_scalars
from lit_svd.linalg import REL_GAP
from lit_svd.output import save_figure, write_results


def nan_to_none(obj):
    """NaN (a head without analysed pairs) as JSON null, recursively."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [nan_to_none(v) for v in obj]
    return obj


class SADReport(Callback):
    """Writes a ``SADAnalysisModule`` test run: ``results.json`` (keys in docs/sad.md), ``sad_heatmap.png``
    (layer x head maps against the matched null, the pair null and the rotated control) and
    ``sad_n_recon.png`` (N_recon histograms). ``results()`` syncs the metric states, so it runs on every
    rank; only rank zero writes.

    Every head row also carries ``basis`` (``analysis.sad.basis_blocks``): the numerical rank of its
    ``Omega(0)``, how many of its basis directions are isolated at ``rel_gap``, and its ``top_terms`` largest
    directions with their block and isolation gap (a term inside a block is basis-dependent).

    Args:
        rel_gap: relative gap below which neighbouring singular values share a block.
        top_terms: how many of each head's largest directions are listed with their blocks.
    """

    def __init__(self, rel_gap: float = REL_GAP, top_terms: int = 8):
        self.rel_gap = check_rel_gap(rel_gap)
        if top_terms < 0:
            raise ValueError(f"top_terms={top_terms!r} is invalid; give an integer >= 0")
        self.top_terms = top_terms

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module) -> None:
        results = pl_module.results()
        annotate_basis(results, pl_module.view, self.rel_gap, self.top_terms)
        write_results(trainer, results)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(report_scalars(results), step=0)
            plot_head_heatmap(trainer, results)
            plot_n_recon(trainer, results)


def annotate_basis(results: dict, view, rel_gap: float = REL_GAP, top: int = 8) -> None:
    """Add ``basis`` (blocks of the head's SAD basis, ``basis_blocks``) to every head row, and ``rel_gap``."""
    per_layer: dict[int, list[dict]] = {}
    for row in results["heads"]:
        if row["layer"] not in per_layer:
            per_layer[row["layer"]] = basis_blocks(qk_heads_from_view(view, row["layer"]), rel_gap, top)
        row["basis"] = per_layer[row["layer"]][row["head"]]
    results["rel_gap"] = rel_gap


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
            ``probe_seq_len`` tokens are the probe (null: the first validation, else training, sequences).
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
        dm = trainer.datamodule
        if dm is None:
            raise ValueError(
                "SADCallback on a language model needs a datamodule (its first validation, else"
                " training, sequences are the probe); pass datamodule=... to fit"
            )
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
        results = {
            "experiment": "sad_training",
            "threshold": self.threshold,
            "recon_tol": self.recon_tol,
            "seed": self.seed,
            "n_probe": self.n_probe,
            "null_draws": self.null_draws,
            "null_at": self.null_at,
            "null_probe": self.null_probe,
            "summary": nan_to_none(summary),
            "history": nan_to_none(self.history),
        }
        name = self.results_name or ("results.json" if self._is_lm(pl_module) else "sad_results.json")
        write_results(trainer, results, name)
        if trainer.is_global_zero:
            plot_training(trainer, self.history)


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


# --- figures ------------------------------------------------------------------------------------------
def plot_training(trainer: pl.Trainer, history: list[dict], name: str = "sad_training") -> None:
    """Sparsity against the step: the heads (thin) and their mean (thick) in the singular basis, the
    matched-spectrum null (mean over draws, and its 5th percentile dashed) and the Haar-rotated control;
    below, the fraction of heads sparser than their null (at the steps the null was measured)."""
    series = [
        ("sparsity", "tab:blue", "singular basis"),
        ("sparsity_null", "tab:green", "matched-spectrum null (mean)"),
        ("sparsity_rotated", "tab:orange", "Haar-rotated control (secondary)"),
    ]
    has_null = any("sparsity_null" in h for h in history)
    fig, axes = plt.subplots(
        2 if has_null else 1,
        1,
        figsize=(6.4, 6.0 if has_null else 4.0),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 1]} if has_null else None,
    )
    ax = axes[0, 0]
    for key, color, label in series:
        at = [h for h in history if key in h]  # the matched null may be measured at some steps only
        if not at:
            continue
        x = [h["step"] for h in at]
        v = torch.tensor([h[key] for h in at], dtype=torch.float64)
        for j in range(v.shape[1]):
            ax.plot(x, v[:, j], color=color, alpha=0.2, lw=0.7, marker="." if len(at) < 3 else None)
        ax.plot(
            x, v.nanmean(1), color=color, lw=2.5, marker="o" if len(at) < 3 else None, label=f"{label}, mean over heads"
        )
    if has_null:
        at = [h for h in history if "sparsity_null_p05" in h]
        p05 = torch.tensor([h["sparsity_null_p05"] for h in at], dtype=torch.float64).nanmean(1)
        ax.plot(
            [h["step"] for h in at],
            p05,
            color="tab:green",
            lw=1.5,
            ls="--",
            marker="_" if len(at) < 3 else None,
            label="null 5th percentile, mean over heads",
        )
    ax.set_xscale("symlog", linthresh=10)
    ax.set_ylabel("Rolls–Tovee sparsity (lower = sparser)")
    ax.set_title("SAD sparsity of every head during training")
    ax.legend(loc="best", fontsize=7)
    if has_null:
        b = axes[1, 0]
        at = [h for h in history if "fraction_sparser_than_null" in h]
        b.plot([h["step"] for h in at], [h["fraction_sparser_than_null"] for h in at], color="black", marker=".")
        b.set_ylim(-0.02, 1.02)
        b.set_ylabel("fraction of heads\nbelow null p05", fontsize=8)
    axes[-1, 0].set_xlabel("training step (linear below 10, log above)")
    save_figure(trainer, fig, name)


def _grid(results: dict, key: str) -> np.ndarray:
    s = results["summary"]
    grid = np.full((results["n_layers"], results["n_heads_per_layer"]), np.nan)
    for r in results["heads"]:
        if r["n_pairs"] >= s["min_pairs"] and r.get(key) is not None:
            grid[r["layer"], r["head"]] = r[key]
    return grid


def plot_head_heatmap(trainer: pl.Trainer, results: dict, name: str = "sad_heatmap") -> None:
    """Layer x head maps: sparsity in the singular basis, the matched-spectrum null's 5th percentile, the pair
    null and the rotated control (one colour scale), then null p05 - sparsity (> 0: sparser than the null)."""
    panels = [("sparsity", "singular basis")]
    if "sparsity_null_p05" in results["heads"][0]:
        panels.append(("sparsity_null_p05", "matched null, 5th pct"))
    if "sparsity_unattended" in results["heads"][0]:
        panels.append(("sparsity_unattended", "pair null (unattended)"))
    panels.append(("sparsity_rotated", "rotated control"))
    grids = [_grid(results, k) for k, _ in panels]
    diff = grids[1] - grids[0] if panels[1][0] == "sparsity_null_p05" else grids[-1] - grids[0]
    n_layers, n_heads = grids[0].shape
    fig, axes = plt.subplots(
        1, len(panels) + 1, figsize=(2.4 + 0.9 * n_heads * (len(panels) + 1) / 2, 0.8 + 0.2 * n_layers), sharey=True
    )
    lo, hi = np.nanmin(np.stack(grids)), np.nanmax(np.stack(grids))
    span = np.nanmax(np.abs(diff))
    for ax, grid, (_, title) in zip(axes, grids, panels):
        im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=lo, vmax=hi)
        ax.set_title(title, fontsize=8)
    fig.colorbar(im, ax=axes[len(panels) - 1], fraction=0.05)
    im = axes[-1].imshow(diff, aspect="auto", cmap="RdBu", vmin=-span, vmax=span)
    axes[-1].set_title(f"{'null p05' if len(panels) > 2 else 'rotated'} - singular (> 0: sparser)", fontsize=8)
    fig.colorbar(im, ax=axes[-1], fraction=0.05)
    for ax in axes:
        ax.set_xlabel("head")
        ax.set_xticks(range(n_heads))
        ax.tick_params(labelsize=6)
    axes[0].set_ylabel("layer")
    s = results["summary"]
    parts = [
        f"{s[f'n_heads_sparser_than_{k}']}/{s['n_heads_eligible']} sparser than {label}"
        for k, label in (("null", "matched null"), ("unattended", "pair null"), ("rotated", "rotated"))
        if f"n_heads_sparser_than_{k}" in s
    ]
    fig.suptitle(f"{results['model']}: " + "; ".join(parts), fontsize=9)
    save_figure(trainer, fig, name)


def plot_n_recon(trainer: pl.Trainer, results: dict, name: str = "sad_n_recon") -> None:
    """Pooled N_recon distributions (singular basis, matched null over all draws, pair null, rotated) and
    the per-head medians."""
    s = results["summary"]
    kinds = [
        (suffix, label)
        for suffix, label in (
            ("", "singular basis"),
            ("_null", "matched null"),
            ("_unattended", "pair null"),
            ("_rotated", "rotated control"),
        )
        if f"n_recon_hist{suffix}" in s
    ]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(kinds)
    k = len(s["n_recon_hist"])
    x = np.arange(1, k + 1)
    for j, (suffix, label) in enumerate(kinds):
        hist = np.asarray(s[f"n_recon_hist{suffix}"], dtype=float)
        a.bar(
            x - 0.4 + width * (j + 0.5),
            hist / max(hist.sum(), 1.0),
            width=width,
            label=f"{label} (median {s[f'n_recon_median{suffix}']:g})",
        )
    a.set_xlim(0.3, min(k, 32) + 0.7)
    a.set_xlabel("N_recon (directions needed to reach l~)")
    a.set_ylabel("fraction of pairs")
    a.legend(fontsize=7)
    a.set_title(f"{s['n_pairs']} attended pairs, {s['n_heads_eligible']} heads", fontsize=9)
    eligible = [r for r in results["heads"] if r["n_pairs"] >= s["min_pairs"]]
    meds = {
        label: [r[f"n_recon_median{suffix}"] for r in eligible if r.get(f"n_recon_median{suffix}") is not None]
        for suffix, label in kinds
    }
    top = max([1.0] + [max(v) for v in meds.values() if v])
    bins = np.arange(0.5, top + 1.5, 1.0)
    for label, v in meds.items():
        b.hist(v, bins=bins, histtype="step", lw=1.5, label=label)
    b.set_xlabel("median N_recon of a head")
    b.set_ylabel("heads")
    b.legend(fontsize=7)
    save_figure(trainer, fig, name)
