"""Tiled-SVD mounts of every linear site (``MountsReport``)."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results.base import Result, doc_field, optional


def site_csv_row(row: dict) -> dict:
    """One flat CSV row of a site-layer: lists joined with ``;``, checks as ``check_<name>`` columns, the
    null's figures as ``null_<key>``."""
    out = {}
    for k, v in row.items():
        if k == "checks":
            out.update({f"check_{c}": ("" if x is None else int(x)) for c, x in v.items()})
        elif isinstance(v, dict):  # the null's figures: null_<key>
            out.update({f"{k}_{kk}": vv for kk, vv in site_csv_row(v).items() if kk != "layer"})
        elif isinstance(v, (list, tuple)):
            out[k] = ";".join(f"{x:.6g}" if isinstance(x, float) else str(x) for x in v)
        else:
            out[k] = v
    return out


@dataclass(kw_only=True, repr=False)
class MountsResult(Result):
    """Mounts of every site-layer scored against whole-matrix SVD, column sampling and random directions,
    with the data ceiling and the structureless null (docs/mounts.md)."""

    experiment = "tiled_mounts"
    table_file = "sites.csv"
    headline_keys = ("n_pass", "n_site_layers", "n_pass_null", "n_tokens")

    model: str | None = doc_field("the frozen model")
    config: dict = doc_field("the module's settings (hparams)")
    n_tokens: int = doc_field("tokens scored (the largest over site-layers)")
    pass_table: dict = doc_field('per site and check: "passed/required" over its layers; "all": the pass count')
    n_pass: int = doc_field("site-layers passing every required check")
    n_site_layers: int = doc_field("site-layers scored")
    tile_widths: dict = doc_field("column-tile width per site")
    site_summary: dict = doc_field("per site: layers where tiled beats whole, ceiling fractions (mean, min, max)")
    sites: list[dict] = doc_field(
        "per site-layer: site, layer, residual, path, tile_width, lift_<strategy>, span lifts, coverage_modes,"
        " coverage_lift [modes], identity_rel_err, steering (residual sites), checks, pass, null {...}"
    )
    pass_table_null: dict | None = optional("the pass table of the structureless nulls")
    n_pass_null: int | None = optional("null site-layers passing")
    discriminating: dict | None = optional(
        "per site and check: real passes significantly more often than null (one-sided Fisher, 0.05)"
    )

    @property
    def headline(self) -> dict:
        """Site-layers passing every check, of those scored; the structureless null's count; the tokens; with the
        null, the (site, check) pairs where real passes significantly more often."""
        out = super().headline
        if self.discriminating is not None:
            out["n_discriminating"] = sum(bool(v) for checks in self.discriminating.values() for v in checks.values())
        return out

    def rows(self) -> list[dict]:
        """One row per site-layer (``site_csv_row``: the sites.csv columns)."""
        return [site_csv_row(r) for r in self.sites]
