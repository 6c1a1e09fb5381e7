"""Figures and the page of a circuit graph (``CircuitResult``): ``circuit_graph.png`` (the graph layer by layer),
``circuit_faithfulness.png`` (every method's faithfulness curve, the random baseline included),
``circuit_agreement.png`` (overlap with the mask run and SAD against chance) and ``circuit.html`` (one offline
page: the graph as inline SVG, click a node for its readout and edges, sortable tables of nodes and edges).

The layout is shared by the figure and the page: one column per layer part that holds nodes, in order (the
embedding, each layer's attention, its MLP, the metric; ``used_columns``), y = the node's place among its
column's nodes (by kind, head, direction).
"""

from __future__ import annotations

import dataclasses
import html
import json

import numpy as np
from matplotlib.colors import to_hex

from lit_svd.figures import pages
from lit_svd.figures.base import array, colors, new_figure
from lit_svd.results.base import draws
from lit_svd.results.circuits import EDGE_COLUMNS, NODE_COLUMNS, ROOT, CircuitResult, edge_row

MLP_KINDS = ("mlp_in", "mlp_gate", "mlp_out", "b_in", "b_gate", "b_out", "mlp_norm_bias")
KIND_ORDER = ("embed", "attn_norm_bias", "b_Q", "b_K", "q", "k", "qk", "b_V", "ov", "b_O", *MLP_KINDS,
              "final_norm_bias", "b_U", "metric")  # fmt: skip
POSITIVE, NEGATIVE = "#2166ac", "#b2182b"  # edge colours: a positive mean contribution, a negative one
RANDOM = "random"  # faithfulness methods named random* are drawn as the chance baseline
ATTRIBUTION_EDGE_KEYS = ("n_kept", "fraction", "checked_edge")  # the edges of an attribution circuit's graph
CHECK_COLUMNS = ("writer", "reader", "reader_unit", "score", "effect", "gap_fraction", "null_mean", "null_std", "z",
                 "percentile", "passes")  # fmt: skip


def column(node: dict, n_layers: int) -> float:
    """The node's x: its layer (the embedding -1, the metric ``n_layers``), +0.5 for an MLP node."""
    if node["address"] == ROOT or node.get("kind") == "metric":
        return float(n_layers)
    layer = node.get("layer")
    layer = -1 if layer is None else int(layer)
    return layer + (0.5 if node.get("kind") in MLP_KINDS else 0.0)


def n_layers_of(result: CircuitResult) -> int:
    """One past the deepest node's layer (the metric's column)."""
    layers = [n["layer"] for n in result.nodes if n.get("layer") is not None and n["address"] != ROOT]
    return max([int(x) for x in layers if x >= 0], default=-1) + 1


def used_columns(result: CircuitResult) -> list[float]:
    """The columns that hold a node, in order (``column``: -1 the embedding, l the attention of layer l, l + 0.5
    its MLP, ``n_layers`` the metric): one drawn column each, so that layers without nodes take no room."""
    n_layers = n_layers_of(result)
    return sorted({column(n, n_layers) for n in result.nodes})


def column_label(c: float, n_layers: int) -> str:
    if c < 0:
        return "emb"
    if c >= n_layers:
        return "metric"
    return f"L{int(c)}" + (" mlp" if c != int(c) else "")


def layout(result: CircuitResult) -> dict[str, tuple[float, float]]:
    """``{address: (x, y)}``: x = the rank of the node's ``column`` among ``used_columns``; y spreads each column's
    nodes (by kind, head, direction) evenly over the height of the fullest column, so that columns of few nodes
    do not line up on one row."""
    n_layers = n_layers_of(result)
    rank = {c: i for i, c in enumerate(used_columns(result))}
    by_x: dict[float, list[dict]] = {}
    for node in result.nodes:
        by_x.setdefault(rank[column(node, n_layers)], []).append(node)
    height = max((len(v) for v in by_x.values()), default=1)
    out = {}
    for x, nodes in by_x.items():
        nodes.sort(key=lambda n: (_kind_rank(n.get("kind")), n.get("group") or 0, n.get("index") or 0, n["address"]))
        out.update({n["address"]: (x, (i + 0.5) * height / len(nodes) - 0.5) for i, n in enumerate(nodes)})
    return out


def _kind_rank(kind) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def edge_style(edge: dict, max_abs: float) -> dict:
    """Width by |weight| (0.5 .. 4.5), colour by sign, dashed where the causal check failed, faint where it
    did not run."""
    w = edge.get("weight") or 0.0
    return {
        "width": 0.5 + 4.0 * abs(w) / max_abs if max_abs > 0 else 1.0,
        "color": POSITIVE if w >= 0 else NEGATIVE,
        "dashed": edge.get("passes") is False,
        "alpha": 0.35 if edge.get("passes") is None else 0.85,
    }


def _max_abs(result: CircuitResult) -> float:
    return max((abs(e.get("weight") or 0.0) for e in result.edges), default=0.0)


# --- figures -------------------------------------------------------------------------------------------
@draws(CircuitResult)
def figures(result: CircuitResult) -> dict:
    """``circuit_graph`` (when there are nodes), ``circuit_faithfulness`` and ``circuit_agreement`` (when
    measured)."""
    out = {}
    if result.nodes:
        out["circuit_graph"] = graph_figure(result)
    if result.faithfulness and any(isinstance(m, dict) and m.get("sizes") for m in result.faithfulness.values()):
        out["circuit_faithfulness"] = faithfulness_figure(result)
    if result.agreement:
        out["circuit_agreement"] = agreement_figure(result)
    return out


def graph_figure(result: CircuitResult):
    """The graph layer by layer: node x = layer, edge width by |weight|, colour by sign, dashed = failed check."""
    pos = layout(result)
    height = max((y for _, y in pos.values()), default=0) + 1
    layers = used_columns(result)
    fig, ax = new_figure(figsize=(max(6.0, 0.8 * len(layers) + 1), max(3.0, min(14.0, 0.18 * height + 2))))
    top = _max_abs(result)
    for e in sorted(result.edges, key=lambda e: abs(e.get("weight") or 0.0)):
        if e["writer"] in pos and e["reader"] in pos:
            xs, ys = arc(pos[e["writer"]], pos[e["reader"]], height, len(layers))
            st = edge_style(e, top)
            ax.plot(xs, ys, color=st["color"], lw=st["width"], alpha=st["alpha"],
                    ls="--" if st["dashed"] else "-", zorder=1)  # fmt: skip
    palette = colors()
    kinds = sorted({n.get("kind") for n in result.nodes}, key=_kind_rank)
    for i, kind in enumerate(kinds):
        pick = [pos[n["address"]] for n in result.nodes if n.get("kind") == kind]
        ax.scatter([p[0] for p in pick], [p[1] for p in pick], s=18, color=palette[i % len(palette)],
                   label=kind, zorder=2, edgecolors="k", linewidths=0.3)  # fmt: skip
    if len(result.nodes) <= 60:
        for n in result.nodes:
            x, y = pos[n["address"]]
            ax.annotate(n["address"], (x, y), fontsize=5, xytext=(3, 2), textcoords="offset points")
    n_layers = n_layers_of(result)
    ax.set_xticks(range(len(layers)), [column_label(x, n_layers) for x in layers], fontsize=6)
    ax.set_yticks([])
    ax.invert_yaxis()  # as the page: the first node of a column on top
    ax.set_xlabel("layer (columns that hold nodes; an MLP right of its layer's attention)")
    c = result.counts
    ax.set_title(
        f"{display_name(result.model)} {result.task}: {c.get('nodes', len(result.nodes))} nodes,"
        f" {c.get('edges', 0)} edges,"
        f" {c.get('passes', 0)}/{c.get('checked', 0)} pass (blue +, red -, dashed: fails)",
        fontsize=8,
    )
    ax.legend(fontsize=6, loc="upper left", ncols=2)
    return fig


def arc(p0: tuple[float, float], p1: tuple[float, float], height: float, n_layers: int, n: int = 24):
    """Points of an edge from ``p0`` to ``p1``: a straight line between neighbouring columns, a quadratic arc
    bending toward the top (smaller y) when it skips a column, as on the page."""
    (x0, y0), (x1, y1) = p0, p1
    if abs(x1 - x0) <= 1.01:  # neighbouring columns
        return [x0, x1], [y0, y1]
    bend = min(0.45, 0.9 * abs(x1 - x0) / (n_layers + 1)) * height
    t = np.linspace(0.0, 1.0, n)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2 - bend
    xs = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x1
    ys = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y1
    return xs, ys


def faithfulness_figure(result: CircuitResult):
    """Faithfulness against the fraction of directions kept (log x), one curve per method; the random baseline
    (``random*``) grey and dashed; CPR and CMD in the legend. y = 1: the full model, y = 0: everything ablated."""
    fig, ax = new_figure(figsize=(6, 4))
    palette = colors()
    for i, (method, m) in enumerate(sorted(result.faithfulness.items(), key=lambda kv: kv[0].startswith(RANDOM))):
        if not isinstance(m, dict) or not m.get("sizes"):
            continue
        x, y = array(m["sizes"]), array(m["values"])
        label = f"{method} (CPR {_num(m.get('cpr'))}, CMD {_num(m.get('cmd'))})"
        if method.startswith(RANDOM):
            ax.plot(x, y, color="0.5", ls="--", marker=".", label=label)
        else:
            ax.plot(x, y, color=palette[i % len(palette)], marker="o", ms=3, label=label)
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.axhline(0.0, color="k", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("fraction of the universe's directions kept (MIB's grid)")
    ax.set_ylabel("faithfulness (m(C) - m(empty)) / (m(full) - m(empty))")
    ax.set_title(f"{result.model} {result.task}: faithfulness by circuit size", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def _num(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not np.isfinite(value)) else f"{value:.3f}"


def agreement_figure(result: CircuitResult):
    """Per source, the overlap of the graph's nodes with the source's directions against the overlap expected
    by chance (hypergeometric), p-values on the bars."""
    rows = result.agreement
    labels = [f"{r.get('task', result.task)} / {r['source']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = new_figure(figsize=(max(4.0, 1.3 * len(rows) + 2), 3.6))
    ax.bar(x - 0.2, [r["overlap"] for r in rows], 0.4, label="overlap")
    ax.bar(x + 0.2, [r["expected"] for r in rows], 0.4, color="0.6", label="expected by chance")
    for i, r in enumerate(rows):
        ax.annotate(f"p={_num(r.get('p_value'))}", (i - 0.2, r["overlap"]), fontsize=7, ha="center",
                    xytext=(0, 2), textcoords="offset points")  # fmt: skip
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("units in both (block-aware)")
    ax.set_title("graph nodes shared with the mask run / top SAD terms", fontsize=9)
    ax.legend(fontsize=8)
    return fig


# --- the page ------------------------------------------------------------------------------------------
PAGE_CSS = """#wrap{display:flex;gap:1em;align-items:flex-start}
#graph{border:1px solid #ccc;overflow:auto;max-width:75vw;max-height:80vh}
#detail{min-width:22em;max-width:30em;font-size:13px}
svg .node{cursor:pointer;stroke:#222;stroke-width:.6}
svg .node.sel{stroke:#f90;stroke-width:3}
svg .edge.dim{opacity:.06}
svg text{font-size:9px;fill:#333;pointer-events:none;paint-order:stroke;stroke:#fff;stroke-width:3px}
"""

PAGE_SCRIPT = """(function(){
  var data=JSON.parse(document.getElementById("graph-data").textContent);
  var detail=document.getElementById("detail");
  var ESC={"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;"};
  function esc(s){return String(s).replace(/[&<>"]/g,function(c){return ESC[c];});}
  function num(x){if(x===null||x===undefined) return ""; if(typeof x!=="number") return esc(x);
    return Number.isInteger(x)?String(x):x.toPrecision(4);}
  function rows(list,other){
    if(!list.length) return "<p>none</p>";
    var h="<table><tr><th>"+other+"</th><th>weight</th><th>reader kind</th><th>z</th><th>gap fraction</th>"+
      "<th>pass</th></tr>";
    list.forEach(function(e){h+="<tr><td>"+esc(other==="writer"?e.writer:e.reader)+"</td><td>"+num(e.weight)+"</td><td>"+
      esc(e.reader_kind||"")+"</td><td>"+num(e.z)+"</td><td>"+num(e.gap_fraction)+"</td><td>"+num(e.passes)+"</td></tr>";});
    return h+"</table>";
  }
  function show(address){
    var node=data.nodes.filter(function(n){return n.address===address;})[0]; if(!node) return;
    var ins=data.edges.filter(function(e){return e.reader===address;});
    var outs=data.edges.filter(function(e){return e.writer===address;});
    var h="<h2>"+esc(address)+"</h2><p>layer "+num(node.layer)+", kind "+esc(node.kind||"")+
      (node.group!==null&&node.group!==undefined?", head/group "+num(node.group):"")+
      (node.size>1?", block of "+num(node.size)+" directions":"")+"</p>";
    var r=node.readout;
    if(r){h+="<h3>readout ("+esc(r.side||"")+")</h3><p><b>+</b> <code>"+(r.plus||[]).map(esc).join(" | ")+
      "</code></p><p><b>&minus;</b> <code>"+(r.minus||[]).map(esc).join(" | ")+"</code></p>";}
    else {h+="<p>no readout</p>";}
    h+="<h3>in ("+ins.length+")</h3>"+rows(ins,"writer")+"<h3>out ("+outs.length+")</h3>"+rows(outs,"reader");
    detail.innerHTML=h;
    Array.prototype.forEach.call(document.querySelectorAll("svg .node"),function(c){
      var on=c.getAttribute("data-address")===address; c.classList.toggle("sel",on);
      if(on&&c.scrollIntoView) c.scrollIntoView({block:"nearest",inline:"center"});});
    Array.prototype.forEach.call(document.querySelectorAll("svg .edge"),function(l){
      var on=l.getAttribute("data-writer")===address||l.getAttribute("data-reader")===address;
      l.classList.toggle("dim",!on);});
  }
  Array.prototype.forEach.call(document.querySelectorAll("svg .node"),function(c){
    c.addEventListener("click",function(){show(this.getAttribute("data-address"));});});
  Array.prototype.forEach.call(document.querySelectorAll("#nodes tbody tr"),function(tr){
    tr.style.cursor="pointer"; tr.addEventListener("click",function(){show(tr.cells[0].getAttribute("data-v"));});});
  var m=/^#node=(.+)$/.exec(location.hash); if(m) show(decodeURIComponent(m[1]));
})();"""

DX, DY, MARGIN = 150, 22, 40  # pixels per layer, per node, around the drawing


def svg(result: CircuitResult) -> str:
    """The graph as inline SVG: ``<circle class="node" data-address=...>`` per node, ``<path class="edge"
    data-writer=... data-reader=... data-kind=...>`` per edge (width by |weight|, colour by sign, dashed: failed
    check, faint: not checked; an edge skipping a column arcs over it), layer labels on top."""
    pos = layout(result)
    n_layers = n_layers_of(result)
    height = (max((y for _, y in pos.values()), default=0) + 1) * DY + 2 * MARGIN + 10
    width = max(len(used_columns(result)), 1) * DX + 2 * MARGIN

    def xy(p):
        return MARGIN + (p[0] + 0.5) * DX, MARGIN + p[1] * DY + 10

    top = _max_abs(result)
    parts = [f'<svg id="circuit" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    for i, c in enumerate(used_columns(result)):
        label = column_label(c, n_layers)
        parts.append(f'<text x="{MARGIN + (i + 0.5) * DX}" y="14" text-anchor="middle">{label}</text>')
    for e in sorted(result.edges, key=lambda e: abs(e.get("weight") or 0.0)):
        if e["writer"] not in pos or e["reader"] not in pos:
            continue
        (x0, y0), (x1, y1) = xy(pos[e["writer"]]), xy(pos[e["reader"]])
        st = edge_style(e, top)
        dash = ' stroke-dasharray="4 3"' if st["dashed"] else ""
        tip = f"{e['writer']} -> {e['reader']} ({e.get('reader_kind')}):"
        tip += f" weight {pages.cell(e.get('weight'))}, z {pages.cell(e.get('z'))}"
        # an edge that skips a column arcs upward, so that it does not run through the nodes between
        bend = 0.18 * abs(x1 - x0) if abs(x1 - x0) > 1.01 * DX else 0.0
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2 - bend
        parts.append(
            f'<path class="edge" data-writer="{pages.attr(e["writer"])}" data-reader="{pages.attr(e["reader"])}"'
            f' data-kind="{pages.attr(e.get("reader_kind"))}"'
            f' d="M{x0:.1f},{y0:.1f} Q{cx:.1f},{cy:.1f} {x1:.1f},{y1:.1f}" fill="none" stroke="{st["color"]}"'
            f' stroke-width="{st["width"]:.2f}" stroke-opacity="{st["alpha"]}"{dash}>'
            f"<title>{html.escape(tip)}</title></path>"
        )
    palette = colors()
    kinds = sorted({n.get("kind") for n in result.nodes}, key=_kind_rank)
    for n in result.nodes:
        x, y = xy(pos[n["address"]])
        fill = to_hex(palette[kinds.index(n.get("kind")) % len(palette)])
        parts.append(
            f'<circle class="node" data-address="{pages.attr(n["address"])}" cx="{x:.1f}" cy="{y:.1f}" r="5"'
            f' fill="{fill}"><title>{html.escape(n["address"])}</title></circle>'
            f'<text x="{x + 7:.1f}" y="{y + 3:.1f}">{html.escape(n["address"])}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def graph_data(result: CircuitResult) -> str:
    """The nodes (with readouts) and edges as JSON for the page's script, safe inside ``<script>``."""
    content = result.to_dict()  # the NaN policy: undefined values are null
    data = {"nodes": content["nodes"], "edges": [edge_row(e) for e in content["edges"]]}
    return json.dumps(data).replace("</", "<\\/")


FACTS = ("task", "model", "n_prompts")


def display_name(model: str) -> str:
    """A model's name for titles: an alias or hub name as given, a local path by its last part."""
    return model.rstrip("/").rsplit("/", 1)[-1] if model.startswith(("/", ".", "~")) else model


def drawn_blocks(result: CircuitResult, max_blocks: int | None) -> tuple[CircuitResult, str | None]:
    """The graph the page draws: at most ``max_blocks`` edges (blocks) of largest |weight| (the net attribution of
    their kept direction edges, what the edge width shows; the sum of |score| would favour the largest blocks, MLP to
    MLP) plus every checked one, and the nodes they join; with a sentence counting what is left out (None: all)."""
    edges = result.edges
    if max_blocks is None or len(edges) <= max_blocks:
        return result, None
    order = sorted(range(len(edges)), key=lambda i: -abs(edges[i].get("weight") or 0.0))
    keep = set(order[:max_blocks]) | {i for i, e in enumerate(edges) if e.get("checked_edge")}
    kept = [edges[i] for i in sorted(keep)]
    names = {e["writer"] for e in kept} | {e["reader"] for e in kept}
    nodes = [n for n in result.nodes if n["address"] in names]
    total = sum(abs(e.get("weight") or 0.0) for e in edges)
    share = sum(abs(e.get("weight") or 0.0) for e in kept) / total if total else float("nan")
    note = (
        f"Drawn: {len(kept)} of the {len(edges):,} blocks (the {max_blocks} of largest |weight| and every checked"
        f" one; {share:.0%} of the sum of |weight|) and the {len(nodes)} of {len(result.nodes)} nodes they join;"
        " graph.json and graph.graphml hold every block."
    )
    return dataclasses.replace(result, nodes=nodes, edges=kept), note


CHOSEN = {
    "graph_f": "the smallest of MIB's grid whose faithfulness reaches {f_target}",
    "graph_size": "chosen (graph_size)",
    "best": "its largest f: no size reaches {f_target}",
}


def attribution_texts(result: CircuitResult, counts: str) -> tuple[str, str]:
    """The page's summary and explanation for the graph of an attribution circuit (``result.circuit``)."""
    c = result.circuit or {}
    chosen = CHOSEN.get(c.get("chosen_by") or "graph_f", "").format(f_target=c.get("f_target"))
    summary = (
        f"The circuit drawn: the first edges of {c.get('curve')} at size {c.get('size')} ({chosen}),"
        f" f = {c.get('f', float('nan')):.3f} on the test prompts; {c.get('n_edges', 0):,} direction edges"
        f" (weighted count {c.get('weighted', float('nan')):.4f} of the head-level edges) in {c.get('n_blocks', 0):,}"
        f" blocks. {counts}."
    )
    about = (
        "Nodes are units: the embedding, a head (its OV map: value reads in, writes out), a head's query input, a KV"
        " head's key input, an MLP's input and output, the metric (the logits). An edge is a block of the circuit:"
        " a writer unit and a reader unit with at least one direction edge kept; weight: the sum of the kept"
        " direction edges' EAP-IG scores (training prompts), n_kept / fraction: how many of the block's direction"
        " edges. The circuit's f is its own, under MIB's edge ablation. A checked edge carries the causal check of"
        " its strongest direction edge (checked_edge: that edge dropped alone, against random edges of its writer)."
        " Edge width: |weight|; colour: blue positive, red negative; dashed: the check failed; faint: not checked."
        " Click a node for its edges; click a column header to sort."
    )
    return summary, about


def html_page(result: CircuitResult, max_blocks: int | None = None) -> str:
    """``circuit.html``: the facts, the graph (inline SVG; click a node: its readout and in / out edges), the
    faithfulness summary and agreement (when measured), the causal checks of an attribution circuit, then sortable
    tables of nodes and edges. Offline: inline CSS and JavaScript, nothing loaded from anywhere. ``max_blocks``: the
    most edges drawn and listed (``drawn_blocks``; the counts on top stay the whole graph's)."""
    result, left_out = drawn_blocks(result, max_blocks)
    content = result.to_dict()
    items = {k: content[k] for k in FACTS}
    items.update({f"options.{k}": v for k, v in result.options.items()})
    items.update({f"metric.{k}": v for k, v in result.metric.items()})
    items.update({f"counts.{k}": v for k, v in result.counts.items()})
    about = (
        "Nodes are singular directions (or blocks of near-equal singular values, or heads) and constant writes;"
        " an edge runs from a writer to the reader it feeds, with the mean signed contribution over the prompts"
        " (the reader's norm frozen at the clean run). Edge width: |weight|; colour: blue positive, red negative;"
        " dashed: the edge's causal check failed (z below the level, or an effect below the minimum fraction of the"
        " metric gap); faint: not checked. Click a node (or a row of the node table) for its readout and edges;"
        " click a column header to sort. A link to PAGE#node=ADDRESS opens with that node shown."
    )
    c = result.counts
    gap = result.metric.get("gap")
    summary = (
        f"{c.get('nodes', len(result.nodes))} nodes, {c.get('edges', len(result.edges))} edges;"
        f" {c.get('passes', 0)} of {c.get('checked', 0)} checked edges pass the causal check"
        f" ({c.get('passes_z', 0)} by z alone)" + (f"; metric gap (clean - corrupted) {gap:.4g}" if gap else "")
    )
    if result.circuit:
        summary, about = attribution_texts(result, summary)
        if result.circuit.get("note"):
            summary += f" {result.circuit['note']}."
        items.update({f"circuit.{k}": v for k, v in result.circuit.items() if k not in ("top_edges", "checks")})
    if left_out:
        summary += f" {left_out}"
    if not result.edges and not result.circuit:
        summary += (
            f". The graph is empty: no writer reached threshold={result.options.get('threshold')} of a reader's sum"
            " of |contributions| on any prompt; a lower threshold keeps more"
        )
    body = [
        f"<p><strong>{html.escape(summary)}</strong></p>",
        f'<div id="wrap"><div id="graph">{svg(result)}</div><div id="detail"><p>click a node</p></div></div>',
        f"<p>{about}</p>",
        pages.facts(items),
    ]
    if result.faithfulness:
        rows = [
            {"method": k, "cpr": m.get("cpr"), "cmd": m.get("cmd"), "sizes": len(m.get("sizes") or [])}
            for k, m in content["faithfulness"].items()
            if isinstance(m, dict)
        ]
        body += ["<h2>Faithfulness</h2>", pages.sortable_table("faithfulness", ("method", "cpr", "cmd", "sizes"), rows)]
    if result.agreement:
        rows = result.agreement_rows()
        columns = list(dict.fromkeys(k for r in rows for k in r))
        body += ["<h2>Agreement with the other methods</h2>", pages.sortable_table("agreement", columns, rows)]
    if result.circuit and result.circuit.get("checks"):
        rows = result.circuit["checks"]
        body += [f"<h2>Causal check of the circuit's {len(rows)} strongest direction edges</h2>",
                 pages.sortable_table("checks", CHECK_COLUMNS, rows)]  # fmt: skip
    if result.circuit and result.circuit.get("top_edges"):
        rows = result.circuit["top_edges"]
        columns = [k for k in ("writer", "reader", "reader_unit", "score") if k in rows[0]]
        body += [f"<h2>Strongest direction edges of the circuit ({len(rows)})</h2>",
                 pages.sortable_table("top_edges", columns, rows)]  # fmt: skip
    nodes = result.node_rows()
    extra = ATTRIBUTION_EDGE_KEYS if result.circuit else ()
    body += [
        f"<h2>Nodes ({len(nodes)})</h2>",
        pages.sortable_table("nodes", NODE_COLUMNS, nodes, cell_class=lambda c: "tokens" if "readout" in c else ""),
        f"<h2>Edges ({len(result.edges)})</h2>",
        pages.sortable_table(
            "edges",
            (*EDGE_COLUMNS, *extra),
            [{**edge_row(e), **{k: e.get(k) for k in extra}} for e in content["edges"]],
            row_attrs=lambda r: f'class="{"pass" if r["passes"] else "fail" if r["passes"] is False else ""}"',
            cell_class=lambda c: "passes" if c == "passes" else "",
        ),
        f'<script type="application/json" id="graph-data">{graph_data(result)}</script>',
    ]
    what = "attribution circuit of singular directions" if result.circuit else "circuit graph of singular directions"
    title = f"{display_name(result.model)} {result.task}: {what}"
    return pages.page(title, "\n".join(body), css=PAGE_CSS, script=PAGE_SCRIPT)
