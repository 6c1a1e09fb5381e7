"""Faithfulness curves of rankings of a model's directions (``FaithfulnessModule``; docs/circuits.md,
"Faithfulness")."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results.base import Result, doc_field, optional

CURVE_COLUMNS = (
    "method",
    "ranking",
    "axis",
    "size",
    "n_kept",
    "raw_size",
    "fair_size",
    "value",
    "metric",
    "cpr",
    "cmd",
    "seconds",
)


@dataclass(kw_only=True, repr=False)
class CurvesResult(Result):
    """What every result of faithfulness curves holds first (``FaithfulnessResult``, ``EdgeCircuitResult``): the task,
    the model, the test prompts and the two references of MIB's f = (m(C) - m(empty)) / (m(full) - m(empty))."""

    task: str = doc_field("ioi, gp or gt")
    model: str = doc_field("the model (alias, hub name, folder or GGUF file)")
    n_prompts: int = doc_field("test prompts the curves average over (the metric's mean)")
    m_full: float = doc_field("m(full): mean task metric of the clean forward (nothing patched, every edge kept)")
    m_empty: float = doc_field("m(empty): mean task metric of the corrupted forward (everything patched)")


@dataclass(kw_only=True, repr=False)
class FaithfulnessResult(CurvesResult):
    """Per method its rankings' faithfulness curves over MIB's grid of sizes on two axes (raw fraction of directions,
    fair size), MIB's two scores (CPR of the signed ranking, CMD of the absolute one), on one task's test prompts,
    with one ablation (the directions outside the circuit patched toward the corrupted run at every position)."""

    experiment = "faithfulness"
    table_file = "faithfulness.csv"
    table_columns = CURVE_COLUMNS

    n_directions: int = doc_field("directions in the universe (q, k, ov, mlp_in, mlp_gate, mlp_out maps)")
    faithfulness: dict = doc_field(
        "per method (eap_ig, eap, eap_ig_heads, eap_heads, mask, graph, random_<seed>): rankings {signed, absolute"
        " (attribution methods) or ranking: {raw, fair: {sizes [n], n_kept [n], raw_size [n] (fraction of the"
        " directions kept), fair_size [n] (mean kept fraction of the units), values [n] ((m(C) - m(empty)) /"
        " (m(full) - m(empty)), ratio of means, not clipped), metric [n] (m(C)), cpr, cmd (trapezoid areas of"
        " values and |1 - values| over sizes), seconds, cpr_ci / cmd_ci / values_ci ([lo, hi]; values_ci: [[lo per"
        " size], [hi per size]]: 95 % BCa bootstrap intervals over the test prompts; null for one prompt),"
        " prompt_metric [n][prompts] (m(C) per prompt, in the order of intervals.prompt_index)}}}, cpr {raw, fair}"
        " (of the signed ranking), cmd {raw, fair} (of the absolute ranking)"
    )
    vs_heads: dict | None = optional(
        "with eap_ig_heads among the methods: anchor (eap_ig_heads), methods {method: {raw, fair: {cpr (signed"
        " ranking), heads_cpr, cpr_diff, cpr_diff_ci, cmd (absolute ranking), heads_cmd, cmd_diff, cmd_diff_ci}}}:"
        " every other method against head-level EAP-IG on the same axis; *_diff_ci: the 95 % BCa bootstrap interval"
        " of the method's area minus head EAP-IG's, paired over the test prompts (0 inside: not resolved)"
    )
    intervals: dict | None = optional(
        "the bootstrap over the test prompts (analysis.area_intervals): method (BCa), level, resamples,"
        " percentile_fallback (outputs whose BCa interval was undefined), prompt_full / prompt_empty [prompts]"
        " (m(full), m(empty) per prompt), prompt_index [prompts] (each prompt's index in the test split: the order"
        " of every prompt_metric)"
    )
    random: dict | None = optional(
        "the random rankings: cpr_<axis>_mean, cpr_<axis>_std, cmd_<axis>_mean, cmd_<axis>_std (axis raw, fair), seeds"
    )
    rankings: dict = doc_field(
        "per method what its ranking used (attribution methods: prompts, attribution_s, top_directions or"
        " top_units; mask: directions_scored, kept; graph: nodes_used, nodes_skipped, directions_scored, qk_nodes,"
        " graph_run)"
    )
    mask_run: str | None = doc_field("the mask run folder (null: none)", None)
    graph_run: str | None = doc_field("the circuit-graph run folder (null: none)", None)
    wall_s: float = doc_field("seconds of the test loop (every curve, the shared references, full and empty runs)")

    def __post_init__(self) -> None:
        # a run from before issue 32 stored one curve per method (one ranking, the raw axis): read it in
        # today's layout, so that its rows, headline and figure work
        for method, entry in self.faithfulness.items():
            if "rankings" not in entry:
                self.faithfulness[method] = {
                    "rankings": {"ranking": {"raw": entry}},
                    "cpr": {"raw": entry["cpr"]},
                    "cmd": {"raw": entry["cmd"]},
                }

    @property
    def headline(self) -> dict:
        """m(full), m(empty); each ranking's CPR (signed) and CMD (absolute) on the fair axis (the random rankings as
        their mean)."""
        out: dict = {"m_full": self.m_full, "m_empty": self.m_empty}
        for method, e in self.faithfulness.items():
            if not method.startswith("random"):
                out.update({f"cpr_fair_{method}": e["cpr"].get("fair"), f"cmd_fair_{method}": e["cmd"].get("fair")})
        if self.random:
            r = self.random
            out.update(cpr_fair_random_mean=r.get("cpr_fair_mean"), cmd_fair_random_mean=r.get("cmd_fair_mean"))
        return out

    def scores(self) -> list[dict]:
        """One row per method: CPR (signed ranking) and CMD (absolute ranking) on each axis."""
        return [
            {"method": m, **{f"{s}_{a}": e[s][a] for s in ("cpr", "cmd") for a in ("raw", "fair") if a in e[s]}}
            for m, e in self.faithfulness.items()
        ]

    def rows(self) -> list[dict]:
        """One row per (method, ranking, axis, size)."""
        out = []
        for method, entry in self.faithfulness.items():
            for ranking, axes in entry["rankings"].items():
                for axis, c in axes.items():
                    for i, size in enumerate(c["sizes"]):
                        fair = c.get("fair_size")
                        out.append({
                            "method": method, "ranking": ranking, "axis": axis, "size": size,
                            "n_kept": c["n_kept"][i], "raw_size": c.get("raw_size", c["sizes"])[i],
                            "fair_size": None if fair is None else fair[i], "value": c["values"][i],
                            "metric": c["metric"][i], "cpr": c["cpr"], "cmd": c["cmd"], "seconds": c["seconds"],
                        })  # fmt: skip
        return out
