"""Edge circuits between directions (``EdgeCircuitModule``; docs/circuits.md, "Edge circuits"): EAP-IG edge scores
on the training prompts, faithfulness curves of their circuits on the test prompts under MIB's edge ablation, and
the circuit graph of the attribution circuit at a chosen size."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results.base import doc_field, optional
from lit_svd.results.faithfulness import CurvesResult

CURVE_COLUMNS = ("curve", "size", "n_edges", "weighted", "value", "metric", "cpr", "cmd", "seconds")


@dataclass(kw_only=True, repr=False)
class EdgeCircuitResult(CurvesResult):
    """Per curve (a ranking of edges at one level, signed or absolute, on the raw or the fair axis) its faithfulness
    over MIB's grid, CPR and CMD; the edge counts; the strongest edges; the graph's circuit."""

    experiment = "edge_circuits"
    table_file = "edge_curves.csv"
    table_columns = CURVE_COLUMNS

    n_train_prompts: int = doc_field("training prompts the edge scores average over")
    steps: int = doc_field("integrated-gradient steps of the attribution (MIB: 5)")
    counts: dict = doc_field(
        "edges at each level (directions: reader direction x writer direction; writer_units: reader direction x"
        " writer unit; units: reader unit x writer unit, MIB's head-level edges = the blocks), reader_units,"
        " reader_directions, writer_units_n, writer_directions"
    )
    curves: dict = doc_field(
        "per curve <level or block order>_<signed|abs>_<raw|fair> or random_<level>_<seed>: sizes [n] (fractions of"
        " the edges of the level (raw) or of the weighted edge count (fair)), n_edges [n] (edges kept at the level),"
        " weighted [n] (weighted edge count / blocks), values [n] ((m(C) - m(empty)) / (m(full) - m(empty))),"
        " metric [n], cpr (area of values: signed rankings), cmd (area of |1 - values|: absolute rankings), seconds,"
        " cpr_ci / cmd_ci / values_ci ([lo, hi]; values_ci: [[lo per size], [hi per size]]: 95 % BCa bootstrap"
        " intervals over the test prompts), prompt_metric [n][prompts]"
    )
    comparison: dict = doc_field(
        "per curve: cpr, cmd; comparisons: direction vs head-level edges per level or block order and axis (cpr:"
        " signed, cmd: absolute), vs_units (every signed curve's cpr, every absolute curve's cmd against the"
        " head-level edges') and the random curves' mean; cpr_diff_ci / cmd_diff_ci: the 95 % BCa bootstrap interval of"
        " the difference to the head-level edges, paired over the test prompts (0 inside: not resolved)"
    )
    top_edges: list[dict] = doc_field(
        "the strongest direction edges by |score|: writer, reader (addresses), reader_unit, score"
    )
    timing: dict = doc_field(
        "seconds: universe (SVDs), attribution, pruning (edge pruning, when asked), curves (each), total; peak_rss_gb"
    )
    graph: dict | None = optional(
        "the circuit drawn (graph.json, circuit.html): drawn (false: graph_curve never reached graph_f, none drawn),"
        " curve, f_target, note (the warning when graph_f was not reached: the best f and its size); when drawn:"
        " size, chosen_by (graph_size, graph_f or best), f (its own faithfulness on the test prompts), n_edges,"
        " weighted, edges (blocks: writer unit -> reader unit with kept direction edges: n_kept, fraction, weight),"
        " checks of its strongest edges"
    )
    options: dict = doc_field("the module's options: methods, axes, sizes, random_seeds, n_attribution, ...")
    pruning: dict | None = optional(
        "per edge-pruning curve (pruned_signed_raw: objective metric, pruned_abs_raw: faithful): objective, steps,"
        " lr, keep (the fraction of head-level edges trained), prompts (the first of the training split), seconds,"
        " objective (per step, on those prompts, of the circuit before the step), swapped (blocks per step)"
    )

    @property
    def headline(self) -> dict:
        """m(full), m(empty); each ranked curve's CPR (signed) or CMD (absolute); the random curves' mean CPR per
        level."""
        out: dict = {"m_full": self.m_full, "m_empty": self.m_empty}
        for name, c in self.curves.items():
            if not name.startswith("random"):
                out[f"{'cmd' if '_abs_' in name else 'cpr'}_{name}"] = c.get("cmd" if "_abs_" in name else "cpr")
        for key, value in self.comparison.items():
            if key.startswith("random_"):
                out[f"cpr_{key}"] = value.get("cpr_mean")
        if self.graph:
            out["graph_f"] = self.graph.get("f")
        return out

    def rows(self) -> list[dict]:
        """One row per (curve, size)."""
        out = []
        for name, c in self.curves.items():
            for i, size in enumerate(c["sizes"]):
                row = {"curve": name, "size": size, "n_edges": c["n_edges"][i], "weighted": c["weighted"][i]}
                row |= {"value": c["values"][i], "metric": c["metric"][i]}
                out.append({**row, "cpr": c["cpr"], "cmd": c["cmd"], "seconds": c["seconds"]})
        return out
