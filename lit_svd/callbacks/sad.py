"""SAD during training (``SADCallback``) and the SAD figures.

``SADCallback`` measures, every ``every_n_steps`` optimiser steps (and before the first and after the
last), the mean Rolls–Tovee sparsity of each head's analysed pairs in its singular basis and in its
Haar-rotated control basis, on a fixed probe set:

* language models (a module with a ``view``: ``LanguageModelModule``, ``PretrainedLMModule``): the first
  ``n_probe`` sequences of the validation loader (training loader if there is none), every head;
* the toy model (``ToyAlignmentModule``): the first ``n_probe`` samples of the current batch, one head
  per ensemble instance (query token 0 attending over the key tokens).

Scalars go to TensorBoard as ``sad/<head>/sparsity`` and ``sad/<head>/sparsity_rotated`` (plus their
means); at the end of fit rank zero writes ``results.json`` (``"experiment": "sad_training"``; the toy:
``sad_results.json``) and ``sad_training.png``.
"""
from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from lit_svd.analysis.sad import (DEFAULT_RECON_TOL, QKHeads, attention_inputs, check_threshold,
                                  check_tolerance, decompose_layer, layer_bases, rotated_bases, sad_pairs)
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


def head_means(head: Tensor, values: Tensor, n_heads: int) -> Tensor:
    """Mean of ``values`` per head index (NaN for heads without pairs)."""
    total = torch.zeros(n_heads, dtype=torch.float64).index_add_(0, head.cpu(), values.double().cpu())
    count = torch.zeros(n_heads, dtype=torch.float64).index_add_(0, head.cpu(), torch.ones(len(head), dtype=torch.float64))
    return total / count


@torch.no_grad()
def lm_head_sparsity(view, ids: Tensor, mask: Tensor, threshold: float | None, tol: float, seed: int) -> dict[str, list]:
    """Per head (every layer) mean sparsity, rotated control and pair count on one probe batch."""
    X = attention_inputs(view, ids, mask, list(range(view.n_layers)))
    out = {"name": [], "sparsity": [], "sparsity_rotated": [], "n_pairs": []}
    for layer in range(view.n_layers):
        st = decompose_layer(layer_bases(view, layer, seed=seed), X[layer], mask, threshold, tol)
        sp, rot = head_means(st.head, st.sparsity, view.n_heads), head_means(st.head, st.sparsity_rotated, view.n_heads)
        n = torch.bincount(st.head.cpu(), minlength=view.n_heads)
        for h in range(view.n_heads):
            out["name"].append(f"L{layer}H{h}")
            out["sparsity"].append(sp[h].item())
            out["sparsity_rotated"].append(rot[h].item())
            out["n_pairs"].append(int(n[h]))
    return out


@torch.no_grad()
def toy_head_sparsity(module, feats: Tensor, threshold: float | None, tol: float, seed: int) -> dict[str, list]:
    """Per toy instance: the query token (0) attending over the key tokens, in the instance's own features."""
    W_Q, W_K = module.head_weights()  # [I, H, D]
    W = module.W.detach()
    out = {"name": [], "sparsity": [], "sparsity_rotated": [], "n_pairs": []}
    for i, d_head in enumerate(module.d_heads):
        x = torch.einsum("btn,dn->btd", feats[i].float(), W[i].float())  # [B, 1 + m, D]
        qk = QKHeads(W_Q[i, :d_head].T[None].float(), W_K[i, :d_head].T[None].float())
        U = qk.basis()
        xq, xk = x[:, :1], x[:, 1:]
        visible = torch.ones(x.shape[0], 1, xk.shape[1], dtype=torch.bool, device=x.device)
        st = sad_pairs(xq, xk, visible, qk, U, rotated_bases(U, seed + i), threshold, tol)
        n = len(st)
        out["name"].append(f"instance{i}")
        out["sparsity"].append(st.sparsity.mean().item() if n else float("nan"))
        out["sparsity_rotated"].append(st.sparsity_rotated.mean().item() if n else float("nan"))
        out["n_pairs"].append(n)
    return out


class SADCallback(Callback):
    """Track SAD sparsity against the rotated control over training (see the module docstring).

    Args:
        every_n_steps: measure every this many optimiser steps (and at the start and the end).
        log_spaced: also measure at steps 1, 2, 4, 8, ... (the early, fast part of training).
        n_probe: probe sequences (LM) or samples (toy).
        threshold: attention-weight threshold of an analysed pair, as ``SADAnalysisModule``.
        recon_tol: N_recon tolerance, as ``SADAnalysisModule``.
        seed: seeds the Haar rotation of the control basis.
        write_results: write the results and ``sad_training.png`` at the end of fit.
        results_name: the results file; default ``results.json`` for language models and
            ``sad_results.json`` for the toy model (whose own alignment callback writes ``results.json``).
    """

    def __init__(self, every_n_steps: int = 100, n_probe: int = 16, threshold: float | None = None,
                 recon_tol: float = DEFAULT_RECON_TOL, seed: int = 0, log_spaced: bool = True,
                 write_results: bool = True, results_name: str | None = None):
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r} must be a positive integer")
        if not isinstance(n_probe, int) or n_probe < 1:
            raise ValueError(f"n_probe={n_probe!r} must be a positive integer")
        self.every_n_steps, self.n_probe = every_n_steps, n_probe
        self.threshold = check_threshold(threshold)
        self.recon_tol = check_tolerance(recon_tol)
        self.seed, self.write, self.log_spaced = seed, write_results, log_spaced
        self.results_name = results_name
        self.history: list[dict] = []
        self.probe: tuple[Tensor, Tensor] | None = None

    # --- probes ------------------------------------------------------------------------------------
    @staticmethod
    def _is_lm(module) -> bool:
        return hasattr(module, "view") and not hasattr(module, "head_weights")

    def _lm_probe(self, trainer: pl.Trainer) -> tuple[Tensor, Tensor]:
        dm = trainer.datamodule
        if dm is None:
            raise ValueError("SADCallback on a language model needs a datamodule (its first validation, else"
                             " training, sequences are the probe); pass datamodule=... to fit")
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

    def _measure(self, trainer: pl.Trainer, module, feats: Tensor | None = None) -> None:
        step = trainer.global_step
        if self.history and self.history[-1]["step"] == step:
            return
        was_training = module.training
        module.eval()
        try:
            if self._is_lm(module):
                if self.probe is None:
                    self.probe = self._lm_probe(trainer)
                ids, mask = (t.to(module.device) for t in self.probe)
                if hasattr(module, "map_ids"):  # a model trained on a compacted vocabulary
                    ids = module.map_ids(ids)
                res = lm_head_sparsity(module.view, ids, mask, self.threshold, self.recon_tol, self.seed)
            else:
                if feats is None:
                    return
                res = toy_head_sparsity(module, feats[:, : self.n_probe], self.threshold, self.recon_tol, self.seed)
        finally:
            module.train(was_training)
        sp, rot = torch.tensor(res["sparsity"]), torch.tensor(res["sparsity_rotated"])
        entry = {"step": step, **res, "mean_sparsity": sp.nanmean().item(), "mean_sparsity_rotated": rot.nanmean().item()}
        self.history.append(entry)
        scalars = {"sad/mean_sparsity": entry["mean_sparsity"], "sad/mean_sparsity_rotated": entry["mean_sparsity_rotated"]}
        for name, s, r in zip(res["name"], res["sparsity"], res["sparsity_rotated"]):
            scalars[f"sad/{name}/sparsity"] = s
            scalars[f"sad/{name}/sparsity_rotated"] = r
        for logger in trainer.loggers:
            logger.log_metrics({k: v for k, v in scalars.items() if v == v}, step=step)

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
        if self._due(trainer.global_step):
            self._measure(trainer, pl_module, None if self._is_lm(pl_module) else batch)
        self._last_batch = batch

    def on_train_end(self, trainer, pl_module) -> None:
        self._measure(trainer, pl_module, None if self._is_lm(pl_module) else getattr(self, "_last_batch", None))
        if not self.write or not self.history:
            return
        first, last = self.history[0], self.history[-1]
        results = {"experiment": "sad_training", "threshold": self.threshold, "recon_tol": self.recon_tol,
                   "seed": self.seed, "n_probe": self.n_probe,
                   "summary": {"first_step": first["step"], "last_step": last["step"],
                               "mean_sparsity_first": first["mean_sparsity"], "mean_sparsity_last": last["mean_sparsity"],
                               "mean_sparsity_rotated_first": first["mean_sparsity_rotated"],
                               "mean_sparsity_rotated_last": last["mean_sparsity_rotated"]},
                   "history": nan_to_none(self.history)}
        name = self.results_name or ("results.json" if self._is_lm(pl_module) else "sad_results.json")
        write_results(trainer, results, name)
        if trainer.is_global_zero:
            plot_training(trainer, self.history)


# --- figures ------------------------------------------------------------------------------------------
def plot_training(trainer: pl.Trainer, history: list[dict], name: str = "sad_training") -> None:
    """Mean sparsity and rotated control against the step, per head thin and averaged thick."""
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    sp = torch.tensor([h["sparsity"] for h in history])
    rot = torch.tensor([h["sparsity_rotated"] for h in history])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for j in range(sp.shape[1]):
        ax.plot(steps, sp[:, j], color="tab:blue", alpha=0.25, lw=0.8)
        ax.plot(steps, rot[:, j], color="tab:orange", alpha=0.25, lw=0.8)
    ax.plot(steps, sp.nanmean(1), color="tab:blue", lw=2.5, label="singular basis (mean over heads)")
    ax.plot(steps, rot.nanmean(1), color="tab:orange", lw=2.5, label="Haar-rotated control")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("training step (linear below 10, log above)")
    ax.set_ylabel("Rolls–Tovee sparsity (lower = sparser)")
    ax.set_title("SAD sparsity of every head during training")
    ax.legend(loc="best", fontsize=8)
    save_figure(trainer, fig, name)


def plot_head_heatmap(trainer: pl.Trainer, results: dict, n_layers: int, n_heads: int,
                      name: str = "sad_heatmap") -> None:
    """Layer x head maps of mean sparsity, its rotated control, and their difference."""
    import matplotlib.pyplot as plt

    import numpy as np

    grids = {k: np.full((n_layers, n_heads), np.nan) for k in ("sparsity", "sparsity_rotated")}
    for r in results["heads"]:
        if r["n_pairs"] >= results["summary"]["min_pairs"]:
            for k in grids:
                grids[k][r["layer"], r["head"]] = r[k]
    diff = grids["sparsity_rotated"] - grids["sparsity"]
    fig, axes = plt.subplots(1, 3, figsize=(3 + 1.1 * n_heads, 0.6 + 0.22 * n_layers), sharey=True)
    both = np.concatenate([grids["sparsity"], grids["sparsity_rotated"]])
    lo, hi = np.nanmin(both), np.nanmax(both)
    span = np.nanmax(np.abs(diff))
    for ax, (title, grid, kw) in zip(axes, [
            ("sparsity (singular basis)", grids["sparsity"], dict(cmap="viridis", vmin=lo, vmax=hi)),
            ("sparsity (rotated control)", grids["sparsity_rotated"], dict(cmap="viridis", vmin=lo, vmax=hi)),
            ("rotated - singular (> 0: sparser)", diff, dict(cmap="RdBu", vmin=-span, vmax=span))]):
        im = ax.imshow(grid, aspect="auto", origin="upper", **kw)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("head")
        fig.colorbar(im, ax=ax, fraction=0.05)
    axes[0].set_ylabel("layer")
    s = results["summary"]
    frac = s["fraction_sparser_than_rotated"]
    fig.suptitle(f"{results['model']}: {s['n_heads_sparser_than_rotated']}/{s['n_heads_eligible']} heads"
                 f" sparser than control ({100 * frac:.0f}%)" if frac is not None else results["model"], fontsize=10)
    save_figure(trainer, fig, name)


def plot_n_recon(trainer: pl.Trainer, results: dict, name: str = "sad_n_recon") -> None:
    """Pooled N_recon histograms (singular basis vs rotated control) and the per-head medians."""
    import matplotlib.pyplot as plt

    s = results["summary"]
    hist, hist_rot = torch.tensor(s["n_recon_hist"], dtype=torch.float64), torch.tensor(s["n_recon_hist_rotated"], dtype=torch.float64)
    k = len(hist)
    x = torch.arange(1, k + 1)
    total = max(hist.sum().item(), 1.0)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(x - 0.2, hist / total, width=0.4, label=f"singular basis (median {s['n_recon_median']:g})")
    a.bar(x + 0.2, hist_rot / total, width=0.4, label=f"rotated control (median {s['n_recon_median_rotated']:g})")
    a.set_xlim(0.3, min(k, 32) + 0.7)
    a.set_xlabel("N_recon (directions needed to reach l~)")
    a.set_ylabel("fraction of analysed pairs")
    a.legend(fontsize=8)
    a.set_title(f"{s['n_pairs']} pairs, {s['n_heads_eligible']} heads", fontsize=9)
    med = [r["n_recon_median"] for r in results["heads"] if r["n_pairs"] >= s["min_pairs"]]
    med_rot = [r["n_recon_median_rotated"] for r in results["heads"] if r["n_pairs"] >= s["min_pairs"]]
    bins = torch.arange(0.5, max(med + med_rot + [1]) + 1.5, 1.0).numpy()
    b.hist(med, bins=bins, alpha=0.7, label="singular basis")
    b.hist(med_rot, bins=bins, alpha=0.7, label="rotated control")
    b.set_xlabel("median N_recon of a head")
    b.set_ylabel("heads")
    b.legend(fontsize=8)
    save_figure(trainer, fig, name)
