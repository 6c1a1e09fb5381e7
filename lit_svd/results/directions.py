"""Single directions: the causal check of a mask run's claims (``DirectionReport``) and the comparison of
two models' singular directions (``cli_tools compare-directions``)."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results.base import Result, doc_field, nan_field, optional

COLUMNS = (
    "component",
    "kind",
    "layer",
    "head",
    "direction",
    "sigma",
    "block",
    "block_size",
    "block_claimed",
    "gap",
    "isolated",
    "past_rank",
    "effect",
    "null_mean",
    "null_std",
    "z",
    "percentile",
    "passes",
    "gap_fraction",
    "passes_gap",
    "readout_side",
    "readout_plus",
    "readout_minus",
)
SEP = " | "  # between readout tokens in the CSV and the page


def direction_row(row: dict) -> dict:
    """A table row of plain values: the block's id and size, the readout's token lists joined by ``SEP``."""
    read = row.get("readout") or {}
    out = {k: row[k] for k in COLUMNS if k in row}
    out.update(
        block=row["block"]["id"],
        block_size=row["block"]["size"],
        readout_side=read.get("side", ""),
        readout_plus=SEP.join(read.get("plus", [])),
        readout_minus=SEP.join(read.get("minus", [])),
    )
    return {k: out.get(k) for k in COLUMNS}


def check_summary(rows: list[dict]) -> dict:
    """Counts and fractions of isolated and passing directions (None where nothing is counted)."""
    n = len(rows)
    iso = [r for r in rows if r["isolated"]]
    return {
        "n_directions": n,
        "n_isolated": len(iso),
        "fraction_isolated": len(iso) / n if n else None,
        "n_pass": sum(r["passes"] for r in rows),
        "fraction_pass": sum(r["passes"] for r in rows) / n if n else None,
        "fraction_pass_isolated": sum(r["passes"] for r in iso) / len(iso) if iso else None,
        "fraction_pass_in_blocks": (
            sum(r["passes"] for r in rows if not r["isolated"]) / (n - len(iso)) if n > len(iso) else None
        ),
        **gap_summary(rows),
    }


def gap_summary(rows: list[dict]) -> dict:
    """``n_pass_gap``, ``fraction_pass_gap`` (z and the gap fraction) and the mean ``metric_gap``, when the rows
    carry the gap columns (empty otherwise)."""
    if not rows or "passes_gap" not in rows[0]:
        return {}
    n = sum(r["passes_gap"] for r in rows)
    return {"n_pass_gap": n, "fraction_pass_gap": n / len(rows), "metric_gap": rows[0]["metric_gap"]}


@dataclass(kw_only=True, repr=False)
class DirectionCheckResult(Result):
    """Per claimed direction of a finished mask run: block, causal check against random directions of its
    head, readout (docs/masks.md, "Which kept directions to trust")."""

    experiment = "direction_check"
    table_file = "directions.csv"
    table_columns = COLUMNS
    headline_keys = (
        "n_directions",
        "n_pass",
        "fraction_pass",
        "n_isolated",
        "fraction_pass_isolated",
        "fraction_pass_in_blocks",
        "n_pass_gap",
        "metric_gap",
        "z_pass",
    )

    run: str = doc_field("the checked mask run folder")
    model: str = doc_field("the model")
    task: str | None = doc_field("ioi, gp or gt")
    claims: str = doc_field("kept or swap")
    kinds: list[str] = doc_field("component kinds checked")
    n_directions: int = doc_field("checked directions (the table's rows)")
    n_claimed: int | None = optional("directions the run claims; more than n_directions when max_claims cut them")
    max_claims: int | None = optional("at most this many claims checked, those with the largest mask values")
    n_isolated: int = doc_field("of them isolated (a block of one)")
    fraction_isolated: float | None = doc_field("n_isolated / n_directions")
    n_pass: int = doc_field("directions passing the causal check")
    fraction_pass: float | None = doc_field("n_pass / n_directions")
    fraction_pass_isolated: float | None = doc_field("passing fraction among isolated directions")
    fraction_pass_in_blocks: float | None = doc_field("passing fraction among directions in blocks")
    n_pass_gap: int | None = optional("directions passing z AND |gap_fraction| >= min_gap_fraction")
    fraction_pass_gap: float | None = optional("n_pass_gap / n_directions")
    metric_gap: float | None = optional("mean m(clean) - m(corrupted) over the test prompts")
    min_gap_fraction: float | None = optional("|effect| / metric gap a gap pass needs (fixed before any run)")
    level: float = doc_field("one-sided level of the check")
    z_pass: float = doc_field("z at or above which a direction passes")
    n_random: int = doc_field("random unit directions per head in the null")
    seed: int = doc_field("seed of the random directions")
    rel_gap: float = doc_field("relative gap of a block")
    wall_s: float = doc_field("wall time of the check")
    probes: int = doc_field("probes patched (claimed and random directions)")
    n_prompts: int = doc_field("test prompts")
    directions_per_s: float = doc_field("claimed directions checked per second")
    probe_rows_per_s: float = doc_field("(prompt, probe) rows per second")
    table_csv: str = doc_field("the CSV table's file name", "directions.csv")
    table_html: str = doc_field("the HTML page's file name", "directions.html")
    directions: list[dict] = doc_field(
        "per claimed direction: component, kind, layer, head, direction, sigma, block {id, size, first, last},"
        " block_claimed, gap, isolated, past_rank, effect, null_mean, null_std, z, percentile, passes (z alone),"
        " metric_gap, gap_fraction, passes_gap (z and the gap fraction),"
        " readout {side, plus [top_k], minus [top_k]}"
    )

    def rows(self) -> list[dict]:
        """One row per direction, the columns of ``COLUMNS``."""
        return [direction_row(r) for r in self.directions]

    def table_name(self) -> str:
        return self.table_csv


@dataclass(kw_only=True, repr=False)
class CompareDirectionsResult(Result):
    """The top singular directions of every head (and MLP map) of model A followed into model B."""

    experiment = "compare_directions"
    table_file = "compare_directions.csv"

    model_a: str = doc_field("the reference model")
    model_b: str = doc_field("the model whose directions are matched to A's")
    top: int = doc_field("top directions of A followed per matrix")
    rel_gap: float = doc_field("relative gap of a block")
    min_cos: float = doc_field("|cos| below which a direction is lost")
    per_kind: dict = doc_field("per kind: matrices, directions, kept, block, lost", key="summary")
    matrices: list[dict] = nan_field(
        "per matrix: matrix, layer, head, state [top], cos [top], sigma [top], sigma_ref [top], sigma_ratio [top]"
        " (null where A's sigma is 0), n_kept, n_block, n_lost",
        key="rows",
    )

    @property
    def headline(self) -> dict:
        """The top directions followed; per kind how many of them were kept, found in a block, or lost."""
        out: dict = {"top": self.top}
        for kind, counts in self.per_kind.items():
            if isinstance(counts, dict):
                out.update({f"{kind}_{k}": counts[k] for k in ("directions", "kept", "block", "lost") if k in counts})
        return out

    def subject(self) -> str:
        return f"{self.model_a} -> {self.model_b}"

    def rows(self) -> list[dict]:
        """One row per (matrix, direction): matrix, layer, head, direction, state, cos, sigma, sigma_ref,
        sigma_ratio."""
        out = []
        for m in self.matrices:
            for i, state in enumerate(m["state"]):
                row = {"matrix": m["matrix"], "layer": m["layer"], "head": m["head"], "direction": i, "state": state}
                for key in ("cos", "sigma", "sigma_ref", "sigma_ratio"):
                    if key in m and i < len(m[key]):
                        row[key] = m[key][i]
                out.append(row)
        return out
