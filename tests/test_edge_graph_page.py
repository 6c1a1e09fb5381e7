"""The page of an attribution circuit (issue 33 item 4) on a synthetic graph, and the choice of the size drawn:
``edge_graph.choose_size`` never draws another circuit silently when the curve misses ``graph_f``, and
``figures.circuits.drawn_blocks`` caps the blocks drawn by their sum of |score| (checked blocks always), compared
with a sort written here; the page prints the circuit's own f, its counts, the cap's note and the check rows."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from lit_svd.analysis.edge_graph import choose_size, graph_size
from lit_svd.figures.circuits import drawn_blocks, html_page
from lit_svd.results import CircuitResult
from lit_svd.results.circuits import edge_counts

N_BLOCKS = 12
CHECKED = 0  # the weakest block carries the check: the cap must keep it
CURVE = {"sizes": [0.001, 0.01, 0.1, 0.5, 1.0], "values": [-0.2, 0.3, 0.7, 0.9, 1.0]}


def check_row(i: int) -> dict:
    return {"writer": f"L0.ov.h{i}.d1", "reader": "metric", "reader_unit": "logits", "score": 0.25, "effect": -0.4,
            "gap_fraction": 0.1, "null_mean": 0.01, "null_std": 0.02, "z": 19.5, "percentile": 100.0,
            "passes_z": True, "passes": True}  # fmt: skip


def attribution_result() -> CircuitResult:
    """Blocks head i -> metric with |weight| (i + 1) / 2, alternating signs, and a sum of |score| in the reverse
    order (the cap orders by |weight|); block CHECKED carries the check."""
    nodes = [{"address": f"L0.ov.h{i}", "layer": 0, "kind": "ov", "group": i, "index": 0, "size": 4, "unit": "unit"}
             for i in range(N_BLOCKS)]  # fmt: skip
    nodes.append({"address": "metric", "layer": 1, "kind": "metric", "group": 0, "index": 0, "size": 1, "unit": "root"})
    edges = []
    for i in range(N_BLOCKS):
        e = {"writer": f"L0.ov.h{i}", "reader": "metric", "reader_kind": "logit", "weight": (-1) ** i * 0.5 * (i + 1),
             "abs_weight": float(20 - i), "kept_in": None, "n_kept": 2, "fraction": 0.5}  # fmt: skip
        if i == CHECKED:
            row = check_row(i)
            e.update({k: row[k] for k in ("effect", "gap_fraction", "null_mean", "null_std", "z", "percentile",
                                          "passes_z", "passes")})  # fmt: skip
            e["checked_edge"] = f"{row['writer']} -> metric"
        edges.append(e)
    circuit = {"curve": "directions_abs_fair", "size": 0.1, "f": 0.7123, "f_target": 0.7, "chosen_by": "graph_f",
               "note": None, "n_edges": 2 * N_BLOCKS, "weighted": 6.0, "n_blocks": N_BLOCKS,
               "checks": [check_row(CHECKED)], "top_edges": []}  # fmt: skip
    return CircuitResult(task="ioi", model="m", n_prompts=4, options={"builder": "attribution"},
                         metric={"clean": 3.0, "corrupted": 1.0, "gap": 2.0},
                         counts={"nodes": len(nodes), **edge_counts(edges)}, nodes=nodes, edges=edges,
                         circuit=circuit)  # fmt: skip


def test_the_size_drawn_is_the_first_reaching_graph_f_or_given():
    assert graph_size(CURVE, 0.7) == 0.1 and graph_size(CURVE, 1.5) is None
    assert choose_size("c", CURVE, None, 0.7) == (0.1, "graph_f", None)
    assert choose_size("c", CURVE, 0.01, 0.7) == (0.01, "graph_size", None)  # given: even below graph_f


@pytest.mark.parametrize("unreached, size, how", [("skip", None, "none"), ("best", 1.0, "best")])
def test_a_curve_that_never_reaches_graph_f_says_its_best_f(unreached, size, how):
    curve = {"sizes": [0.01, 0.1, 0.5, 1.0], "values": [-0.3, 0.41, float("nan"), 0.41]}  # ties: the smaller size
    got, chosen_by, note = choose_size("directions_signed_fair", curve, None, 0.8, unreached)
    assert note is not None and "graph_curve=directions_signed_fair never reaches graph_f=0.8" in note
    assert "best f 0.410 at size 0.1" in note
    assert chosen_by == how and got == (0.1 if unreached == "best" else None)


def test_the_cap_keeps_the_strongest_blocks_and_every_checked_one():
    result = attribution_result()
    capped, note = drawn_blocks(result, 3)
    want = sorted(range(N_BLOCKS), key=lambda i: -(i + 1))[:3] + [CHECKED]
    assert sorted(e["writer"] for e in capped.edges) == sorted(f"L0.ov.h{i}" for i in want)
    assert {n["address"] for n in capped.nodes} == {f"L0.ov.h{i}" for i in want} | {"metric"}
    share = sum(i + 1 for i in want) / sum(range(1, N_BLOCKS + 1))  # |weight| = (i + 1) / 2
    assert note is not None and f"Drawn: 4 of the {N_BLOCKS} blocks" in note and f"{share:.0%}" in note
    assert "and the 5 of 13 nodes" in note
    assert drawn_blocks(result, N_BLOCKS) == (result, None) and drawn_blocks(result, None) == (result, None)


class _Tables(HTMLParser):
    """The page's SVG edges and the rows of each table by id."""

    def __init__(self):
        super().__init__()
        self.svg_edges = 0
        self.rows: dict[str, int] = {}
        self._table: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "path" and a.get("class") == "edge":
            self.svg_edges += 1
        elif tag == "table":
            self._table = a.get("id")
            self.rows[self._table or ""] = -1  # the header row
        elif tag == "tr" and self._table is not None:
            self.rows[self._table] += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None


def test_the_page_prints_f_counts_the_cap_and_the_check_rows():
    page = html_page(attribution_result(), max_blocks=3)
    assert "f = 0.712 on the test prompts" in page and "24 direction edges" in page
    assert f"in {N_BLOCKS} blocks" in page and f"Drawn: 4 of the {N_BLOCKS} blocks" in page
    assert "the smallest of MIB&#x27;s grid whose faithfulness reaches 0.7" in page
    parsed = _Tables()
    parsed.feed(page)
    assert parsed.svg_edges == 4 and parsed.rows["edges"] == 4 and parsed.rows["nodes"] == 5
    assert parsed.rows["checks"] == 1 and "19.5" in page
    uncapped = _Tables()
    uncapped.feed(html_page(attribution_result()))
    assert uncapped.svg_edges == N_BLOCKS and "Drawn:" not in html_page(attribution_result())
