"""Singular-value spectra during training (``SpectrumCallback``).

Every ``every_n_steps`` optimiser steps (and at the start and the end of fit) the spectra of every head's
QK and OV circuits (factored, ``lit_svd.analysis.spectrum``) and of the MLP maps of the chosen layers are
computed from the live weights (no data). The weights are the same on every DDP rank, so rank zero alone
computes and logs them.

Tracked directions: the top ``track`` directions of every matrix at the first measurement are named
``d1, d2, ...`` (``d1``: sigma_1 then) and followed from measurement to measurement by matching each SVD to
the previous one (``lit_svd.analysis.tracking``: block-aware, |cos| of the joint singular vectors), so
``d2/sigma`` is the same direction's singular value at every step even when values cross; ``match_cos`` is
its |cos| to its predecessor (block members: the block's principal-angle cosine) and the counts say how
many kept their identity (``kept``), only as a block (``block``) or were replaced (``lost``, |cos| < 0.9).

TensorBoard: ``spectrum/<matrix>/layer<l>/head<h>/{effective_rank,top<k>_energy}`` (MLP maps:
``spectrum/<matrix>/layer<l>/...``), per tracked direction ``.../d<i>/{sigma,match_cos}`` (and
``block_sigma_min`` / ``block_sigma_max`` while it lies in a block), ``.../directions_{kept,block,lost}``,
the per-matrix means ``spectrum/<matrix>/mean_effective_rank``, and with ``figures`` the image
``spectrum/values`` (every spectrum of the step, log scale) at every measured step. At the end:
``results.json["spectrum"]`` (the history, each row with its ``tracked`` record), ``spectrum_training.png``
(mean effective rank per layer against the step), ``spectrum_tracked.png`` (tracked singular values and
the identity counts against the step) and, with ``figures``, ``spectrum_values.png`` (the last step's spectra).
"""

from __future__ import annotations

from lit_svd.analysis.spectrum import row_key, spectrum_rows
from lit_svd.analysis.tracking import MIN_COS, DirectionTrack, track_scalars
from lit_svd.callbacks.training import StepCallback, log_scalars, merge_results
from lit_svd.output import log_figure, save_figure


class SpectrumCallback(StepCallback):
    """Log the singular values, effective rank and top-k energy of every head's QK / OV and of the MLP maps.

    Args:
        every_n_steps: measure every this many optimiser steps (and at the start and the end).
        layers: layers to measure (null: every layer).
        top_k: the k of the top-k energy fraction.
        track: how many leading directions of each matrix to follow over the steps (0: none).
        min_cos: |cos| to its predecessor below which a tracked direction counts as a new one.
        figures: also log the spectrum image at every measured step and write the last one as
            spectrum_values.png (off by default: drawing it costs ~20x computing the spectra of the tiny LM;
            spectrum_training.png and spectrum_tracked.png are written either way).
        keep_values: keep the singular values themselves in results.json (else only the summaries).
        write_results: write the history into results.json and spectrum_training.png at the end of fit.
    """

    def __init__(
        self,
        every_n_steps: int = 250,
        layers: list[int] | None = None,
        top_k: int = 4,
        track: int = 4,
        min_cos: float = MIN_COS,
        figures: bool = False,
        keep_values: bool = True,
        write_results: bool = True,
    ):
        super().__init__(every_n_steps)
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k={top_k!r} must be a positive integer")
        if not isinstance(track, int) or track < 0:
            raise ValueError(f"track={track!r} must be an integer >= 0")
        DirectionTrack(None, min_cos=min_cos)  # checks min_cos
        self.layers = None if layers is None else [int(l) for l in layers]
        self.top_k, self.figures, self.keep_values, self.write = top_k, figures, keep_values, write_results
        self.track, self.min_cos = track, min_cos
        self.tracks: dict[tuple, DirectionTrack] = {}

    def measure(self, trainer, module) -> dict:
        if not trainer.is_global_zero:
            return {}
        view = module.view
        layers = list(range(view.n_layers)) if self.layers is None else [view.check_layer(l) for l in self.layers]
        svds: dict[tuple, object] = {}
        rows = spectrum_rows(view, layers, self.top_k, svds if self.track else None)
        step = trainer.global_step
        self.follow(rows, svds, step)
        log_scalars(trainer, scalars(rows, self.top_k), step)
        if self.figures:
            log_figure(trainer, values_figure(rows, step), "spectrum/values", step)
        if not self.keep_values:
            rows = [{k: v for k, v in r.items() if k != "S"} for r in rows]
        return {"rows": rows}

    def follow(self, rows: list[dict], svds: dict, step: int) -> None:
        """Match each row's SVD to its previous measurement and store the ``tracked`` record in the row."""
        for r in rows:
            key = row_key(r)
            if key in svds:
                track = self.tracks.setdefault(key, DirectionTrack(self.track, min_cos=self.min_cos))
                r["tracked"] = track.update(step, svds[key]).as_dict()

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if not self.write or not trainer.is_global_zero or not self.history:
            return
        merge_results(trainer, "spectrum", {"top_k": self.top_k, "history": self.history})
        save_figure(trainer, history_figure(self.history), "spectrum_training")
        if "tracked" in self.history[-1]["rows"][0]:
            save_figure(trainer, tracked_figure(self.history, self.min_cos), "spectrum_tracked")
        if self.figures and "S" in self.history[-1]["rows"][0]:
            save_figure(trainer, values_figure(self.history[-1]["rows"], self.history[-1]["step"]), "spectrum_values")


def tag(row: dict) -> str:
    head = "" if row["head"] is None else f"/head{row['head']}"
    return f"spectrum/{row['matrix']}/layer{row['layer']}{head}"


def scalars(rows: list[dict], top_k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    by_matrix: dict[str, list[float]] = {}
    for r in rows:
        if "tracked" in r:
            out.update(track_scalars(tag(r), _step(r["tracked"])))
        out[f"{tag(r)}/effective_rank"] = r["effective_rank"]
        out[f"{tag(r)}/top{top_k}_energy"] = r["top_k_energy"]
        by_matrix.setdefault(r["matrix"], []).append(r["effective_rank"])
    for m, v in by_matrix.items():
        out[f"spectrum/{m}/mean_effective_rank"] = sum(v) / len(v)
    return out


def _step(record: dict):
    from lit_svd.analysis.tracking import TrackStep

    return TrackStep(**{k: record[k] for k in TrackStep.__dataclass_fields__})


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
        ax.set_xlabel("i (sigma_1 largest)")
    axes[0][0].set_ylabel("singular value sigma_i (colour: layer)")
    fig.subplots_adjust(wspace=0.4, hspace=0.3)  # fixed spacing: tight_layout would draw the figure once more
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
    fig.subplots_adjust(wspace=0.4, hspace=0.3)  # fixed spacing: tight_layout would draw the figure once more
    return fig


def tracked_figure(history: list[dict], min_cos: float = MIN_COS):
    """One panel per matrix kind: the tracked singular values d1, d2, ... of the last layer's first head (or MLP
    map) against the step (x: identity lost at that step, open circle: inside a block); a last panel: per
    matrix kind, the fraction of all its tracked directions that kept their identity since the previous step."""
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    first = history[0]["rows"]
    kinds = list(dict.fromkeys(r["matrix"] for r in first))
    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(2.8 * (len(kinds) + 1), 2.9), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        shown = max((r for r in first if r["matrix"] == kind), key=lambda r: (r["layer"], -(r["head"] or 0)))
        key = (kind, shown["layer"], shown["head"])
        recs = [next(r["tracked"] for r in h["rows"] if (r["matrix"], r["layer"], r["head"]) == key) for h in history]
        for i in range(len(recs[0]["sigma"])):
            ys = [r["sigma"][i] for r in recs]
            (line,) = ax.plot(steps, ys, marker=".", lw=1, label=f"d{i + 1}")
            lost = [(x, y) for x, y, r in zip(steps, ys, recs) if r["state"][i] == "lost"]
            block = [(x, y) for x, y, r in zip(steps, ys, recs) if r["state"][i] != "lost" and r["block_size"][i] > 1]
            if lost:
                ax.plot(*zip(*lost), "x", color="black", ms=7)
            if block:
                ax.plot(*zip(*block), "o", mfc="none", color=line.get_color(), ms=7)
        ax.set_title(f"{kind}, {shown['name']}", fontsize=9)
        ax.set_xlabel("training step")
    b = axes[0][-1]
    for kind in kinds:
        frac = []
        for h in history:
            rs = [r["tracked"] for r in h["rows"] if r["matrix"] == kind]
            frac.append(sum(r["n_kept"] for r in rs) / max(1, sum(len(r["state"]) for r in rs)))
        b.plot(steps, frac, marker=".", label=kind)
    b.set_ylim(-0.02, 1.02)
    b.set_title(f"identity kept (|cos| >= {min_cos:g}, isolated)", fontsize=8)
    b.set_xlabel("training step")
    b.legend(fontsize=7)
    axes[0][0].set_ylabel("sigma of tracked direction\n(x: new direction, o: in a block)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.subplots_adjust(wspace=0.4)
    return fig
