"""Figures of a model's task metrics (``EvaluateResult``): per task, clean against corrupted prompts."""

from __future__ import annotations

import numpy as np

from lit_svd.figures.base import new_figure
from lit_svd.results.base import draws
from lit_svd.results.tasks import EvaluateResult


@draws(EvaluateResult)
def figures(result: EvaluateResult) -> dict:
    """``tasks``: one histogram panel per task of the headline per-example value, clean vs corrupted prompts
    (tasks whose result holds its per-example ``values``)."""
    tasks = [t for t in result.tasks if t.get("values")]
    if not tasks:
        return {}
    fig, axes = new_figure(1, len(tasks), figsize=(4 * len(tasks), 3), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        for kind, color in (("clean", "tab:blue"), ("corrupt", "tab:orange")):
            v = np.asarray(t["values"][kind], dtype=float)
            ax.hist(v, bins=30, alpha=0.6, color=color, label=f"{kind} (mean {v.mean():.2f})")
        ax.set_title(t["task"].upper())
        ax.set_xlabel("probability difference" if t["task"] == "gt" else "logit difference (correct - wrong)")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("prompts")
    fig.tight_layout()
    return {"tasks": fig}
