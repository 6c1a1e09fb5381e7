"""The toy SVF-alignment result (``SVDAlignmentCallback``, configs/toy/)."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results._rows import flat
from lit_svd.results.base import Result, doc_field, optional


@dataclass(kw_only=True, repr=False)
class ToyAlignmentResult(Result):
    """Alignment of the toy head's Omega = W_Q^T W_K with the template's feature pairs (docs/toy.md)."""

    experiment = "toy_alignment"
    table_file = "instances.csv"
    headline_keys = (
        "global_step",
        "n_instances",
        "overall/n_all_pairs_cos_ge_0.95",
        "overall/mean_abs_cos",
        "overall/min_sigma_ratio",
        "overall/n_distinct_indices",
        "overall/min_spearman_sigma_target",
    )

    global_step: int = doc_field("optimiser steps at the end of fit")
    n_instances: int = doc_field("ensemble instances I")
    frozen_features: bool = doc_field("the feature directions W were fixed at initialisation")
    template_pairs: list[list] = doc_field("the template's pairs [query feature, key feature, target]")
    overall: dict = doc_field(
        "ensemble figures: n_all_pairs_cos_ge_0.95 / 0.9, mean_abs_cos, min_sigma_ratio, n_distinct_indices,"
        " min_spearman_sigma_target, theorem1_groups (one per (d_model, interference) cell)",
        key="summary",
    )
    history: list[dict] = doc_field("per logged step: step, mean_abs_cos [I]")
    tracked_directions: list[dict] = doc_field("per logged step: step, instances [I] of tracked-direction records")
    instances: list[dict] = doc_field(
        "per instance: index, seed, lambda, d_head, d_model, p, singular_values [H], pairs (per pair: singular"
        " index, cos_query, cos_key), mean_abs_cos, sigma_ratio, theorem1, interference_target, interference"
    )
    n_features: int | None = optional("features N of the toy model")
    labels: list[str] | None = optional(
        "each instance named by the settings that differ between instances (legends)", key="instance_labels"
    )
    heatmap_cos: list | None = optional(
        "instance 0's |cos(w_i, u_k)| and |cos(w_j, v_k)|, [2, N, k] (the heatmap figure)"
    )

    def rows(self) -> list[dict]:
        """One row per instance: its scalar fields (pairs and singular values left out)."""
        return [flat(i) for i in self.instances]
