"""Faithfulness curves of rankings of a model's directions (``FaithfulnessModule``; docs/circuits.md,
"Faithfulness")."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results.base import Result, doc_field, optional

CURVE_COLUMNS = ("method", "size", "n_kept", "value", "metric", "cpr", "cmd", "seconds")


@dataclass(kw_only=True, repr=False)
class FaithfulnessResult(Result):
    """Per ranking (method) its faithfulness curve over MIB's grid of sizes, CPR and CMD, on one task's test
    prompts, with one ablation (the directions outside the circuit patched toward the corrupted run at every
    position)."""

    experiment = "faithfulness"
    table_file = "faithfulness.csv"
    table_columns = CURVE_COLUMNS

    task: str = doc_field("ioi, gp or gt")
    model: str = doc_field("the model (alias, hub name, folder or GGUF file)")
    n_prompts: int = doc_field("test prompts the metric is averaged over")
    n_directions: int = doc_field("directions in the universe (q, k, ov, mlp_in, mlp_gate, mlp_out maps)")
    m_full: float = doc_field("m(full): mean task metric of the clean prompts (nothing patched)")
    m_empty: float = doc_field("m(empty): mean task metric with every direction patched (the corrupted run)")
    faithfulness: dict = doc_field(
        "per method (eap_heads, mask, graph, random_<seed>): sizes [n] (fractions kept), n_kept [n], values [n]"
        " ((m(C) - m(empty)) / (m(full) - m(empty)), ratio of means), metric [n] (m(C)), cpr (trapezoid area of"
        " values over sizes), cmd (area of |1 - values|), seconds (that curve's forwards)"
    )
    random: dict | None = optional("the random rankings: cpr_mean, cpr_std, cmd_mean, cmd_std, seeds")
    rankings: dict = doc_field(
        "per method what its ranking used (eap_heads: top_units, attribution_s; mask: directions_scored, kept;"
        " graph: nodes_used, nodes_skipped, directions_scored, qk_nodes, graph_run)"
    )
    mask_run: str | None = doc_field("the mask run folder (null: none)", None)
    graph_run: str | None = doc_field("the circuit-graph run folder (null: none)", None)
    wall_s: float = doc_field("seconds of the test loop (every curve, the shared references, full and empty runs)")

    @property
    def headline(self) -> dict:
        """m(full), m(empty); each ranking's CPR and CMD (the random rankings as their mean)."""
        out: dict = {"m_full": self.m_full, "m_empty": self.m_empty}
        for method, c in self.faithfulness.items():
            if not method.startswith("random"):
                out.update({f"cpr_{method}": c.get("cpr"), f"cmd_{method}": c.get("cmd")})
        if self.random:
            out.update(cpr_random_mean=self.random.get("cpr_mean"), cmd_random_mean=self.random.get("cmd_mean"))
        return out

    def rows(self) -> list[dict]:
        """One row per (method, size)."""
        out = []
        for method, c in self.faithfulness.items():
            for i, size in enumerate(c["sizes"]):
                row = {"method": method, "size": size, "n_kept": c["n_kept"][i], "value": c["values"][i]}
                out.append({**row, "metric": c["metric"][i], "cpr": c["cpr"], "cmd": c["cmd"], "seconds": c["seconds"]})
        return out
