"""Sparse attention decomposition: the per-head result of a test run (``SADReport``)."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results._rows import flat
from lit_svd.results.base import Result, doc_field, optional


@dataclass(kw_only=True, repr=False)
class SADResult(Result):
    """Every analysed head's SAD sparsity against its controls (docs/sad.md)."""

    experiment = "sad"
    table_file = "heads.csv"
    headline_keys = (
        "n_prompts",
        *(f"overall/{k}" for k in ("n_heads_eligible", "n_heads_sparser_than_null", "n_heads_sparser_than_unattended")),
        *(f"overall/{k}" for k in ("n_heads_sparser_than_rotated", "mean_sparsity", "mean_sparsity_null")),
        "overall/n_recon_median",
        "overall/n_recon_median_null",
    )

    model: str = doc_field("the model (alias, hub name, folder or GGUF file)")
    revision: str | None = doc_field("hub revision", None)
    model_type: str = doc_field("Hugging Face model_type of the model")
    n_prompts: int = doc_field("prompts analysed")
    n_directions: int = doc_field("directions per head's basis, k = min(d_head, d_model + 1)")
    threshold: float | None = doc_field("attention-weight threshold of an analysed pair (None: 1 / n_visible)")
    threshold_rule: str = doc_field('"uniform 1/n_visible" or "fixed"')
    recon_tol: float = doc_field("N_recon tolerance")
    seed: int = doc_field("seed of the rotated control and the matched-null draws")
    dtype: str = doc_field("float32 or float64")
    null_draws: int = doc_field("matched-spectrum null heads per head", 0)
    null_stride: int = doc_field("the matched null reads every null_stride-th prompt", 1)
    pair_null: bool = doc_field("the pair null (unattended pairs) was measured", False)
    n_layers: int = doc_field("layers of the model", 0)
    n_heads_per_layer: int = doc_field("query heads per layer", 0)
    overall: dict = doc_field(
        "counts and means over eligible heads (n_heads_eligible, n_heads_sparser_than_null / _unattended /"
        " _rotated, mean sparsities, pooled N_recon histograms n_recon_hist* [k] and medians)",
        key="summary",
    )
    heads: list[dict] = doc_field(
        "one row per analysed head: layer, head, name, n_pairs, sparsity, sparsity_null (mean of draws),"
        " sparsity_null_p05, sparser_than_null, sparsity_unattended, sparsity_rotated, N_recon medians,"
        " basis (rank, n_isolated, top_terms with block fields)"
    )
    rel_gap: float | None = optional("relative gap of the basis blocks (head rows' basis)")

    def rows(self) -> list[dict]:
        """One row per head: its scalar fields; ``basis`` as basis_rank / basis_n_isolated (top terms left out)."""
        return [flat(h) for h in self.heads]
