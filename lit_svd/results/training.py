"""What the during-training callbacks measured (``SADCallback``, ``MountsCallback``, ``SpectrumCallback``).

One results.json holds them all: the SAD history at the top level (``"experiment": "sad_training"``), the
mounts history under ``mounts_training`` and the spectra under ``spectrum``; a run without the SAD callback
has ``"experiment": "training"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results.base import Result, doc_field, optional

SAD_KEYS = ("threshold", "recon_tol", "seed", "n_probe", "null_draws", "null_at", "null_probe", "summary", "history")


@dataclass(kw_only=True, repr=False)
class TrainingResult(Result):
    """Mechanisms measured during a fit (docs/training.md, docs/sad.md "Over training")."""

    experiment = "sad_training"
    aliases = ("training",)
    table_file = "sad_history.csv"
    headline_keys = tuple(
        f"overall/{k}"
        for k in ("first_step", "last_step", "mean_sparsity_first", "mean_sparsity_last", "mean_sparsity_null_first")
        + ("mean_sparsity_null_last", "fraction_sparser_than_null_first", "fraction_sparser_than_null_last")
    )

    threshold: float | None = doc_field(
        "SAD: attention-weight threshold of an analysed pair (None: 1 / n_visible)", None
    )
    recon_tol: float | None = doc_field("SAD: N_recon tolerance", None)
    seed: int | None = doc_field("SAD: seed of the rotated control and the null draws", None)
    n_probe: int | None = doc_field("SAD: probe sequences (LM) or samples (toy)", None)
    null_draws: int | None = doc_field("SAD: matched-spectrum null heads per head", None)
    null_at: str | None = doc_field('SAD: measurements with the null: "every", "ends" or "last"', None)
    null_probe: int | None = doc_field("SAD: probe sequences the null reads (None: all)", None)
    overall: dict | None = optional(
        "SAD: first_step, last_step and mean_<stat>_first / _last (stat: sparsity, sparsity_rotated,"
        " sparsity_null, sparsity_null_p05, fraction_sparser_than_null); null: undefined",
        nan_ok=True,
        key="summary",
    )
    history: list[dict] | None = optional(
        "SAD: per measured step: step, name [heads], n_pairs [heads], sparsity [heads], sparsity_rotated,"
        " sparsity_null, sparsity_null_p05, sparser_than_null [heads], and their means over heads; null: a head"
        " without pairs",
        nan_ok=True,
    )
    mounts_training: dict | None = optional(
        "MountsCallback: probe, settings, history (per step: rows, one per site-layer as the mounts test run's"
        " sites, and pass_fraction)"
    )
    spectrum: dict | None = optional(
        "SpectrumCallback: top_k, history (per step: rows, one per matrix: matrix, layer, head, name, S,"
        " effective_rank, top_k_energy, tracked)"
    )

    def to_dict(self) -> dict:
        """The results.json content; the SAD keys only when the SAD callback wrote its history."""
        out = super().to_dict()
        if self.history is None:
            out = {k: v for k, v in out.items() if k not in SAD_KEYS}
        return out

    def experiment_name(self) -> str:
        return "sad_training" if self.history is not None else "training"

    @property
    def headline(self) -> dict:
        """SAD's means at the first and last measured steps; the steps the mounts and spectrum callbacks measured,
        and the mounts' last pass fraction."""
        out = super().headline
        for name, section in (("mounts", self.mounts_training), ("spectrum", self.spectrum)):
            history = (section or {}).get("history") or []
            if history:
                out[f"{name}_steps"] = len(history)
                if name == "mounts" and history[-1].get("pass_fraction") is not None:
                    out["mounts_pass_fraction_last"] = history[-1]["pass_fraction"]
        return out

    def rows(self) -> list[dict]:
        """SAD: one row per (measured step, head): step, head, n_pairs and the sparsity values."""
        out = []
        for h in self.history or []:
            for i, name in enumerate(h["name"]):
                row = {"step": h["step"], "head": name}
                for key in ("n_pairs", "sparsity", "sparsity_rotated", "sparsity_null", "sparsity_null_p05"):
                    if key in h:
                        row[key] = h[key][i]
                if "sparser_than_null" in h:
                    row["sparser_than_null"] = h["sparser_than_null"][i]
                out.append(row)
        return out
