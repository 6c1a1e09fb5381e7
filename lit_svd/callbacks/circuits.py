"""CircuitReport: the circuit graph of ``CircuitGraphModule`` written into the run folder.

After ``test`` (rank zero) it writes:

* ``results.json`` (``lit_svd.results.CircuitResult``, experiment ``circuit_graph``) and ``edges.csv`` (one row
  per edge: writer, reader, weight, abs_weight, kept_in, reader_kind, effect, gap_fraction, z, passes_z, passes);
* ``nodes.csv`` (one row per node: address fields, unit, degrees, |weight| in / out, readout tokens);
* ``graph.json`` (task, model, options, metric, counts, nodes, edges: what a script needs to redraw the graph);
* ``graph.graphml`` (the same graph for Gephi, Cytoscape, networkx: ``networkx.read_graphml``);
* ``circuit.html`` (one offline page: the graph drawn layer by layer, click a node for its readout and edges,
  sortable node and edge tables; open it with ``python -m webbrowser file://PATH``);
* ``circuit_graph.png``, ``circuit_faithfulness.png``, ``circuit_agreement.png`` (where measured), also as
  TensorBoard images;
* with ``mask_run``: the agreement of the graph's nodes with that finished mask run's kept directions, and with
  the module's top SAD terms of the graph's heads (``lit_svd.analysis.agreement``), in results.json.

It reads the module's rows only (``graph``, ``checks``, ``facts``, and where the module has them ``timing``,
``readouts`` ``{address: {side, plus, minus}}``, ``sad_terms`` ``{(layer, head): [mean |c_k| per QK direction]}``,
``faithfulness`` ``{method: curve row}``); it never runs the model.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from lit_svd.addresses import Address
from lit_svd.analysis.agreement import agreement_rows
from lit_svd.callbacks.provenance import provenance
from lit_svd.figures.circuits import figures, html_page
from lit_svd.output import run_dir, save_figures, write_csv, write_graphml, write_json, write_result, write_text
from lit_svd.results.circuits import NODE_COLUMNS, ROOT, CircuitResult
from lit_svd.runs import load_run

GRAPH_KEYS = ("task", "model", "n_prompts", "options", "metric", "counts", "nodes", "edges")


def graph_json(result: CircuitResult) -> dict:
    """graph.json's content: the result's graph fields (results.json without provenance, faithfulness or
    agreement); undefined values (an unchecked edge's z) are null."""
    content = result.to_dict()
    return {"experiment": content["experiment"], **{k: content[k] for k in GRAPH_KEYS}}


def direction_nodes(result: CircuitResult) -> list[Address]:
    """The graph's nodes as addresses (the root ``metric`` left out)."""
    return [Address.parse(n["address"]) for n in result.nodes if n["address"] != ROOT]


class CircuitReport(Callback):
    """Writes the circuit graph of ``CircuitGraphModule`` after ``test`` (see the module docstring).

    Args:
        mask_run: folder of a finished direction-mask run of the same model and task (``masks.pt``): the
            agreement of the graph's nodes with its kept directions (null: no mask agreement).
        mask_kinds: the mask run's component kinds compared (null: every kind it masked).
        sad_top: top SAD terms per graph head compared with the graph's QK nodes.
        html_name: file name of the page.
    """

    def __init__(
        self,
        mask_run: str | None = None,
        mask_kinds: list[str] | None = None,
        sad_top: int = 4,
        html_name: str = "circuit.html",
    ):
        if sad_top < 1:
            raise ValueError(f"sad_top={sad_top}: must be >= 1")
        self.mask = None
        if mask_run is not None:
            masks = load_run(mask_run, need=("masks",), what="direction-mask run").masks
            self.mask = (masks["lambdas"], float(masks["threshold"]))
        self.mask_run, self.mask_kinds, self.sad_top, self.html_name = mask_run, mask_kinds, sad_top, html_name

    def result(self, trainer, module) -> CircuitResult:
        """The result of the module's rows (and the agreement, where a source is given)."""
        result = CircuitResult.from_graph(
            module.graph,
            checks=module.checks,
            readouts=getattr(module, "readouts", None),
            faithfulness=getattr(module, "faithfulness", None),
            timing=getattr(module, "timing", None) or None,
            provenance=provenance(trainer, module),
            **module.facts,
        )
        sad_terms = getattr(module, "sad_terms", None)
        if self.mask is not None or sad_terms:
            rows = agreement_rows(
                result.task,
                direction_nodes(result),
                mask=self.mask,
                sad_terms=sad_terms,
                sad_top=self.sad_top,
                mask_kinds=self.mask_kinds,
            )
            result.agreement = [{**r, "mask_run": self.mask_run} if r["source"] == "mask" else r for r in rows]
        return result

    def on_test_end(self, trainer, module) -> None:
        result = self.result(trainer, module)
        if not result.edges:
            rank_zero_warn(
                f"the circuit graph is empty: no writer reached threshold={result.options.get('threshold')} of a"
                " reader's sum of |contributions| on any prompt; a lower threshold keeps more"
            )
        write_result(trainer, result)
        if trainer.is_global_zero:
            folder = run_dir(trainer)
            write_csv(folder / "nodes.csv", result.node_rows(), NODE_COLUMNS)
            write_json(folder / "graph.json", graph_json(result))
            write_graphml(folder / "graph.graphml", result.to_graph(), nan_ok=True)
            write_text(folder / self.html_name, html_page(result))
            save_figures(trainer, figures(result))
