"""DirectionReport: the per-direction table of ``DirectionCheckModule`` written into the run folder.

After ``test`` (rank zero) it writes:

* ``results.json`` (``lit_svd.results.DirectionCheckResult``): ``experiment`` ("direction_check"), the checked
  ``run``, ``task``, ``claims``, the counts and fractions (``n_directions``, ``fraction_isolated``,
  ``fraction_pass``, ``fraction_pass_isolated``), the check's settings (``level``, ``z_pass``, ``n_random``,
  ``n_prompts``, ``rel_gap``), the timing (``wall_s``, ``directions_per_s``), ``directions`` (one entry per
  claimed direction) and ``table_csv`` / ``table_html`` (the file names of the two tables below);
* ``directions.csv``: the same rows, one per line;
* ``directions.html``: one static page (inline CSS and JavaScript, no network) with the summary and the
  table, sortable by clicking a column header; open it with ``python -m webbrowser file://PATH``;
* ``directions_z.png``: z against the isolation gap, one point per direction.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from lit_svd.analysis.causal import LEVEL, MIN_GAP_FRACTION, Z_PASS
from lit_svd.callbacks.provenance import provenance
from lit_svd.figures.directions import figures, html_page
from lit_svd.output import run_dir, save_figures, write_result, write_text
from lit_svd.results.directions import DirectionCheckResult, check_summary


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
        timing = {k: v for k, v in module.timing.items() if k != "directions"}  # the count is n_directions
        result = DirectionCheckResult(
            run=str(module.run_path),
            model=module.model_name,
            task=module.task,
            claims=hp.claims,
            kinds=list(hp.kinds),
            **check_summary(rows),
            n_claimed=module.n_claimed,
            max_claims=hp.max_claims,
            min_gap_fraction=MIN_GAP_FRACTION if rows and "passes_gap" in rows[0] else None,
            level=LEVEL,
            z_pass=Z_PASS,
            n_random=hp.n_random,
            seed=hp.seed,
            rel_gap=hp.rel_gap,
            **timing,
            table_csv=self.csv_name,
            table_html=self.html_name,
            directions=rows,
            provenance=provenance(trainer, module),
        )
        write_result(trainer, result)
        if trainer.is_global_zero:
            write_text(run_dir(trainer) / self.html_name, html_page(result))
            save_figures(trainer, figures(result))
