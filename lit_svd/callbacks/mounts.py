"""Writes a tiled-mounts run: results.json, sites.csv and depth figures (rank zero only)."""
from __future__ import annotations

import csv

import lightning.pytorch as pl

from lit_svd.analysis.mounts import STRATEGIES
from lit_svd.output import run_dir, save_figure, write_results

CHECKS = ("A1", "A2", "A3", "A4", "B1", "C1", "pass")


def pass_table(rows: list[dict]) -> dict[str, dict[str, str]]:
    """Per site and check: ``"passed/required"`` over the site's layers (C1 counts required layers only)."""
    table: dict[str, dict[str, str]] = {}
    for site in dict.fromkeys(r["site"] for r in rows):
        mine = [r for r in rows if r["site"] == site]
        table[site] = {}
        for c in CHECKS:
            req = [r["checks"][c] for r in mine if r["checks"][c] is not None]
            table[site][c] = f"{sum(req)}/{len(req)}" if req else "-"
    total = [r["pass"] for r in rows]
    table["all"] = {"pass": f"{sum(total)}/{len(total)}"}
    return table


def csv_row(row: dict) -> dict:
    """One flat CSV row: lists joined with ``;``, checks as columns."""
    out = {}
    for k, v in row.items():
        if k == "checks":
            out.update({f"check_{c}": ("" if x is None else int(x)) for c, x in v.items()})
        elif isinstance(v, (list, tuple)):
            out[k] = ";".join(f"{x:.6g}" if isinstance(x, float) else str(x) for x in v)
        else:
            out[k] = v
    return out


class MountsReport(pl.Callback):
    """After ``test``: ``results.json`` (``"experiment": "tiled_mounts"``, ``"sites"``: one entry per
    site-layer), ``sites.csv`` (the same rows) and the depth figures ``mounts_lift_depth.png``,
    ``mounts_coverage_depth.png``, ``mounts_steering_depth.png``."""

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rows = getattr(pl_module, "rows", None)
        if not rows or not trainer.is_global_zero:
            return
        hp = dict(pl_module.hparams)
        results = {"experiment": "tiled_mounts", "model": hp.get("model"), "config": hp,
                   "n_tokens": max(r["n_tokens"] for r in rows), "pass_table": pass_table(rows),
                   "n_pass": sum(r["pass"] for r in rows), "n_site_layers": len(rows), "sites": rows}
        write_results(trainer, results)
        flat = [csv_row(r) for r in rows]
        keys = list(dict.fromkeys(k for r in flat for k in r))
        with open(run_dir(trainer) / "sites.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(flat)
        for name, fig in depth_figures(rows).items():
            save_figure(trainer, fig, name)


def depth_figures(rows: list[dict]) -> dict:
    """Lift of the four strategies, coverage lift and steering agreement against depth, per site."""
    import matplotlib

    matplotlib.use("Agg")

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

    figs = {"mounts_lift_depth": _depth_panels(sites, by, lifts, "full-write lift", legend_size=7),
            "mounts_coverage_depth": _depth_panels(sites, by, coverage, "coverage lift over random", legend_size=6)}
    steer = [s for s in sites if "steer_rho" in by[s][0]]
    if steer:
        figs["mounts_steering_depth"] = _depth_panels(steer, by, steering, None, legend_size=7, width=3.2)
    return figs


def _depth_panels(sites: list[str], by: dict, draw, ylabel: str | None, legend_size: int, width: float = 2.6):
    """One panel per site against layer; ``draw(ax, site, layers)`` plots a panel and returns its title."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sites), figsize=(width * len(sites), 2.6), sharex=True, squeeze=False)
    for ax, s in zip(axes[0], sites):
        ax.set_title(draw(ax, s, [r["layer"] for r in by[s]]), fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        ax.tick_params(labelsize=7)
    if ylabel:
        axes[0][0].set_ylabel(ylabel, fontsize=8)
    axes[0][-1].legend(fontsize=legend_size)
    fig.tight_layout()
    return fig
