"""Figures of a ``FaithfulnessResult``: ``faithfulness_curves.png``, every method's curves against the size kept
(log x) in four panels: columns the raw axis (fraction of directions) and the fair axis (mean kept fraction of the
units); rows the signed rankings (their CPR in the legend) and the absolute ones (their CMD). The random rankings
grey and dashed; each ranked curve with its 95 % bootstrap band over the test prompts (``values_ci``) where it has
one."""

from __future__ import annotations

from lit_svd.figures.base import array, colors, new_figure
from lit_svd.results.base import draws
from lit_svd.results.faithfulness import FaithfulnessResult

ROWS = (("signed", "cpr", "signed ranking (CPR)"), ("absolute", "cmd", "absolute ranking (CMD)"))
XLABEL = {"raw": "fraction of the universe's directions kept", "fair": "fair size: mean kept fraction of the units"}


def _curve(entry: dict, variant: str, axis: str) -> dict | None:
    """The method's curve for a row: its ``variant`` ranking, or its one ranking."""
    rankings = entry["rankings"]
    return (rankings.get(variant) or rankings.get("ranking") or {}).get(axis)


def curves_figure(faithfulness: dict, title: str):
    """``faithfulness``: ``{method: {"rankings": {variant: {axis: curve}}, "cpr": {axis}, "cmd": {axis}}}``;
    methods named ``random*`` are the baseline."""
    axes_names = [a for a in ("raw", "fair") if any(_curve(e, "signed", a) for e in faithfulness.values())]
    fig, axes = new_figure(len(ROWS), len(axes_names), figsize=(5.2 * len(axes_names), 7.6), squeeze=False)
    palette = colors()
    ordered = sorted(faithfulness.items(), key=lambda kv: kv[0].startswith("random"))
    for r, (variant, score, label) in enumerate(ROWS):
        for col, axis in enumerate(axes_names):
            ax = axes[r][col]
            for i, (method, entry) in enumerate(ordered):
                c = _curve(entry, variant, axis)
                if c is None:
                    continue
                text = f"{method} ({score.upper()} {entry[score][axis]:.3f})"
                random = method.startswith("random")
                color = "0.55" if random else palette[i % len(palette)]
                x = array(c["sizes"])
                ax.plot(x, array(c["values"]), color=color, ls="--" if random else "-", marker="." if random else "o",
                        ms=3, label=text)  # fmt: skip
                if not random and c.get("values_ci"):  # the 95 % bootstrap band over the test prompts
                    ax.fill_between(x, *(array(v) for v in c["values_ci"]), color=color, alpha=0.15, lw=0)
            ax.axhline(1.0, color="k", lw=0.6, ls=":")
            ax.axhline(0.0, color="k", lw=0.6, ls=":")
            ax.set_xscale("log")
            ax.set_xlabel(XLABEL[axis], fontsize=8)
            ax.set_ylabel(f"f, {label}", fontsize=8)
            ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    return fig


@draws(FaithfulnessResult)
def figures(result: FaithfulnessResult) -> dict:
    """``{"faithfulness_curves": Figure}``."""
    title = f"{result.model} {result.task}, {result.n_prompts} test prompts: faithfulness by circuit size"
    return {"faithfulness_curves": curves_figure(result.faithfulness, title)}
