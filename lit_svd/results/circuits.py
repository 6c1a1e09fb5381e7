"""Circuit graphs of singular directions (issue 24): the graph, its causal edge checks, faithfulness curves and
the agreement with the other methods, as one typed result (``CircuitReport``; docs/circuits.md, "Outputs").

A graph's nodes are named by ``str(Address)`` (``L3.ov.h2.d0``, ``L3.ov.h2.d0-3``, ``L3.b_O``, ``embed``) plus
the root ``metric`` (the task's metric read through the final norm and the unembedding); an edge runs from a
writer to the reader it feeds, with the mean signed contribution over the prompts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lit_svd.results._rows import flat
from lit_svd.results.base import Result, doc_field, nan_field, optional

ROOT = "metric"  # the graph's root node: the task metric's read
NODE_KEYS = ("address", "layer", "kind", "group", "index", "size")
EDGE_KEYS = ("writer", "reader", "weight", "abs_weight", "kept_in", "reader_kind")
CHECK_KEYS = ("effect", "null_mean", "null_std", "z", "percentile", "gap_fraction", "passes_z", "passes")
EDGE_COLUMNS = EDGE_KEYS + CHECK_KEYS
NODE_COLUMNS = (*NODE_KEYS, "unit", "in_degree", "out_degree", "abs_in", "abs_out", "readout_plus", "readout_minus")
SEP = " | "  # between readout tokens in the CSV and the page


def edge_counts(edges: Iterable[dict]) -> dict[str, int]:
    """``edges``; ``checked`` (a causal check ran: ``z`` is not None); ``passes_z`` (z at or above the level's);
    ``passes`` (z and the minimum fraction of the metric gap both)."""
    edges = list(edges)
    checked = [e for e in edges if e.get("z") is not None]
    return {
        "edges": len(edges),
        "checked": len(checked),
        "passes_z": sum(bool(e.get("passes_z")) for e in checked),
        "passes": sum(bool(e.get("passes")) for e in checked),
    }


def node_row(node: dict, edges: list[dict] | None = None, degrees: dict | None = None) -> dict:
    """A node's table row: its address fields, unit, degrees and summed ``abs_weight`` in / out (over ``edges``, or
    from ``degrees``, ``node_degrees(edges)``), its readout's tokens joined by ``SEP``."""
    read = node.get("readout") or {}
    row = {k: node.get(k) for k in (*NODE_KEYS, "unit")}
    if degrees is None and edges is not None:
        degrees = node_degrees(edges)
    if degrees is not None:
        row.update(degrees.get(node["address"], {"in_degree": 0, "out_degree": 0, "abs_in": 0.0, "abs_out": 0.0}))
    row.update(readout_plus=SEP.join(read.get("plus", [])), readout_minus=SEP.join(read.get("minus", [])))
    return row


def node_degrees(edges: Iterable[dict]) -> dict[str, dict]:
    """Per node address: ``in_degree``, ``out_degree``, ``abs_in``, ``abs_out`` (summed ``abs_weight``)."""
    out: dict[str, dict] = {}
    for e in edges:
        for key, side in ((e["reader"], "in"), (e["writer"], "out")):
            d = out.setdefault(key, {"in_degree": 0, "out_degree": 0, "abs_in": 0.0, "abs_out": 0.0})
            d[f"{side}_degree"] += 1
            d[f"abs_{side}"] += e.get("abs_weight") or 0.0
    return out


def edge_row(edge: dict) -> dict:
    """An edge's table row, the columns of ``EDGE_COLUMNS`` (None where the edge was not checked)."""
    return {k: edge.get(k) for k in EDGE_COLUMNS}


def _matching(edges: dict[tuple[str, str, str | None], dict], row: dict) -> list[dict]:
    """The edge a check row names: by writer, reader and (when the row gives it) reader kind; a row without a
    reader kind must name one edge."""
    writer, reader = str(row["writer"]), str(row["reader"])
    found = [e for (w, r, k), e in edges.items() if (w, r) == (writer, reader)]
    if row.get("reader_kind") is not None:
        found = [e for e in found if e["reader_kind"] == row["reader_kind"]]
    if len(found) != 1:
        kind = f" ({row['reader_kind']})" if row.get("reader_kind") is not None else ""
        why = "no such edge in the graph" if not found else "several edges (give its reader_kind)"
        raise ValueError(f"check row of edge {writer} -> {reader}{kind}: {why}")
    return found


@dataclass(kw_only=True, repr=False)
class CircuitResult(Result):
    """One task's circuit graph of singular directions: nodes, edges with their causal checks, the counts, and
    (where measured) faithfulness curves and the agreement with the mask run and SAD."""

    experiment = "circuit_graph"
    table_file = "edges.csv"
    table_columns = EDGE_COLUMNS
    headline_keys = (
        "n_prompts",
        "nodes=counts/nodes",
        "edges=counts/edges",
        "checked=counts/checked",
        "passes_z=counts/passes_z",
        "passes=counts/passes",
        "metric_clean=metric/clean",
        "metric_gap=metric/gap",
    )

    task: str = doc_field("ioi, gp or gt")
    model: str = doc_field("the model (alias, hub name, folder or GGUF file)")
    n_prompts: int = doc_field("test prompts the graph is merged over")
    options: dict = doc_field(
        "the builder's options: threshold (a writer's share of a reader's sum of |contributions|), position_share"
        " (a position's share of a kept head direction's), depth, readers (traced reader kinds), unit (direction /"
        " block / head); the check's level, z_pass, min_gap_fraction, n_random"
    )
    metric: dict = doc_field("the task metric on the prompts: clean, corrupted, gap (= clean - corrupted)")
    counts: dict = doc_field(
        "nodes; edges; checked (edges with a causal check); passes_z (z >= z_pass); passes (z and gap fraction)"
    )
    nodes: list[dict] = doc_field(
        "per node: address (str(Address), or 'metric' for the root), layer, kind, group, index, size, unit,"
        " readout {side, plus [top_k], minus [top_k]} (optional)"
    )
    edges: list[dict] = nan_field(
        "per edge writer -> reader: writer, reader (node addresses), weight (mean signed contribution over the"
        " prompts), abs_weight (mean |contribution|), kept_in (prompts whose graph kept it), reader_kind (logit, ov,"
        " qk_query, qk_key), effect (metric change when only this edge is patched toward the corrupted run),"
        " gap_fraction (-effect / gap), null_mean, null_std, z (|effect| against random readers of the same"
        " writer), percentile, passes_z (z alone), passes (z and |gap_fraction| >= the minimum) (null: not"
        " checked); other keys of the builder (expanded_in, n_prompts) and of the check (gap, prompts) as given"
    )
    faithfulness: dict | None = optional(
        "per method (graph, eap, mask, random, ...; analysis/faithfulness.py): sizes [n] (fractions of the"
        " universe's directions kept, MIB's grid), n_kept [n], values [n] ((m(C) - m(empty)) / (m(full) -"
        " m(empty))), metric [n], cpr, cmd",
        nan_ok=True,
    )
    timing: dict | None = optional("wall seconds of the run's parts (graph_s: building, check_s: edge checks)")
    circuit: dict | None = optional(
        "the graph of an attribution circuit (analysis/edge_graph.py): curve (its ranking), size (fraction on that"
        " curve's axis), chosen_by (graph_size, graph_f or best), note (why a size below f_target), f (its own"
        " faithfulness on the test prompts), f_target, n_edges (direction edges kept at the curve's level), weighted"
        " (weighted edge count / blocks), n_blocks (its blocks: the edges), checks (the causal check rows of its"
        " strongest direction edges), top_edges (its strongest direction edges with their scores); its edges carry"
        " n_kept, fraction and the summed attribution as weight"
    )
    agreement: list[dict] | None = optional(
        "per source (mask, sad): units (universe size), n_graph, n_source, overlap, expected (by chance),"
        " ratio (overlap / expected), p_value (hypergeometric, overlap at least this large)",
        nan_ok=True,
    )

    def rows(self) -> list[dict]:
        """One row per edge, the columns of ``EDGE_COLUMNS``."""
        return [edge_row(e) for e in self.edges]

    def node_rows(self) -> list[dict]:
        """One row per node, the columns of ``NODE_COLUMNS`` (degrees and |weight| sums over ``edges``)."""
        degrees = node_degrees(self.edges)
        return [node_row(n, degrees=degrees) for n in self.nodes]

    def agreement_rows(self) -> list[dict]:
        """The agreement table's rows (flat)."""
        return [flat(r) for r in self.agreement or []]

    # --- graphs --------------------------------------------------------------------------------------
    def to_graph(self):
        """The graph as a ``networkx.MultiDiGraph`` (a ``DiGraph``; one edge per writer, reader and reader kind,
        the kind is the edge key, as the builder makes it): node key = address, node attributes = the node's
        fields (without ``address``), edge attributes = the edge's fields (without writer / reader); graph
        attributes: task, model, n_prompts, options, metric, counts."""
        import networkx as nx

        g = nx.MultiDiGraph(
            task=self.task,
            model=self.model,
            n_prompts=self.n_prompts,
            options=dict(self.options),
            metric=dict(self.metric),
            counts=dict(self.counts),
        )
        for node in self.nodes:
            g.add_node(node["address"], **{k: v for k, v in node.items() if k != "address"})
        for edge in self.edges:
            attrs = {k: v for k, v in edge.items() if k not in ("writer", "reader")}
            g.add_edge(edge["writer"], edge["reader"], key=edge.get("reader_kind"), **attrs)
        return g

    @classmethod
    def from_graph(
        cls, graph: Any, checks: Iterable[dict] = (), readouts: dict | None = None, **fields: Any
    ) -> CircuitResult:
        """The result of a builder's graph (``networkx.DiGraph``: node key = address, attributes layer, kind,
        group, index, size, unit; edge attributes weight, abs_weight, kept_in, reader_kind; a ``MultiDiGraph`` may
        hold one edge per reader kind) and its causal check rows (writer, reader, reader_kind, effect,
        gap_fraction, z, passes_z, passes); ``readouts``: ``{address: readout}``;
        ``fields``: the other fields (task, model, n_prompts, options, metric, ...). Graph attributes fill the
        fields not given. ``counts`` is computed. A check row whose edge is not in the graph fails."""
        readouts = readouts or {}
        for key in ("task", "model", "n_prompts", "options", "metric"):
            if key not in fields and key in graph.graph:
                fields[key] = graph.graph[key]
        nodes = []
        for key, attrs in graph.nodes(data=True):
            node = {"address": str(key), **{k: attrs.get(k) for k in NODE_KEYS[1:]}}
            node.update({k: v for k, v in attrs.items() if k not in NODE_KEYS})
            if str(key) in readouts:
                node["readout"] = readouts[str(key)]
            nodes.append(node)
        by_key: dict[tuple[str, str, str | None], dict] = {}
        for writer, reader, attrs in graph.edges(data=True):
            edge = {"writer": str(writer), "reader": str(reader), **{k: attrs.get(k) for k in EDGE_KEYS[2:]}}
            edge.update({k: v for k, v in attrs.items() if k not in EDGE_KEYS})
            edge.update({k: edge.get(k) for k in CHECK_KEYS})
            by_key[(edge["writer"], edge["reader"], edge["reader_kind"])] = edge
        for row in checks:
            for edge in _matching(by_key, row):
                edge.update({k: v for k, v in row.items() if k not in ("writer", "reader", "reader_kind")})
        edges = sorted(by_key.values(), key=lambda e: -(e.get("abs_weight") or 0.0))
        counts = {"nodes": len(nodes), **edge_counts(edges)}
        return cls(nodes=nodes, edges=edges, counts=counts, **fields)
