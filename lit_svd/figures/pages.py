"""What every static result page shares: one offline HTML document (inline CSS and JavaScript, no network),
a list of facts, and tables sortable by clicking a column header.

Used by the direction check's ``directions.html`` (``figures/directions.py``) and the circuit graph's
``circuit.html`` (``figures/circuits.py``). Pages are strings; ``lit_svd.output.write_text`` writes them.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence

CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eee;cursor:pointer;position:sticky;top:0}
th.asc:after{content:" \\25B2"} th.desc:after{content:" \\25BC"}
tr.pass td.passes{background:#d8f0d8} tr.fail td.passes{background:#f6dcdc}
td.tokens{font-family:monospace;white-space:pre-wrap;max-width:22em}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px} dt{font-weight:600}
"""

# Every <table class="sortable">: a click on a header sorts the body by that column (numbers as numbers, by
# each cell's data-v), a second click reverses.
SORT_SCRIPT = """(function(){
  function key(cell){var t=cell.getAttribute("data-v"); var x=parseFloat(t); return isNaN(x)?t:x;}
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function(table){
    var heads=table.tHead.rows[0].cells;
    for (var i=0;i<heads.length;i++) (function(col){
      heads[col].addEventListener("click",function(){
        var asc=!this.classList.contains("asc");
        for (var j=0;j<heads.length;j++) heads[j].classList.remove("asc","desc");
        this.classList.add(asc?"asc":"desc");
        var body=table.tBodies[0], rows=Array.prototype.slice.call(body.rows);
        rows.sort(function(a,b){var x=key(a.cells[col]), y=key(b.cells[col]);
          if (typeof x!==typeof y) {x=String(x); y=String(y);}
          return (x<y?-1:x>y?1:0)*(asc?1:-1);});
        rows.forEach(function(r){body.appendChild(r);});
      });
    })(i);
  });
})();"""


def cell(value) -> str:
    """A value as cell text: floats to 4 significant digits, None empty, the rest escaped."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def attr(value) -> str:
    """A value as an attribute (quoted characters escaped)."""
    return html.escape("" if value is None else str(value), quote=True)


def facts(items: dict) -> str:
    """A ``<dl>`` of ``{name: value}``."""
    return "<dl>" + "".join(f"<dt>{html.escape(str(k))}</dt><dd>{cell(v)}</dd>" for k, v in items.items()) + "</dl>"


def sortable_table(
    table_id: str,
    columns: Sequence[str],
    rows: Iterable[dict],
    row_attrs: Callable[[dict], str] | None = None,
    cell_class: Callable[[str], str] | None = None,
) -> str:
    """A ``<table class="sortable">`` of ``rows`` (flat dicts) in ``columns``; each cell keeps its raw value in
    ``data-v`` (what sorting reads). ``row_attrs(row)``: extra attributes of a ``<tr>`` (e.g. ``class="pass"``);
    ``cell_class(column)``: a class for the column's cells."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    lines = []
    for row in rows:
        cells = []
        for c in columns:
            v = row.get(c)
            cls = cell_class(c) if cell_class else ""
            cls = f' class="{cls}"' if cls else ""
            cells.append(f'<td{cls} data-v="{attr(v)}">{cell(v)}</td>')
        extra = f" {row_attrs(row)}" if row_attrs else ""
        lines.append(f"<tr{extra}>{''.join(cells)}</tr>")
    body = "\n".join(lines)
    return (
        f'<table class="sortable" id="{attr(table_id)}"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>'
    )


def page(title: str, body: str, css: str = "", script: str = "") -> str:
    """One offline HTML document: ``CSS`` + ``css``, the title as ``<h1>``, ``body``, ``SORT_SCRIPT`` + ``script``."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>\n<style>\n{CSS}{css}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n{body}\n<script>\n{SORT_SCRIPT}\n{script}\n</script></body></html>\n"
    )
