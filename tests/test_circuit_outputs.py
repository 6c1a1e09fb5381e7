"""What a person gets from a circuit-graph run: the typed result, graph.json, GraphML, the offline page, the
figures and the report callback, on a small synthetic graph (every field known, so each output is compared with
the graph it came from)."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from types import SimpleNamespace

import networkx as nx
import pytest

from lit_svd.figures.circuits import figures, html_page, layout
from lit_svd.output import graphml_text, write_graphml
from lit_svd.results import CircuitResult, load_result
from lit_svd.results.circuits import EDGE_COLUMNS, NODE_COLUMNS, edge_counts

NODES = {  # address -> (layer, kind, group, index, size)
    "embed": (-1, "embed", 0, 0, 1),
    "L0.ov.h1.d0": (0, "ov", 1, 0, 1),
    "L0.ov.h1.d2-3": (0, "ov", 1, 2, 2),
    "L0.b_O": (0, "b_O", 0, 0, 1),
    "L1.mlp_out.d4": (1, "mlp_out", 0, 4, 1),
    "L2.qk.h0.d1": (2, "qk", 0, 1, 1),
    "L2.ov.h0.d0": (2, "ov", 0, 0, 1),
    "metric": (3, "metric", 0, 0, 1),
}
EDGES = [  # writer, reader, weight, reader_kind, check (effect, gap_fraction, z, passes_z, passes) or None
    ("embed", "L0.ov.h1.d0", 0.8, "ov", (0.3, 0.06, 4.0, True, True)),
    ("embed", "L2.qk.h0.d1", -0.4, "qk_query", (0.01, 0.002, 3.1, True, False)),
    ("L0.ov.h1.d0", "L2.qk.h0.d1", 1.5, "qk_key", (0.9, 0.18, 7.5, True, True)),
    ("L0.ov.h1.d0", "L2.qk.h0.d1", 0.3, "qk_query", (0.02, 0.004, 1.0, False, False)),  # a second reader kind
    ("L0.ov.h1.d2-3", "L2.ov.h0.d0", -0.7, "ov", (0.05, 0.01, 0.4, False, False)),
    ("L0.b_O", "L1.mlp_out.d4", 0.2, "mlp", None),
    ("L1.mlp_out.d4", "metric", 0.6, "logit", (0.4, 0.08, 5.0, True, True)),
    ("L2.ov.h0.d0", "metric", 2.0, "logit", (1.2, 0.24, 9.0, True, True)),
]
READOUTS = {"L2.ov.h0.d0": {"side": "write", "plus": [" Mary", " John"], "minus": ["<b>", " the"]}}


def builder_graph() -> nx.DiGraph:
    """A graph as the builder hands it over (node key = address, the builder's attributes, one edge per reader
    kind keyed by it)."""
    g = nx.MultiDiGraph()
    for key, (layer, kind, group, index, size) in NODES.items():
        g.add_node(key, layer=layer, kind=kind, group=group, index=index, size=size, unit="block")
    for w, r, weight, kind, _ in EDGES:
        g.add_edge(w, r, key=kind, weight=weight, abs_weight=abs(weight), kept_in=7, reader_kind=kind)
    return g


def check_rows() -> list[dict]:
    keys = ("effect", "gap_fraction", "z", "passes_z", "passes")
    return [
        {"writer": w, "reader": r, "reader_kind": k, **dict(zip(keys, c))} for w, r, _, k, c in EDGES if c is not None
    ]


TRIPLES = sorted((w, r, k) for w, r, _, k, _ in EDGES)


FAITH = {  # as analysis/faithfulness.py's Curve.row gives them (sizes: fractions of the universe)
    "graph": {"sizes": [0.1, 0.4, 1.0], "n_kept": [1, 4, 10], "values": [0.2, 0.8, 1.0], "cpr": 0.7, "cmd": 0.2},
    "eap": {"sizes": [0.1, 0.4, 1.0], "n_kept": [1, 4, 10], "values": [0.1, 0.5, 1.0], "cpr": 0.5, "cmd": 0.4},
    "random": {"sizes": [0.1, 0.4, 1.0], "n_kept": [1, 4, 10], "values": [0.0, 0.1, 1.0], "cpr": 0.2, "cmd": 0.8},
}


def make_result(**kw) -> CircuitResult:
    facts = dict(
        task="ioi",
        model="tiny-llama",
        n_prompts=8,
        options={"threshold": 0.05, "depth": 2, "readers": ["logit", "ov", "qk"], "unit": "block"},
        metric={"clean": 3.0, "corrupted": -2.0, "gap": 5.0},
    )
    return CircuitResult.from_graph(builder_graph(), checks=check_rows(), readouts=READOUTS, **{**facts, **kw})


def test_result_from_the_builder_graph_and_back():
    res = make_result(faithfulness=FAITH)
    assert {n["address"] for n in res.nodes} == set(NODES)
    assert sorted((e["writer"], e["reader"], e["reader_kind"]) for e in res.edges) == TRIPLES
    by_key = {(e["writer"], e["reader"], e["reader_kind"]): e for e in res.edges}
    for w, r, weight, kind, check in EDGES:
        e = by_key[(w, r, kind)]
        assert e["weight"] == weight and e["abs_weight"] == abs(weight) and e["reader_kind"] == kind
        assert [e[k] for k in ("effect", "gap_fraction", "z", "passes_z", "passes")] == list(check or (None,) * 5)
    # counts against a brute-force count of the table above
    checked = [c for *_, c in EDGES if c is not None]
    assert res.counts == {
        "nodes": len(NODES),
        "edges": len(EDGES),
        "checked": len(checked),
        "passes_z": sum(c[3] for c in checked),
        "passes": sum(c[4] for c in checked),
    }
    assert [abs(e["weight"]) for e in res.edges] == sorted((abs(w) for _, _, w, *_ in EDGES), reverse=True)
    # the networkx graph round trip and the JSON round trip
    back = CircuitResult.from_graph(res.to_graph(), checks=check_rows(), faithfulness=FAITH)
    assert back.nodes == res.nodes and back.edges == res.edges and back.counts == res.counts
    assert back.task == "ioi" and back.metric == res.metric and back.options == res.options
    again = load_result(json.loads(res.to_json()))
    assert again == res and [r["writer"] for r in again.rows()] == [e["writer"] for e in res.edges]
    assert list(res.table().columns) == list(EDGE_COLUMNS)
    assert next(r for r in res.node_rows() if r["address"] == "L2.qk.h0.d1")["in_degree"] == 3


def test_a_check_of_an_edge_not_in_the_graph_fails():
    rows = [*check_rows(), {"writer": "embed", "reader": "metric", "z": 1.0}]
    with pytest.raises(ValueError, match="embed -> metric: no such edge"):
        CircuitResult.from_graph(
            builder_graph(), checks=rows, task="ioi", model="m", n_prompts=1, options={}, metric={}
        )


def test_edge_counts_count_unchecked_edges_as_not_checked():
    assert edge_counts([{"z": None}, {"z": 2.0, "passes_z": True, "passes": False}, {"z": 0.1}]) == {
        "edges": 3,
        "checked": 2,
        "passes_z": 1,
        "passes": 0,
    }


def test_graphml_reads_back_as_the_same_graph(tmp_path):
    res = make_result()
    write_graphml(tmp_path / "graph.graphml", res.to_graph(), nan_ok=True)
    g = nx.read_graphml(tmp_path / "graph.graphml", force_multigraph=True)
    assert set(g.nodes) == set(NODES) and sorted(g.edges(keys=True)) == TRIPLES
    for w, r, weight, kind, check in EDGES:
        attrs = g.edges[w, r, kind]
        assert attrs["weight"] == pytest.approx(weight, rel=1e-15) and attrs["reader_kind"] == kind
        assert ("z" in attrs) == (check is not None)  # an unchecked edge has no z (None is no attribute)
        if check:
            assert attrs["z"] == check[2] and attrs["passes"] == check[4]
    assert g.nodes["L0.ov.h1.d2-3"]["size"] == 2 and g.nodes["metric"]["kind"] == "metric"
    assert json.loads(g.nodes["L2.ov.h0.d0"]["readout"]) == READOUTS["L2.ov.h0.d0"]
    assert json.loads(g.graph["options"])["depth"] == 2
    bad = res.to_graph()
    bad.edges["embed", "L0.ov.h1.d0", "ov"]["z"] = math.nan
    with pytest.raises(ValueError, match="embed->L0.ov.h1.d0.z is nan"):
        graphml_text(bad)
    assert 'key="d' in graphml_text(bad, nan_ok=True)


class _Page(HTMLParser):
    """The page's SVG nodes / edges, the rows of its tables (by table id), URLs it would load, its JSON data."""

    def __init__(self):
        super().__init__()
        self.svg_nodes, self.svg_edges, self.urls, self.tables = [], [], [], {}
        self._table, self._row, self._cell, self._json, self.data = None, None, None, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href", "xlink:href", "data"):
            if key in a:
                self.urls.append(a[key])
        if tag == "circle" and "node" in a.get("class", ""):
            self.svg_nodes.append(a["data-address"])
        if tag == "path" and "edge" in a.get("class", ""):
            self.svg_edges.append((a["data-writer"], a["data-reader"], a["data-kind"]))
        if tag == "table" and "id" in a:
            self._table = a["id"]
            self.tables[self._table] = {"head": [], "rows": []}
        if tag == "tr" and self._table:
            self._row = []
        if tag in ("td", "th") and self._table:
            self._cell = a.get("data-v", "")
        if tag == "script" and a.get("type") == "application/json":
            self._json = ""

    def handle_data(self, data):
        if self._json is not None:
            self._json += data
        elif self._cell is not None and self._table and self._row is not None and not self._cell:
            self._cell = data if self._cell == "" else self._cell

    def handle_endtag(self, tag):
        if tag == "script" and self._json is not None:
            self.data, self._json = json.loads(self._json), None
        if tag in ("td", "th") and self._row is not None:
            self._row.append(self._cell)
            self._cell = None
        if tag == "tr" and self._row is not None:
            part = self.tables[self._table]
            (part["head"] if not part["head"] else part["rows"]).append(self._row)
            if len(part["head"]) == 1 and isinstance(part["head"][0], list):
                part["head"] = part["head"][0]
            self._row = None
        if tag == "table":
            self._table = None


def test_the_page_draws_and_lists_every_node_and_edge_offline():
    res = make_result(faithfulness=FAITH)
    page = html_page(res)
    parser = _Page()
    parser.feed(page)
    assert sorted(parser.svg_nodes) == sorted(NODES)
    assert sorted(parser.svg_edges) == TRIPLES
    assert parser.tables["nodes"]["head"] == list(NODE_COLUMNS)
    assert sorted(r[0] for r in parser.tables["nodes"]["rows"]) == sorted(NODES)
    edges = parser.tables["edges"]
    col = {c: i for i, c in enumerate(edges["head"])}
    key = lambda row: (row[col["writer"]], row[col["reader"]], row[col["reader_kind"]])  # noqa: E731
    assert sorted(map(key, edges["rows"])) == TRIPLES
    for row in edges["rows"]:
        want = next(c for w, r, _, k, c in EDGES if (w, r, k) == key(row))
        assert row[col["z"]] == ("" if want is None else str(want[2]))
    assert {r[0] for r in parser.tables["faithfulness"]["rows"]} == set(FAITH)
    # the click panel's data: every node with its readout, every edge with its check
    assert {n["address"] for n in parser.data["nodes"]} == set(NODES)
    assert next(n for n in parser.data["nodes"] if n["address"] == "L2.ov.h0.d0")["readout"] == READOUTS["L2.ov.h0.d0"]
    assert len(parser.data["edges"]) == len(EDGES)
    # offline: nothing is loaded from anywhere
    assert parser.urls == [] and "http://" not in page and "https://" not in page and "<script src" not in page
    assert "@import" not in page and "url(" not in page


def test_an_empty_graph_says_so():
    empty = CircuitResult(task="ioi", model="m", n_prompts=4, options={"threshold": 0.05}, metric={"gap": 3.0},
                          counts={"nodes": 0, "edges": 0, "checked": 0}, nodes=[], edges=[])  # fmt: skip
    assert "The graph is empty: no writer reached threshold=0.05" in html_page(empty)
    assert "The graph is empty" not in html_page(make_result())


def test_the_page_escapes_token_text():
    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags = set()

        def handle_starttag(self, tag, attrs):
            self.tags.add(tag)

    page = html_page(make_result())
    tags = Tags()
    tags.feed(page)
    assert "&lt;b&gt;" in page and "b" not in tags.tags  # the token "<b>" is text, not a tag


def test_layout_puts_nodes_by_layer_and_the_mlp_right_of_its_attention():
    pos = layout(make_result())  # embed, L0, L1 mlp, L2, metric hold nodes: columns 0 .. 4
    assert pos["embed"][0] == 0 and pos["metric"][0] == 4 and pos["L1.mlp_out.d4"][0] == 2
    assert pos["L0.ov.h1.d0"][0] == pos["L0.b_O"][0] == 1 and pos["L2.qk.h0.d1"][0] == 3
    column0 = sorted(pos[a][1] for a in NODES if pos[a][0] == 1)
    assert column0 == [0, 1, 2]  # one place per node
    assert sorted(pos[a][1] for a in NODES if pos[a][0] == 3) == [0.25, 1.75]  # spread over the fullest column
    sparse = make_result()
    sparse.nodes = [n for n in sparse.nodes if n["address"] in ("L2.ov.h0.d0", "metric")]
    assert layout(sparse) == {"L2.ov.h0.d0": (0, 0.0), "metric": (1, 0.0)}  # layers without nodes take no room


def test_figures_of_a_result_read_back_from_json():
    res = make_result(faithfulness=FAITH, agreement=[
        {"task": "ioi", "source": "mask", "overlap": 3, "expected": 1.2, "p_value": 0.04},
        {"task": "ioi", "source": "sad", "overlap": 1, "expected": 0.9, "p_value": 0.6},
    ])  # fmt: skip
    figs = figures(load_result(json.loads(res.to_json())))
    assert set(figs) == {"circuit_graph", "circuit_faithfulness", "circuit_agreement"}
    (ax,) = [a for a in figs["circuit_faithfulness"].axes]
    lines = {ln.get_label().split(" ")[0]: ln for ln in ax.lines if not ln.get_label().startswith("_")}
    assert set(lines) == set(FAITH) and lines["random"].get_linestyle() == "--"
    assert [float(y) for y in lines["random"].get_ydata()] == FAITH["random"]["values"]
    graph_ax = figs["circuit_graph"].axes[0]
    assert len(graph_ax.lines) == len(EDGES)
    bars = figs["circuit_agreement"].axes[0].patches
    assert [b.get_height() for b in bars] == [3, 1, 1.2, 0.9]
    assert set(figures(CircuitResult(task="ioi", model="m", n_prompts=0, options={}, metric={}, counts={},
                                     nodes=[], edges=[]))) == set()  # fmt: skip


def test_the_report_writes_every_file_from_the_module_rows(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger

    from lit_svd.callbacks.circuits import CircuitReport

    module = SimpleNamespace(
        graph=builder_graph(),
        checks=check_rows(),
        readouts=READOUTS,
        faithfulness=FAITH,
        sad_terms={(2, 0): [0.1, 3.0, 0.2, 0.05]},
        hparams={"seed": 0},
        device="cpu",
        facts=dict(task="ioi", model="tiny-llama", n_prompts=8, options={"depth": 2}, metric={"gap": 5.0}),
    )
    trainer = pl.Trainer(
        accelerator="cpu", logger=TensorBoardLogger(str(tmp_path), name="run"), enable_progress_bar=False
    )
    CircuitReport(sad_top=1).on_test_end(trainer, module)
    folder = tmp_path / "run" / "version_0"
    names = {p.name for p in folder.iterdir()}
    assert {"results.json", "edges.csv", "nodes.csv", "graph.json", "graph.graphml", "circuit.html"} <= names
    assert {"circuit_graph.png", "circuit_faithfulness.png", "circuit_agreement.png"} <= names
    res = load_result(folder)
    assert res == make_result(
        faithfulness=FAITH, options={"depth": 2}, metric={"gap": 5.0}, provenance=res.provenance,
        agreement=res.agreement,
    )  # fmt: skip
    (sad,) = res.agreement  # the graph's QK node L2.qk.h0.d1 is the head's top SAD term
    assert sad["source"] == "sad" and sad["overlap"] == 1 and sad["units"] == 4 and sad["expected"] == 0.25
    graph = json.loads((folder / "graph.json").read_text())
    assert graph["nodes"] == res.to_dict()["nodes"] and graph["edges"] == res.to_dict()["edges"]
    assert sorted(nx.read_graphml(folder / "graph.graphml", force_multigraph=True).edges(keys=True)) == TRIPLES
    assert (folder / "nodes.csv").read_text().splitlines()[0] == ",".join(NODE_COLUMNS)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"images": 0})
    acc.Reload()
    assert {"circuit_graph", "circuit_faithfulness", "circuit_agreement"} <= set(acc.Tags()["images"])


def test_the_report_reads_a_mask_run_at_construction(tmp_path):
    from lit_svd.callbacks.circuits import CircuitReport

    with pytest.raises(FileNotFoundError, match="finished direction-mask run"):
        CircuitReport(mask_run=str(tmp_path))
    with pytest.raises(ValueError, match="sad_top=0"):
        CircuitReport(sad_top=0)
