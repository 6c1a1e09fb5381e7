"""Figures of a SAD test run (``SADResult``): layer x head maps against the controls, N_recon histograms."""

from __future__ import annotations

import numpy as np

from lit_svd.figures.base import new_figure
from lit_svd.results.base import draws
from lit_svd.results.sad import SADResult


@draws(SADResult)
def figures(result: SADResult) -> dict:
    """``sad_heatmap`` and ``sad_n_recon``."""
    return {"sad_heatmap": head_heatmap(result), "sad_n_recon": n_recon(result)}


def _grid(result: SADResult, key: str) -> np.ndarray:
    s = result.overall
    grid = np.full((result.n_layers, result.n_heads_per_layer), np.nan)
    for r in result.heads:
        if r["n_pairs"] >= s["min_pairs"] and r.get(key) is not None:
            grid[r["layer"], r["head"]] = r[key]
    return grid


def head_heatmap(result: SADResult):
    """Layer x head maps: sparsity in the singular basis, the matched-spectrum null's 5th percentile, the pair
    null and the rotated control (one colour scale), then null p05 - sparsity (> 0: sparser than the null)."""
    panels = [("sparsity", "singular basis")]
    if "sparsity_null_p05" in result.heads[0]:
        panels.append(("sparsity_null_p05", "matched null, 5th pct"))
    if "sparsity_unattended" in result.heads[0]:
        panels.append(("sparsity_unattended", "pair null (unattended)"))
    panels.append(("sparsity_rotated", "rotated control"))
    grids = [_grid(result, k) for k, _ in panels]
    diff = grids[1] - grids[0] if panels[1][0] == "sparsity_null_p05" else grids[-1] - grids[0]
    n_layers, n_heads = grids[0].shape
    fig, axes = new_figure(
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
    s = result.overall
    parts = [
        f"{s[f'n_heads_sparser_than_{k}']}/{s['n_heads_eligible']} sparser than {label}"
        for k, label in (("null", "matched null"), ("unattended", "pair null"), ("rotated", "rotated"))
        if f"n_heads_sparser_than_{k}" in s
    ]
    fig.suptitle(f"{result.model}: " + "; ".join(parts), fontsize=9)
    return fig


def n_recon(result: SADResult):
    """Pooled N_recon distributions (singular basis, matched null over all draws, pair null, rotated) and
    the per-head medians."""
    s = result.overall
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
    fig, (a, b) = new_figure(1, 2, figsize=(10, 3.6))
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
    eligible = [r for r in result.heads if r["n_pairs"] >= s["min_pairs"]]
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
    return fig
