"""Figures of the toy alignment experiment: ``figures(result)`` (the run's PNGs, from a ``ToyAlignmentResult``)
and the drawing functions it uses, which the alignment callback also draws its TensorBoard heatmaps with."""

from __future__ import annotations

import torch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from lit_svd.figures.base import colors, new_figure
from lit_svd.results.base import draws
from lit_svd.results.toy import ToyAlignmentResult


@draws(ToyAlignmentResult)
def figures(result: ToyAlignmentResult) -> dict:
    """``heatmap`` (instance 0's |cos|, when the result holds it), ``spectra``, ``alignment_dynamics``, and
    ``interference_sweep`` / ``theorem1_superposition`` where the instances vary those settings."""
    instances = result.instances
    labels = result.labels or None
    pairs = [tuple(p) for p in result.template_pairs]
    out = {}
    if result.heatmap_cos is not None:
        out["heatmap"] = heatmaps(torch.tensor(result.heatmap_cos[0]), torch.tensor(result.heatmap_cos[1]), pairs)
    out["spectra"] = spectra([i["singular_values"] for i in instances], labels)
    out["alignment_dynamics"] = dynamics([(h["step"], h["mean_abs_cos"]) for h in result.history], labels)
    if len({i["interference"] for i in instances}) > 1 and len({i["d_model"] for i in instances}) == 1:
        out["interference_sweep"] = interference_sweep(instances)
    if len({i["d_model"] for i in instances}) > 1:
        out["theorem1_superposition"] = theorem1_superposition(result.overall["theorem1_groups"], result.n_features)
    return out


def heatmaps(cos_u: torch.Tensor, cos_v: torch.Tensor, pairs: list[tuple[int, int, float]], max_cols: int = 25):
    """|cos(w_i, u_k)| and |cos(w_j, v_k)| of one instance; template pairs' features marked (red, left edge)."""
    k = min(max_cols, cos_u.shape[-1])
    fig, axes = new_figure(1, 2, figsize=(8, 4.2), sharey=True)
    for ax, cos, title, feats in (
        (axes[0], cos_u, "|cos(w_i, u_k)| (query side)", {p[0] for p in pairs}),
        (axes[1], cos_v, "|cos(w_j, v_k)| (key side)", {p[1] for p in pairs}),
    ):
        im = _cos_image(ax, cos[:, :k], feats)
        ax.set_title(title, fontsize=9)
    axes[0].set_ylabel("feature")
    fig.colorbar(im, ax=axes, shrink=0.8, label="|cos|")
    return fig


def heatmap(
    cos: torch.Tensor,
    side: str,
    pairs: list[tuple[int, int, float]],
    title: str,
    max_cols: int = 25,
    tracked: bool = False,
):
    """One side's |cos(feature, singular vector)| (the TensorBoard image): axes, pair features marked, colour bar.
    ``tracked``: the columns are tracked directions d1, d2, ... (``lit_svd.analysis.tracking``), not sorted
    singular indices."""
    fig, ax = new_figure(figsize=(4.6, 3.8))
    feats = {p[0] if side == "query" else p[1] for p in pairs}
    im = _cos_image(
        ax,
        cos[:, : min(max_cols, cos.shape[-1])],
        feats,
        "tracked direction d_k (sigma_k at the first logged step)" if tracked else None,
    )
    ax.set_ylabel("feature")
    ax.set_title(f"|cos(w, {'u' if side == 'query' else 'v'}_k)|, {side} side ({title})", fontsize=8)
    fig.colorbar(im, ax=ax, shrink=0.85, label="|cos|")
    return fig


SINGULAR_INDEX = "singular index k (sigma_1 largest)"
FROM_ONE = FuncFormatter(lambda x, _: f"{int(round(x)) + 1}")  # column / position 0 is labelled 1


def _cos_image(ax, cos: torch.Tensor, marked: set[int], xlabel: str | None = None):
    """A [features, singular index] |cos| image with integer ticks, singular indices numbered from 1; the
    template's features are marked by a red triangle outside the left edge (nothing is drawn over the cells)."""
    im = ax.imshow(cos.numpy(), aspect="auto", vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
    ax.set_xlabel(xlabel or SINGULAR_INDEX)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_formatter(FROM_ONE)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for f in marked:
        ax.plot(-0.5, f, marker=">", color="red", ms=5, clip_on=False, transform=ax.transData)
    ax.set_xlim(-0.5, cos.shape[-1] - 0.5)
    return im


def _legend(ax, n: int) -> None:
    """A legend naming each instance; beyond 8 lines it moves outside the axes in columns."""
    if n <= 8:
        ax.legend(fontsize=7)
    else:
        ax.legend(fontsize=6, ncol=max(1, n // 12 + 1), loc="upper left", bbox_to_anchor=(1.01, 1.0))


def spectra(singular_values: list[torch.Tensor], labels: list[str] | None = None):
    """Singular values of every instance, normalised by the largest; one labelled line per instance."""
    fig, ax = new_figure(figsize=(5, 3.4))
    labels = labels or [f"instance {i}" for i in range(len(singular_values))]
    for s, label in zip(singular_values, labels):
        s = torch.as_tensor(s)
        ax.plot(range(1, len(s) + 1), (s / s[0].clamp_min(1e-30)).numpy(), marker=".", lw=0.8, alpha=0.7, label=label)
    ax.set_yscale("log")
    ax.set_xlabel(SINGULAR_INDEX)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("sigma_k / sigma_1")
    ax.set_title(f"Omega spectra ({len(singular_values)} instance(s))", fontsize=9)
    _legend(ax, len(singular_values))
    return fig


def dynamics(history: list[tuple[int, list[float]]], labels: list[str] | None = None):
    """Mean |cos| of each instance over training steps; one labelled line per instance."""
    fig, ax = new_figure(figsize=(5, 3.4))
    steps = [s for s, _ in history]
    n = len(history[0][1]) if history else 0
    labels = labels or [f"instance {i}" for i in range(n)]
    for i in range(n):
        ax.plot(steps, [v[i] for _, v in history], lw=0.8, alpha=0.7, label=labels[i])
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("mean |cos| over pairs")
    ax.set_title("alignment dynamics", fontsize=9)
    if n:
        _legend(ax, n)
    return fig


def interference_sweep(instances: list[dict]):
    """Theorem 1 against ||E_X||_2, read from the instances' results.json records: |cos(u_1, whitened
    prediction)| and |cos(u_1, x_1)| of each ``theorem1`` record (sigma_1's direction, array position 0 in
    results.json, the theorem's claim), and
    the mean |cos| over pairs at each pair's recorded ``singular_index`` (``mean_abs_cos``)."""
    fig, ax = new_figure(figsize=(5, 3.4))
    x = [i["interference"] for i in instances]
    ax.plot(
        x,
        [i["theorem1"]["cos_u1_prediction"] for i in instances],
        "s",
        mfc="none",
        label="|cos(u_1, Sigma_X^-1 x_1)| (whitened prediction)",
    )
    ax.plot(x, [i["theorem1"]["cos_u1_raw"] for i in instances], "o", label="|cos(u_1, x_1)| (raw feature)")
    ax.plot(x, [i["mean_abs_cos"] for i in instances], "x", label="mean |cos| over pairs, matched index")
    ax.set_xlabel("interference ||E_X||_2")
    ax.set_ylabel("|cos|")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    return fig


def theorem1_superposition(groups: list[dict], n_features: int):
    """Theorem 1 across N/D and ||E_X||_2 from ``summary.theorem1_groups``: the mean over seeds (line) and
    the worst seed (open marker) of |cos(u_1, whitened prediction)| (solid) and |cos(u_1, x_1)| (dashed)."""
    fig, ax = new_figure(figsize=(6, 4))
    dims = sorted({g["d_model"] for g in groups}, reverse=True)
    for color, d in zip(colors(), dims):
        rows = sorted((g for g in groups if g["d_model"] == d), key=lambda g: g["interference_mean"])
        x = [g["interference_mean"] for g in rows]
        for key, ls, mk, name in (
            ("cos_u1_prediction", "-", "s", "whitened prediction"),
            ("cos_u1_raw", "--", "o", "raw x_1"),
        ):
            ax.plot(
                x,
                [g[f"{key}_mean"] for g in rows],
                ls=ls,
                marker=mk,
                color=color,
                label=f"N/D = {n_features / d:g}: {name} (mean)",
            )
            ax.plot(x, [g[f"{key}_worst"] for g in rows], ls="none", marker=mk, mfc="none", color=color, alpha=0.7)
    ax.set_xlabel("interference ||E_X||_2 (mean over seeds)")
    ax.set_ylabel("|cos(u_1, .)|  (open markers: worst seed)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Theorem 1 in superposition (N = {n_features}, {groups[0]['n_seeds']} seeds per point)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    return fig
