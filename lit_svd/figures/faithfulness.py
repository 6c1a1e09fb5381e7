"""Figures of a ``FaithfulnessResult``: ``faithfulness_curves.png``, every method's curve against the fraction of
the universe's directions kept (log x), the random rankings grey and dashed, CPR and CMD in the legend."""

from __future__ import annotations

from lit_svd.figures.base import array, colors, new_figure
from lit_svd.results.faithfulness import FaithfulnessResult


def curves_figure(curves: dict, title: str):
    """``curves``: ``{method: {"sizes", "values", "cpr", "cmd"}}``; methods named ``random*`` are the baseline."""
    fig, ax = new_figure(figsize=(6.4, 4.2))
    palette = colors()
    ordered = sorted(curves.items(), key=lambda kv: kv[0].startswith("random"))
    for i, (method, c) in enumerate(ordered):
        label = f"{method} (CPR {c['cpr']:.3f}, CMD {c['cmd']:.3f})"
        if method.startswith("random"):
            ax.plot(array(c["sizes"]), array(c["values"]), color="0.55", ls="--", marker=".", label=label)
        else:
            ax.plot(array(c["sizes"]), array(c["values"]), color=palette[i % len(palette)], marker="o", ms=3,
                    label=label)  # fmt: skip
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.axhline(0.0, color="k", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("fraction of the universe's directions kept (MIB's grid)")
    ax.set_ylabel("faithfulness (m(C) - m(empty)) / (m(full) - m(empty))")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return fig


def figures(result: FaithfulnessResult) -> dict:
    """``{"faithfulness_curves": Figure}``."""
    title = f"{result.model} {result.task}, {result.n_prompts} test prompts: faithfulness by circuit size"
    return {"faithfulness_curves": curves_figure(result.faithfulness, title)}
