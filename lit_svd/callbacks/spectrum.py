"""Singular-value spectra during training (``SpectrumCallback``).

Every ``every_n_steps`` optimiser steps (and at the start and the end of fit) the spectra of every head's
QK and OV circuits (factored, ``lit_svd.analysis.spectrum``) and of the MLP maps of the chosen layers are
computed from the live weights (no data). The weights are the same on every DDP rank, so rank zero alone
computes and logs them.

TensorBoard: ``spectrum/<matrix>/layer<l>/head<h>/{s1,effective_rank,top<k>_energy}`` (MLP maps:
``spectrum/<matrix>/layer<l>/...``; singular values are numbered from 1), the per-matrix means
``spectrum/<matrix>/mean_effective_rank``, and the image ``spectrum/values`` (every spectrum of the step,
log scale) at every measured step. At the end: ``results.json["spectrum"]`` (the history) and
``spectrum_training.png`` (mean effective rank of each matrix kind per layer against the step).
"""
from __future__ import annotations

from lit_svd.analysis.spectrum import spectrum_rows
from lit_svd.callbacks.training import StepCallback, log_scalars, merge_results
from lit_svd.output import log_figure, save_figure


class SpectrumCallback(StepCallback):
    """Log the singular values, effective rank and top-k energy of every head's QK / OV and of the MLP maps.

    Args:
        every_n_steps: measure every this many optimiser steps (and at the start and the end).
        layers: layers to measure (null: every layer).
        top_k: the k of the top-k energy fraction.
        figures: log the spectrum image at every measured step (the final PNGs are written either way).
        keep_values: keep the singular values themselves in results.json (else only the summaries).
        write_results: write the history into results.json and spectrum_training.png at the end of fit.
    """

    def __init__(self, every_n_steps: int = 250, layers: list[int] | None = None, top_k: int = 4,
                 figures: bool = True, keep_values: bool = True, write_results: bool = True):
        super().__init__(every_n_steps)
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k={top_k!r} must be a positive integer")
        self.layers = None if layers is None else [int(l) for l in layers]
        self.top_k, self.figures, self.keep_values, self.write = top_k, figures, keep_values, write_results

    def measure(self, trainer, module) -> dict:
        if not trainer.is_global_zero:
            return {}
        view = module.view
        layers = list(range(view.n_layers)) if self.layers is None else [view.check_layer(l) for l in self.layers]
        rows = spectrum_rows(view, layers, self.top_k)
        step = trainer.global_step
        log_scalars(trainer, scalars(rows, self.top_k), step)
        if self.figures:
            log_figure(trainer, values_figure(rows, step), "spectrum/values", step)
        if not self.keep_values:
            rows = [{k: v for k, v in r.items() if k != "S"} for r in rows]
        return {"rows": rows}

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if not self.write or not trainer.is_global_zero or not self.history:
            return
        merge_results(trainer, "spectrum", {"top_k": self.top_k, "history": self.history})
        save_figure(trainer, history_figure(self.history), "spectrum_training")
        if "S" in self.history[-1]["rows"][0]:
            save_figure(trainer, values_figure(self.history[-1]["rows"], self.history[-1]["step"]), "spectrum_values")


def tag(row: dict) -> str:
    head = "" if row["head"] is None else f"/head{row['head']}"
    return f"spectrum/{row['matrix']}/layer{row['layer']}{head}"


def scalars(rows: list[dict], top_k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    by_matrix: dict[str, list[float]] = {}
    for r in rows:
        out[f"{tag(r)}/s1"] = r["S"][0]
        out[f"{tag(r)}/effective_rank"] = r["effective_rank"]
        out[f"{tag(r)}/top{top_k}_energy"] = r["top_k_energy"]
        by_matrix.setdefault(r["matrix"], []).append(r["effective_rank"])
    for m, v in by_matrix.items():
        out[f"spectrum/{m}/mean_effective_rank"] = sum(v) / len(v)
    return out


def values_figure(rows: list[dict], step: int):
    """Every spectrum of one step, s_i against i (from 1), log scale; one panel per matrix kind."""
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r["matrix"] for r in rows))
    layers = sorted({r["layer"] for r in rows})
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.0 * len(kinds), 2.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for r in (r for r in rows if r["matrix"] == kind):
            color = cmap(layers.index(r["layer"]) / max(1, len(layers) - 1))
            ax.semilogy(range(1, len(r["S"]) + 1), [max(s, 1e-12) for s in r["S"]], color=color, lw=0.8, alpha=0.8)
        ax.set_title(f"{kind} (step {step})", fontsize=9)
        ax.set_xlabel("i (s_1 largest)")
    axes[0][0].set_ylabel("singular value s_i (colour: layer)")
    fig.tight_layout()
    return fig


def history_figure(history: list[dict]):
    """Mean effective rank of each matrix kind, per layer, against the step."""
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    first = history[0]["rows"]
    kinds = list(dict.fromkeys(r["matrix"] for r in first))
    layers = sorted({r["layer"] for r in first})
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.0 * len(kinds), 2.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for l in layers:
            ys = []
            for h in history:
                v = [r["effective_rank"] for r in h["rows"] if r["matrix"] == kind and r["layer"] == l]
                ys.append(sum(v) / len(v))
            ax.plot(steps, ys, marker=".", label=f"layer {l}")
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel("training step")
    axes[0][0].set_ylabel("effective rank (mean over heads)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig
