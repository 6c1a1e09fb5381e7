"""The result of a tiled-mounts run and its tables, from its site-layer rows: pass counts per site and
check, the per-site summary, and whether each check discriminates real matrices from their structureless
nulls (one-sided Fisher exact test). A check that passes on the null at least as often as on the real
matrices is *non-discriminating* at that site."""

from __future__ import annotations

from lit_svd.analysis.mounts import STRATEGIES
from lit_svd.results.base import Provenance
from lit_svd.results.mounts import MountsResult

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


def mounts_result(
    rows: list[dict], *, model: str | None, config: dict, tile_widths: dict, provenance: Provenance | None = None
) -> MountsResult:
    """A mounts run's result from its site-layer rows: ``pass_table``, ``n_pass``, ``site_summary`` and, where
    the rows carry their nulls, ``pass_table_null``, ``n_pass_null`` and ``discriminating``. The one place a
    ``MountsResult`` is built: by the run (``MountsReport``) and by ``mounts-merge`` from its parts' rows."""
    nulls: dict = {}
    if "null" in rows[0]:
        nulls = dict(
            pass_table_null=pass_table(rows, null=True),
            n_pass_null=sum(r["null"]["pass"] for r in rows),
            discriminating=discrimination(rows),
        )
    return MountsResult(
        model=model,
        config=config,
        n_tokens=max(r["n_tokens"] for r in rows),
        n_site_layers=len(rows),
        tile_widths=tile_widths,
        sites=rows,
        pass_table=pass_table(rows),
        n_pass=sum(r["pass"] for r in rows),
        site_summary=site_summary(rows),
        **nulls,
        provenance=provenance,
    )
