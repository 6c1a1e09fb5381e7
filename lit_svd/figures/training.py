"""Figures of what the during-training callbacks measured (``TrainingResult``): SAD sparsity against the
step, mount lifts against the step and the depth, spectra, effective ranks and tracked directions."""

from __future__ import annotations

import matplotlib

from lit_svd.analysis.mounts import STRATEGIES
from lit_svd.analysis.tracking import MIN_COS
from lit_svd.figures.base import array, nanmean, new_figure
from lit_svd.results.base import draws
from lit_svd.results.training import TrainingResult


@draws(TrainingResult)
def figures(result: TrainingResult) -> dict:
    """The PNGs of a training run, for the sections it has: ``sad_training``; ``mounts_training`` and, with
    the mounts callback's ``figures``, ``mounts_depth``; ``spectrum_training``, ``spectrum_tracked`` (with
    tracked directions) and, with the spectrum callback's ``figures``, ``spectrum_values``."""
    out = {}
    if result.history:
        out["sad_training"] = sad_training(result.history)
    mounts = result.mounts_training
    if mounts and mounts.get("history"):
        out["mounts_training"] = mounts_history(mounts["history"])
        if mounts.get("figures"):
            last = mounts["history"][-1]
            out["mounts_depth"] = mounts_depth(last["rows"], last["step"])
    spectrum = result.spectrum
    if spectrum and spectrum.get("history"):
        history = spectrum["history"]
        out["spectrum_training"] = spectrum_history(history)
        if "tracked" in history[-1]["rows"][0]:
            out["spectrum_tracked"] = spectrum_tracked(history, spectrum.get("min_cos", MIN_COS))
        if spectrum.get("figures") and "S" in history[-1]["rows"][0]:
            out["spectrum_values"] = spectrum_values(history[-1]["rows"], history[-1]["step"])
    return out


def sad_training(history: list[dict]):
    """Sparsity against the step: the heads (thin) and their mean (thick) in the singular basis, the
    matched-spectrum null (mean over draws, and its 5th percentile dashed) and the Haar-rotated control;
    below, the fraction of heads sparser than their null (at the steps the null was measured)."""
    series = [
        ("sparsity", "tab:blue", "singular basis"),
        ("sparsity_null", "tab:green", "matched-spectrum null (mean)"),
        ("sparsity_rotated", "tab:orange", "Haar-rotated control (secondary)"),
    ]
    has_null = any("sparsity_null" in h for h in history)
    fig, axes = new_figure(
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
        v = array([h[key] for h in at])
        for j in range(v.shape[1]):
            ax.plot(x, v[:, j], color=color, alpha=0.2, lw=0.7, marker="." if len(at) < 3 else None)
        ax.plot(
            x,
            nanmean(v, 1),
            color=color,
            lw=2.5,
            marker="o" if len(at) < 3 else None,
            label=f"{label}, mean over heads",
        )
    if has_null:
        at = [h for h in history if "sparsity_null_p05" in h]
        p05 = nanmean([h["sparsity_null_p05"] for h in at], 1)
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
        b.plot([h["step"] for h in at], array([h["fraction_sparser_than_null"] for h in at]), color="black", marker=".")
        b.set_ylim(-0.02, 1.02)
        b.set_ylabel("fraction of heads\nbelow null p05", fontsize=8)
    axes[-1, 0].set_xlabel("training step (linear below 10, log above)")
    return fig


def mounts_depth(rows: list[dict], step: int):
    """Mean lift of each strategy against the layer, one panel per site."""
    sites = list(dict.fromkeys(r["site"] for r in rows))
    fig, axes = new_figure(1, len(sites), figsize=(3.6 * len(sites), 3.0), squeeze=False)
    for ax, site in zip(axes[0], sites):
        mine = sorted((r for r in rows if r["site"] == site), key=lambda r: r["layer"])
        for s in STRATEGIES:
            ax.plot([r["layer"] for r in mine], [r[f"lift_{s}"] for r in mine], marker="o", label=s)
        ax.set_title(f"site {site}, step {step}", fontsize=9)
        ax.set_xlabel("layer")
        ax.set_ylabel("lift over random reference")
    axes[0][0].legend(fontsize=7)
    fig.subplots_adjust(wspace=0.4, hspace=0.3)  # fixed spacing: tight_layout would draw the figure once more
    return fig


def mounts_history(history: list[dict]):
    """Tiled minus random lift, and peak coverage lift, of every site-layer against the step."""
    steps = [h["step"] for h in history]
    names = [f"{r['site']} layer {r['layer']}" for r in history[0]["rows"]]
    fig, (a, b) = new_figure(1, 2, figsize=(9, 3.4))
    for i, name in enumerate(names):
        a.plot(
            steps, [h["rows"][i]["lift_tiled"] - h["rows"][i]["lift_random"] for h in history], marker=".", label=name
        )
        b.plot(steps, [max(h["rows"][i]["coverage_lift"]) for h in history], marker=".", label=name)
    a.set_title("tiled lift - random lift", fontsize=9)
    b.set_title("peak coverage lift (tiled - random dictionary)", fontsize=9)
    for ax in (a, b):
        ax.set_xlabel("training step")
    a.legend(fontsize=7)
    fig.subplots_adjust(wspace=0.4, hspace=0.3)  # fixed spacing: tight_layout would draw the figure once more
    return fig


def spectrum_values(rows: list[dict], step: int):
    """Every spectrum of one step, s_i against i (from 1), log scale; one panel per matrix kind."""
    kinds = list(dict.fromkeys(r["matrix"] for r in rows))
    layers = sorted({r["layer"] for r in rows})
    cmap = matplotlib.colormaps["viridis"]
    fig, axes = new_figure(1, len(kinds), figsize=(3.0 * len(kinds), 2.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for r in (r for r in rows if r["matrix"] == kind):
            color = cmap(layers.index(r["layer"]) / max(1, len(layers) - 1))
            ax.semilogy(range(1, len(r["S"]) + 1), [max(s, 1e-12) for s in r["S"]], color=color, lw=0.8, alpha=0.8)
        ax.set_title(f"{kind} (step {step})", fontsize=9)
        ax.set_xlabel("i (sigma_1 largest)")
    axes[0][0].set_ylabel("singular value sigma_i (colour: layer)")
    fig.subplots_adjust(wspace=0.4, hspace=0.3)  # fixed spacing: tight_layout would draw the figure once more
    return fig


def spectrum_history(history: list[dict]):
    """Mean effective rank of each matrix kind, per layer, against the step."""
    steps = [h["step"] for h in history]
    first = history[0]["rows"]
    kinds = list(dict.fromkeys(r["matrix"] for r in first))
    layers = sorted({r["layer"] for r in first})
    fig, axes = new_figure(1, len(kinds), figsize=(3.0 * len(kinds), 2.8), squeeze=False)
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


def spectrum_tracked(history: list[dict], min_cos: float = MIN_COS):
    """One panel per matrix kind: the tracked singular values d1, d2, ... of the last layer's first head (or MLP
    map) against the step (x: identity lost at that step, open circle: inside a block); a last panel: per
    matrix kind, the fraction of all its tracked directions that kept their identity since the previous step."""
    steps = [h["step"] for h in history]
    first = history[0]["rows"]
    kinds = list(dict.fromkeys(r["matrix"] for r in first))
    fig, axes = new_figure(1, len(kinds) + 1, figsize=(2.8 * (len(kinds) + 1), 2.9), squeeze=False)
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
