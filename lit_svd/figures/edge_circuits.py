"""Figures of an ``EdgeCircuitResult``: ``edge_curves.png``, two panels of faithfulness against the circuit's size,
the raw axis (fraction of the edges of each curve's own level) and the fair axis (weighted edge count as a
fraction of the blocks); head-level curves are the same circuits on both; random curves grey and dashed; each
ranked curve with its 95 % bootstrap band over the test prompts (``values_ci``) where it has one."""

from __future__ import annotations

from lit_svd.figures.base import array, colors, new_figure
from lit_svd.results.base import draws
from lit_svd.results.edge_circuits import EdgeCircuitResult


def axis_of(name: str) -> str | None:
    """``raw``, ``fair`` or None (both: head-level and random curves)."""
    if name.startswith("random") or name.startswith("units"):
        return None
    return name.rsplit("_", 1)[-1]


def curves_figure(curves: dict, title: str):
    fig, axes = new_figure(1, 2, figsize=(11, 4.2), sharey=True)
    palette = colors()
    ranked = [name for name in curves if not name.startswith("random")]  # random curves are grey
    color_of = {name: palette[i % len(palette)] for i, name in enumerate(ranked)}  # one colour per curve, both panels
    for panel, (ax, axis) in enumerate(zip(axes, ("raw", "fair"))):
        shown = [(n, c) for n, c in curves.items() if axis_of(n) in (axis, None)]
        for name, c in sorted(shown, key=lambda nc: nc[0].startswith("random")):
            x = array(c["sizes"]) if axis == "raw" or not name.startswith("random") else array(c["weighted"])
            label = f"{name} (CPR {c['cpr']:.3f}, CMD {c['cmd']:.3f})"
            if name.startswith("random"):
                ax.plot(x, array(c["values"]), color="0.55", ls="--", marker=".", label=label)
            else:
                color = color_of[name]
                ax.plot(x, array(c["values"]), color=color, marker="o", ms=3, label=label)
                if c.get("values_ci"):  # the 95 % bootstrap band over the test prompts
                    ax.fill_between(x, *(array(v) for v in c["values_ci"]), color=color, alpha=0.15, lw=0)
        ax.axhline(1.0, color="k", lw=0.6, ls=":")
        ax.axhline(0.0, color="k", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel(
            "fraction of the level's edges kept (MIB's grid)"
            if axis == "raw"
            else "weighted edge count kept / head-level edges (fair axis)"
        )
        ax.set_title(f"{'raw' if axis == 'raw' else 'fair'} axis", fontsize=9)
        ax.legend(fontsize=6)
        if panel == 0:
            ax.set_ylabel("faithfulness (m(C) - m(empty)) / (m(full) - m(empty))")
    fig.suptitle(title, fontsize=9)
    return fig


@draws(EdgeCircuitResult)
def figures(result: EdgeCircuitResult) -> dict:
    """``{"edge_curves": Figure}``."""
    title = (
        f"{result.model} {result.task}: edge circuits, scored on {result.n_train_prompts} training prompts,"
        f" curves on {result.n_prompts} test prompts"
    )
    return {"edge_curves": curves_figure(result.curves, title)}
