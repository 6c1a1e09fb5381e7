"""Figures of directional circuits: a mask run (``MaskResult``), its re-cut thresholds, the sparsity-KL curve
of several runs and the block annotation (``MaskThresholdsResult``, ``MaskCurveResult``, ``MaskBlocksResult``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lit_svd.figures.base import new_figure
from lit_svd.results.base import draws
from lit_svd.results.masks import MaskBlocksResult, MaskCurveResult, MaskResult, MaskThresholdsResult


@draws(MaskResult)
def figures(result: MaskResult) -> dict:
    """``masks_kept_<kind>`` (kept directions per layer and head, one per kind) and ``masks_blocks``."""
    out = kept_maps(result.components)
    if result.kept_isolated.get("per_kind"):
        out["masks_blocks"] = kept_isolation(result.kept_isolated["per_kind"], result.rel_gap)
    return out


def kept_maps(components: list[dict]) -> dict:
    """Per component kind, a layer x group image of the kept directions (of each group's directions)."""
    by_kind: dict[str, list[dict]] = {}
    for rec in components:
        by_kind.setdefault(rec["kind"], []).append(rec)
    out = {}
    for kind, recs in by_kind.items():
        layers = sorted(r["layer"] for r in recs)
        groups = max(r["n_groups"] for r in recs)
        grid = np.full((len(layers), groups), np.nan)
        for r in recs:
            grid[layers.index(r["layer"]), : r["n_groups"]] = r["kept_per_group"]
        per_group = recs[0]["n_directions"] // recs[0]["n_groups"]
        fig, ax = new_figure(figsize=(1.2 + 0.45 * groups, 1.0 + 0.16 * len(layers)))
        im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=per_group)
        ax.set_xlabel(recs[0]["group"])
        ax.set_ylabel("layer")
        ax.set_yticks(range(0, len(layers), max(1, len(layers) // 10)))
        ax.set_yticklabels(layers[:: max(1, len(layers) // 10)])
        ax.set_title(f"kept {kind} directions (of {per_group})")
        fig.colorbar(im, ax=ax)
        out[f"masks_kept_{kind}"] = fig
    return out


def kept_isolation(per_kind: dict, rel_gap: float | None):
    """Kept directions per kind, split into isolated, in blocks and past the rank."""
    kinds = list(per_kind)
    fig, ax = new_figure(figsize=(1.5 + 0.9 * len(kinds), 3.0))
    bottom = [0] * len(kinds)
    for key, color in (("isolated", "tab:green"), ("in_blocks", "tab:orange"), ("past_rank", "tab:gray")):
        values = [per_kind[k][key] for k in kinds]
        ax.bar(kinds, values, bottom=bottom, color=color, label=key.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("kept directions")
    ax.set_title(f"kept directions: isolated or in blocks (rel_gap {rel_gap:g})", fontsize=9)
    ax.legend(fontsize=7)
    return fig


@draws(MaskCurveResult)
def curve_figures(result: MaskCurveResult, target: tuple[float, float] | None = (0.10, 0.25)) -> dict:
    """``mask_curve``: hard-mask KL against kept fraction, trajectories (hard KL on one validation batch) as
    lines, the final evaluation as labelled points, and the target box (kept <= 10 %, KL <= 0.25)."""
    runs = result.runs
    fig, ax = new_figure(figsize=(6.4, 4.4))
    for r in runs:
        traj = [p for p in r.get("trajectory", []) if p["kept_fraction"] < 1]
        (line,) = ax.plot([100 * p["kept_fraction"] for p in traj], [p["kl_hard"] for p in traj], lw=0.8, alpha=0.5)
        ax.plot(
            100 * r["kept_fraction"],
            r["kl_hard"],
            "o",
            color=line.get_color(),
            label=f"{Path(r['label']).name} (alpha {r['alpha']:g}): {100 * r['kept_fraction']:.1f} %, "
            f"KL {r['kl_hard']:.2f} on {r.get('eval_split', 'val')}",
        )
    if target:
        ax.fill_between([0, 100 * target[0]], 0, target[1], color="tab:green", alpha=0.12, label="target")
    ax.set_xscale("log")
    ax.set_xlabel("kept directions (%), hard masks")
    ax.set_ylabel("KL(full || hard-masked)")
    ax.set_ylim(0, max(0.5, 1.5 * max(r["kl_hard"] for r in runs)))  # early trajectory spikes run off the top
    splits = sorted({r.get("trajectory_split", "val") for r in runs})
    ax.set_title(
        f"sparsity-KL, {runs[0].get('task', '')} on {runs[0].get('model', '')}\n"
        f"points: final evaluation; lines: training trajectory on {'/'.join(splits)}",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return {"mask_curve": fig}


@draws(MaskBlocksResult)
def blocks_figures(result: MaskBlocksResult) -> dict:
    """``mask_blocks``: per kind, the fraction of kept directions that are isolated (bars, one per gap) next
    to the fraction of all directions (ticks)."""
    kinds = list(result.per_gap[0]["per_kind"])
    gaps = result.per_gap
    fig, ax = new_figure(figsize=(1.5 + 1.2 * len(kinds), 3.2))
    x = np.arange(len(kinds))
    width = 0.8 / len(gaps)
    for j, e in enumerate(gaps):
        kept = [e["per_kind"][k]["isolated_fraction"] or 0.0 for k in kinds]
        every = [e["all_directions"][k]["isolated_fraction"] for k in kinds]
        ax.bar(x - 0.4 + width * (j + 0.5), kept, width, label=f"kept, rel_gap {e['rel_gap']:g}")
        ax.scatter(x - 0.4 + width * (j + 0.5), every, color="black", marker="_", s=200, zorder=3)
    ax.set_xticks(x, kinds)
    ax.set_ylabel("fraction isolated")
    ax.set_ylim(0, 1)
    ax.set_title("kept directions that are isolated (bars) vs all directions (ticks)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return {"mask_blocks": fig}


@draws(MaskThresholdsResult)
def threshold_figures(result: MaskThresholdsResult) -> dict:
    """``mask_thresholds``: hard-mask KL against kept fraction over the thresholds, validation and test, the
    choice ringed."""
    rows = result.thresholds
    fig, ax = new_figure(figsize=(5.6, 3.8))
    kept = [100 * r["kept_fraction"] for r in rows]
    for split, style in (("val", "o--"), ("test", "s-")):
        ax.plot(kept, [r[split]["kl_hard"] for r in rows], style, label=f"{split} hard-mask KL")
    for r, x in zip(rows, kept):
        ax.annotate(
            f"{r['threshold']:g}", (x, r["test"]["kl_hard"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    if result.chosen:
        c = result.chosen
        ax.plot(
            100 * c["kept_fraction"],
            c["test"]["kl_hard"],
            "o",
            ms=12,
            mfc="none",
            color="k",
            label=f"chosen on val (KL <= {result.max_kl:g})",
        )
    ax.axhline(result.max_kl, color="grey", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("kept directions (%) at each lambda threshold (labels)")
    ax.set_ylabel("KL(full || hard-masked)")
    ax.set_title(f"hard masks re-cut from {'/'.join(Path(result.source).parts[-3:])}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return {"mask_thresholds": fig}
