"""Writes a tiled-mounts run: results.json (``lit_svd.results.MountsResult``), sites.csv and depth figures
(rank zero only). The result, its pass tables and the real-against-null discrimination come from
``analysis.mounts_tables.mounts_result``."""

from __future__ import annotations

import lightning.pytorch as pl

from lit_svd.analysis.mounts_tables import mounts_result
from lit_svd.callbacks.provenance import provenance
from lit_svd.figures.mounts import figures
from lit_svd.output import save_figures, write_result


class MountsReport(pl.Callback):
    """After ``test``: ``results.json`` (``"experiment": "tiled_mounts"``, ``"sites"``: one entry per
    site-layer), ``sites.csv`` (the same rows) and the depth figures ``mounts_lift_depth.png``,
    ``mounts_span_depth.png``, ``mounts_coverage_depth.png``, ``mounts_steering_depth.png``."""

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rows = getattr(pl_module, "rows", None)
        if not rows or not trainer.is_global_zero:
            return
        hp = {**pl_module.options.as_dict(), **pl_module.hparams}  # every loading option, however it was built
        result = mounts_result(
            rows,
            model=hp.get("model"),
            config=hp,
            tile_widths=dict(pl_module.tile_widths),
            provenance=provenance(trainer, pl_module),
        )
        write_result(trainer, result)
        save_figures(trainer, figures(result))
