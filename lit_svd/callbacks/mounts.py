"""Writes a tiled-mounts run: results.json, sites.csv and depth figures (rank zero only).

The pass table counts each check per site on the real matrices and, where the run scored the
structureless null, on the nulls beside them; a check that passes on the null at least as often as on
the real matrices is *non-discriminating* at that site (``discrimination``)."""

from __future__ import annotations

import csv

import lightning.pytorch as pl

from lit_svd.analysis.mounts import STRATEGIES
from lit_svd.output import run_dir, save_figure, write_results

CHECKS = ("A1", "A2", "A3", "A4", "B1", "C1", "pass")


def _counts(rows: list[dict], null: bool) -> dict[str, dict[str, tuple[int, int]]]:
    """Per site (and "all") and check: (passed, required) over the site's layers (C1: required layers only)."""
    checks = [(r["site"], (r["null"] if null else r)["checks"]) for r in rows]
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for site in [*dict.fromkeys(s for s, _ in checks), "all"]:
        mine = [c for s, c in checks if site in (s, "all")]
        out[site] = {}
        for c in CHECKS:
            req = [m[c] for m in mine if m[c] is not None]
            out[site][c] = (sum(req), len(req))
    return out


def pass_table(rows: list[dict], null: bool = False) -> dict[str, dict[str, str]]:
    """Per site and check: ``"passed/required"`` over the site's layers (C1 counts required layers only);
    ``"all"`` holds the overall pass count. ``null``: the same for the structureless nulls."""
    counts = _counts(rows, null)
    table = {
        site: {c: f"{p}/{n}" if n else "-" for c, (p, n) in by.items()} for site, by in counts.items() if site != "all"
    }
    p, n = counts["all"]["pass"]
    table["all"] = {"pass": f"{p}/{n}"}
    return table


DISCRIMINATION_LEVEL = 0.05


def discriminates(real: tuple[int, int], null: tuple[int, int], level: float = DISCRIMINATION_LEVEL) -> bool:
    """Whether ``real = (passed, required)`` passes significantly more often than ``null``: one-sided Fisher
    exact test on the 2x2 counts at ``level`` (30/30 against 29/30 is not a difference; 30/30 against 11/30 is)."""
    from scipy.stats import fisher_exact

    (p, n), (q, m) = real, null
    return bool(fisher_exact([[p, n - p], [q, m - q]], alternative="greater")[1] < level)


def discrimination(rows: list[dict]) -> dict[str, dict[str, bool | None]]:
    """Per site (and "all") and check: True where the real matrices pass significantly more often than their
    nulls (``discriminates``), False where they do not (non-discriminating), None where nothing is required."""
    real, null = _counts(rows, False), _counts(rows, True)
    return {
        site: {
            c: (None if n == 0 or null[site][c][1] == 0 else discriminates((p, n), null[site][c]))
            for c, (p, n) in by.items()
        }
        for site, by in real.items()
    }


def site_summary(rows: list[dict]) -> dict[str, dict]:
    """Per site, counted per site-layer (not averaged away): layers where tiled beats the whole-matrix SVD
    on the per-mount lift and on the span lift, and the span lifts as fractions of the data ceiling
    (mean, min, max over layers); with the null, the same span comparison for the nulls."""
    out = {}
    for site in dict.fromkeys(r["site"] for r in rows):
        mine = [r for r in rows if r["site"] == site]
        entry = {
            "n_layers": len(mine),
            "tiled_beats_whole_lift": sum(r["lift_tiled"] > r["lift_whole"] for r in mine),
            "tiled_beats_whole_span": sum(r["span_lift_tiled"] > r["span_lift_whole"] for r in mine),
        }
        for strat in STRATEGIES[:-1]:
            fr = [r[f"ceiling_fraction_{strat}"] for r in mine if f"ceiling_fraction_{strat}" in r]
            if fr:
                entry[f"ceiling_fraction_{strat}"] = {"mean": sum(fr) / len(fr), "min": min(fr), "max": max(fr)}
        if "null" in mine[0]:
            entry["null_tiled_beats_whole_lift"] = sum(r["null"]["lift_tiled"] > r["null"]["lift_whole"] for r in mine)
            entry["null_tiled_beats_whole_span"] = sum(
                r["null"]["span_lift_tiled"] > r["null"]["span_lift_whole"] for r in mine
            )
        out[site] = entry
    return out


def csv_row(row: dict) -> dict:
    """One flat CSV row: lists joined with ``;``, checks as columns."""
    out = {}
    for k, v in row.items():
        if k == "checks":
            out.update({f"check_{c}": ("" if x is None else int(x)) for c, x in v.items()})
        elif isinstance(v, dict):  # the null's figures: null_<key>
            out.update({f"{k}_{kk}": vv for kk, vv in csv_row(v).items() if kk != "layer"})
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
        results = {
            "experiment": "tiled_mounts",
            "model": hp.get("model"),
            "config": hp,
            "n_tokens": max(r["n_tokens"] for r in rows),
            "pass_table": pass_table(rows),
            "n_pass": sum(r["pass"] for r in rows),
            "n_site_layers": len(rows),
            "tile_widths": dict(pl_module.tile_widths),
            "site_summary": site_summary(rows),
            "sites": rows,
        }
        if "null" in rows[0]:
            results.update(
                pass_table_null=pass_table(rows, null=True),
                n_pass_null=sum(r["null"]["pass"] for r in rows),
                discriminating=discrimination(rows),
            )
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
