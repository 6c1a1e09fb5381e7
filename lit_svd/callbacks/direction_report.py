"""DirectionReport: the per-direction table of ``DirectionCheckModule`` written into the run folder.

After ``test`` (rank zero) it writes:

* ``results.json``: ``experiment`` ("direction_check"), the checked ``run``, ``task``, ``claims``, the counts and
  fractions (``n_directions``, ``fraction_isolated``, ``fraction_pass``, ``fraction_pass_isolated``), the
  check's settings (``level``, ``z_pass``, ``n_random``, ``n_prompts``, ``rel_gap``), the timing (``wall_s``,
  ``directions_per_s``), ``directions`` (one entry per claimed direction) and ``table_csv`` / ``table_html``
  (the file names of the two tables below, in the same folder);
* ``directions.csv``: the same rows, one per line;
* ``directions.html``: one static page (inline CSS and JavaScript, no network) with the summary and the
  table, sortable by clicking a column header; open it with ``python -m webbrowser file://PATH``;
* ``directions_z.png``: z against the isolation gap, one point per direction.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Sequence

from lightning.pytorch.callbacks import Callback

from lit_svd.analysis.causal import LEVEL, Z_PASS
from lit_svd.output import run_dir, save_figure, write_results

COLUMNS = (
    "component",
    "kind",
    "layer",
    "head",
    "direction",
    "sigma",
    "block",
    "block_size",
    "block_claimed",
    "gap",
    "isolated",
    "past_rank",
    "effect",
    "null_mean",
    "null_std",
    "z",
    "percentile",
    "passes",
    "readout_side",
    "readout_plus",
    "readout_minus",
)
SEP = " | "  # between readout tokens in the CSV and the page


def flat_row(row: dict) -> dict:
    """A table row of plain values: the block's id and size, the readout's token lists joined by ``SEP``."""
    read = row.get("readout") or {}
    flat = {k: row[k] for k in COLUMNS if k in row}
    flat.update(
        block=row["block"]["id"],
        block_size=row["block"]["size"],
        readout_side=read.get("side", ""),
        readout_plus=SEP.join(read.get("plus", [])),
        readout_minus=SEP.join(read.get("minus", [])),
    )
    return flat


def summary(rows: Sequence[dict]) -> dict:
    """Counts and fractions of isolated and passing directions."""
    n = len(rows)
    iso = [r for r in rows if r["isolated"]]
    return {
        "n_directions": n,
        "n_isolated": len(iso),
        "fraction_isolated": len(iso) / n if n else None,
        "n_pass": sum(r["passes"] for r in rows),
        "fraction_pass": sum(r["passes"] for r in rows) / n if n else None,
        "fraction_pass_isolated": sum(r["passes"] for r in iso) / len(iso) if iso else None,
        "fraction_pass_in_blocks": (
            sum(r["passes"] for r in rows if not r["isolated"]) / (n - len(iso)) if n > len(iso) else None
        ),
    }


def csv_text(rows: Sequence[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(flat_row(row))
    return buf.getvalue()


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}}
table{{border-collapse:collapse;font-size:13px}}
th,td{{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}}
th{{background:#eee;cursor:pointer;position:sticky;top:0}}
th.asc:after{{content:" \\25B2"}} th.desc:after{{content:" \\25BC"}}
tr.pass td.passes{{background:#d8f0d8}} tr.fail td.passes{{background:#f6dcdc}}
td.tokens{{font-family:monospace;white-space:pre-wrap;max-width:22em}}
dl{{display:grid;grid-template-columns:max-content auto;gap:2px 12px}} dt{{font-weight:600}}
</style></head><body>
<h1>{title}</h1>
<dl>{facts}</dl>
<p>{about}</p>
<table id="directions"><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table>
<script>
(function(){{
  var table=document.getElementById("directions"), heads=table.tHead.rows[0].cells;
  function key(cell){{var t=cell.getAttribute("data-v"); var x=parseFloat(t); return isNaN(x)?t:x;}}
  for (var i=0;i<heads.length;i++) (function(col){{
    heads[col].addEventListener("click",function(){{
      var asc=!this.classList.contains("asc");
      for (var j=0;j<heads.length;j++) heads[j].classList.remove("asc","desc");
      this.classList.add(asc?"asc":"desc");
      var body=table.tBodies[0], rows=Array.prototype.slice.call(body.rows);
      rows.sort(function(a,b){{var x=key(a.cells[col]), y=key(b.cells[col]);
        if (typeof x!==typeof y) {{x=String(x); y=String(y);}}
        return (x<y?-1:x>y?1:0)*(asc?1:-1);}});
      rows.forEach(function(r){{body.appendChild(r);}});
    }});
  }})(i);
}})();
</script></body></html>
"""


def html_page(rows: Sequence[dict], facts: dict, title: str) -> str:
    """The static, offline page: ``facts`` as a list, then the sortable table of ``rows``."""
    fact_html = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{_cell(v)}</dd>" for k, v in facts.items())
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    lines = []
    for row in rows:
        flat = flat_row(row)
        cells = []
        for c in COLUMNS:
            v = flat.get(c, "")
            cls = ' class="tokens"' if c.startswith("readout_") else (' class="passes"' if c == "passes" else "")
            cells.append(f'<td{cls} data-v="{html.escape(str(v), quote=True)}">{_cell(v)}</td>')
        lines.append(f'<tr class="{"pass" if row["passes"] else "fail"}">{"".join(cells)}</tr>')
    about = (
        f"Each direction of the component (one head's OV map, or an MLP map) is patched alone at the answer"
        f" position toward the corrupted prompt's coefficient; effect = mean change of the task metric."
        f" z = (|effect| - mean |null|) / std |null| over random unit directions of the same head; passes"
        f" at z &ge; {Z_PASS:.3f} (one-sided {LEVEL:.0%}). Block: neighbours within the relative gap share a"
        f" block; a direction in a block of size &gt; 1 is not identifiable alone. Readout: top tokens of"
        f" +/- the direction (write side: through the final norm and unembedding; read side: token"
        f" embeddings through the layer's norm). Click a column header to sort."
    )
    return PAGE.format(title=html.escape(title), facts=fact_html, about=about, head=head, body="\n".join(lines))


class DirectionReport(Callback):
    """Writes the table of ``DirectionCheckModule`` after ``test`` (see the module docstring).

    Args:
        csv_name: file name of the CSV table.
        html_name: file name of the HTML page.
    """

    def __init__(self, csv_name: str = "directions.csv", html_name: str = "directions.html"):
        self.csv_name, self.html_name = csv_name, html_name

    def on_test_end(self, trainer, module) -> None:
        rows, hp = module.table, module.hparams
        results = {
            "experiment": "direction_check",
            "run": str(module.run_path),
            "model": module.model_name,
            "task": module.task,
            "claims": hp.claims,
            "kinds": list(hp.kinds),
            **summary(rows),
            "level": LEVEL,
            "z_pass": Z_PASS,
            "n_random": hp.n_random,
            "seed": hp.seed,
            "rel_gap": hp.rel_gap,
            **module.timing,
            "table_csv": self.csv_name,
            "table_html": self.html_name,
            "directions": rows,
        }
        write_results(trainer, results)
        if not trainer.is_global_zero:
            return
        out = run_dir(trainer)
        (out / self.csv_name).write_text(csv_text(rows))
        facts = {
            k: results[k]
            for k in (
                "run",
                "model",
                "task",
                "claims",
                "n_directions",
                "fraction_isolated",
                "fraction_pass",
                "fraction_pass_isolated",
                "level",
                "n_random",
                "n_prompts",
                "rel_gap",
                "wall_s",
            )
        }
        title = f"{module.model_name} {module.task}: {hp.claims} directions, blocks, causal check, readouts"
        (out / self.html_name).write_text(html_page(rows, facts, title), encoding="utf-8")
        if rows:
            self.figure(trainer, rows)

    @staticmethod
    def figure(trainer, rows: Sequence[dict]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for isolated, marker in ((True, "o"), (False, "x")):
            pick = [r for r in rows if r["isolated"] == isolated]
            if pick:
                ax.scatter(
                    [max(r["gap"], 1e-4) for r in pick],
                    [r["z"] for r in pick],
                    s=10,
                    marker=marker,
                    c=["tab:green" if r["passes"] else "tab:red" for r in pick],
                    label=f"{'isolated' if isolated else 'in a block'} ({len(pick)})",
                )
        ax.axhline(Z_PASS, color="k", lw=0.8, ls="--", label=f"z = {Z_PASS:.2f} (one-sided {LEVEL:.0%})")
        ax.set_xscale("log")
        ax.set_xlabel("isolation gap (relative, to the nearest singular value outside the block)")
        ax.set_ylabel("z of |effect| against random directions")
        ax.set_title("claimed directions: green passes the causal check")
        ax.legend(fontsize=8)
        save_figure(trainer, fig, "directions_z")
