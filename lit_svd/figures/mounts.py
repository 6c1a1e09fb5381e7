"""Figures of a tiled-mounts run (``MountsResult``): lifts, span lifts, coverage and steering against depth."""

from __future__ import annotations

from lit_svd.analysis.mounts import STRATEGIES
from lit_svd.figures.base import new_figure
from lit_svd.results.base import draws
from lit_svd.results.mounts import MountsResult


@draws(MountsResult)
def figures(result: MountsResult) -> dict:
    """``mounts_lift_depth`` (lift of the four strategies), ``mounts_span_depth``, ``mounts_coverage_depth`` and,
    where steering was measured, ``mounts_steering_depth``: each against depth, one panel per site."""
    return depth_figures(result.sites)


def depth_figures(rows: list[dict]) -> dict:
    """The depth figures of site-layer rows (the mounts test run's ``sites``)."""
    sites = list(dict.fromkeys(r["site"] for r in rows))
    by = {s: sorted((r for r in rows if r["site"] == s), key=lambda r: r["layer"]) for s in sites}

    def lifts(ax, s, L):
        for strat in STRATEGIES:
            ax.plot(L, [r[f"lift_{strat}"] for r in by[s]], label=strat, lw=1.2)
        return f"{s} ({by[s][0]['path']})"

    def coverage(ax, s, L):
        for i, m in enumerate(by[s][0]["coverage_modes"]):
            ax.plot(L, [r["coverage_lift"][i] for r in by[s]], label=f"{m} modes", lw=1.0)
        return s

    def steering(ax, s, L):
        ax.plot(L, [r["steer_rho"] for r in by[s]], label="Spearman rho", lw=1.2)
        ax.plot(L, [r["steer_jaccard"] for r in by[s]], label="top-20 Jaccard", lw=1.2)
        ax.axhline(0.05, color="grey", lw=0.6, ls="--")
        return f"steering {s}"

    def spans(ax, s, L):
        for strat in STRATEGIES[:-1]:
            ax.plot(L, [r[f"span_lift_{strat}"] for r in by[s]], label=strat, lw=1.2)
        ax.plot(L, [r["span_lift_ceiling"] for r in by[s]], label="data ceiling", color="k", lw=1.0, ls="--")
        if "null" in by[s][0]:
            ax.plot(L, [r["null"]["span_lift_tiled"] for r in by[s]], label="tiled, null", color="grey", lw=0.8)
        return s

    figs = {
        "mounts_lift_depth": _depth_panels(sites, by, lifts, "full-write lift", legend_size=7),
        "mounts_span_depth": _depth_panels(sites, by, spans, "span lift over random", legend_size=6),
        "mounts_coverage_depth": _depth_panels(sites, by, coverage, "coverage lift over random", legend_size=6),
    }
    steer = [s for s in sites if "steer_rho" in by[s][0]]
    if steer:
        figs["mounts_steering_depth"] = _depth_panels(steer, by, steering, None, legend_size=7, width=3.2)
    return figs


def _depth_panels(sites: list[str], by: dict, draw, ylabel: str | None, legend_size: int, width: float = 2.6):
    """One panel per site against layer; ``draw(ax, site, layers)`` plots a panel and returns its title."""
    fig, axes = new_figure(1, len(sites), figsize=(width * len(sites), 2.6), sharex=True, squeeze=False)
    for ax, s in zip(axes[0], sites):
        ax.set_title(draw(ax, s, [r["layer"] for r in by[s]]), fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
    if ylabel:
        axes[0][0].set_ylabel(ylabel, fontsize=8)
    axes[0][-1].legend(fontsize=legend_size)
    fig.tight_layout()
    return fig
