"""EdgeCircuitReport: the edge circuits of ``EdgeCircuitModule`` written into the run folder.

After ``test`` (rank zero): ``results.json`` (``lit_svd.results.EdgeCircuitResult``, experiment ``edge_circuits``),
``edge_curves.csv`` (one row per curve and size), ``edge_curves.png`` (also a TensorBoard image); with a graph
(the module's ``graph_curve``): the circuit's graph as the circuit-graph run writes it (``graph.json``,
``graph.graphml``, ``nodes.csv``, ``graph_edges.csv``, ``circuit.html``: ``results.circuits.CircuitResult`` with its
``circuit`` field, drawn by ``figures.circuits.html_page``, at most ``page_blocks`` blocks on the page). Without a
graph (``graph_curve`` never reached ``graph_f``) results.json's ``graph`` says why. It reads the module's rows
only (``curves``, ``summary``, ``facts``, ``top``, ``timing``, ``graph``, ``graph_note``); it never runs the model.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from lit_svd.callbacks.provenance import provenance
from lit_svd.figures.circuits import html_page
from lit_svd.figures.edge_circuits import figures
from lit_svd.output import run_dir, save_figures, write_csv, write_graphml, write_json, write_result, write_text
from lit_svd.results.circuits import EDGE_COLUMNS, NODE_COLUMNS, CircuitResult, edge_counts
from lit_svd.results.edge_circuits import EdgeCircuitResult

GRAPH_KEYS = ("task", "model", "n_prompts", "options", "metric", "counts", "circuit", "nodes", "edges")


def graph_result(module, prov) -> CircuitResult:
    """The drawn circuit (``module.graph``) as a circuit-graph result."""
    f, g = module.facts, module.graph
    circuit = {k: g[k] for k in ("curve", "size", "f", "f_target", "chosen_by", "note", "n_edges", "weighted")}
    top = [{k: e[k] for k in ("writer", "reader", "reader_unit", "score")} for e in module.top[:50]]
    circuit.update(n_blocks=len(g["edges"]), checks=g["checks"], top_edges=top)
    options = {"builder": "attribution", **{k: f["options"][k] for k in ("n_check", "n_random", "seed")}}
    metric = {"clean": f["m_full"], "corrupted": f["m_empty"], "gap": f["m_full"] - f["m_empty"]}
    return CircuitResult(
        task=f["task"],
        model=f["model"],
        n_prompts=f["n_prompts"],
        options=options,
        metric=metric,
        counts={"nodes": len(g["nodes"]), **edge_counts(g["edges"])},
        nodes=g["nodes"],
        edges=sorted(g["edges"], key=lambda e: -(e.get("abs_weight") or 0.0)),
        faithfulness=module.curves,
        circuit=circuit,
        provenance=prov,
    )


def graph_summary(module) -> dict | None:
    """results.json's ``graph``: the drawn graph less its nodes; without one, why (``drawn`` false, ``note``)."""
    if module.graph is not None:
        return {"drawn": True, **{k: v for k, v in module.graph.items() if k != "nodes"}}
    if module.graph_note is not None:
        f = module.facts["options"]
        return {"drawn": False, "curve": f["graph_curve"], "f_target": f["graph_f"], "note": module.graph_note}
    return None


class EdgeCircuitReport(Callback):
    """Writes the edge circuits of ``EdgeCircuitModule`` after ``test`` (see the module docstring)."""

    def on_test_end(self, trainer, module) -> None:
        f = module.facts
        prov = provenance(trainer, module)
        result = EdgeCircuitResult(
            task=f["task"],
            model=f["model"],
            n_prompts=f["n_prompts"],
            n_train_prompts=f["n_train_prompts"],
            steps=f["steps"],
            counts=f["counts"],
            m_full=f["m_full"],
            m_empty=f["m_empty"],
            curves=module.curves,
            comparison=module.summary,
            top_edges=[{k: e[k] for k in ("writer", "reader", "reader_unit", "score")} for e in module.top],
            timing=module.timing,
            graph=graph_summary(module),
            options=f["options"],
            pruning=f.get("pruning"),
            provenance=prov,
        )
        write_result(trainer, result)
        if not trainer.is_global_zero:
            return
        save_figures(trainer, figures(result))
        if module.graph is not None:
            folder = run_dir(trainer)
            graph = graph_result(module, prov)
            content = graph.to_dict()
            write_json(folder / "graph.json", {"experiment": "circuit_graph", **{k: content[k] for k in GRAPH_KEYS}})
            write_graphml(folder / "graph.graphml", graph.to_graph(), nan_ok=True)
            write_csv(folder / "nodes.csv", graph.node_rows(), NODE_COLUMNS)
            extra = ("n_kept", "fraction", "checked_edge")
            rows = [{**r, **{k: e.get(k) for k in extra}} for r, e in zip(graph.rows(), graph.edges)]
            write_csv(folder / "graph_edges.csv", rows, (*EDGE_COLUMNS, *extra))
            write_text(folder / "circuit.html", html_page(graph, max_blocks=f["options"]["page_blocks"]))
