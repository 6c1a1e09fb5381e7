"""Directional circuits: a direction-mask run (``DirectionMaskReport``) and the tools that read one
(``cli_tools mask-thresholds``, ``mask-curve``, ``mask-blocks``)."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results._rows import flat
from lit_svd.results.base import Result, doc_field
from lit_svd.results.show import per_setting


@dataclass(kw_only=True, repr=False)
class MaskResult(Result):
    """What a direction-mask run measured (docs/masks.md). The flat scores are ``eval_split``'s; ``splits``
    holds them for every evaluated split. GT: ``logit_diff_*`` is the probability difference greater - lesser."""

    experiment = "direction_mask"
    table_file = "kept_directions.csv"
    headline_keys = (
        "kept",
        "n_directions",
        "kept_fraction",
        "kl_hard",
        "kl_soft",
        "logit_diff_full",
        "logit_diff_hard",
        "accuracy_full",
        "accuracy_hard",
        "steps",
    )

    task: str | None = doc_field("ioi, gp or gt")
    model: str = doc_field("the frozen model")
    n_directions: int = doc_field("directions masked, over all components")
    kept: int = doc_field("directions kept by the hard masks (lambda >= threshold)")
    kept_fraction: float = doc_field("kept / n_directions")
    threshold: float = doc_field("lambda at or above which a direction is kept")
    alpha: float = doc_field("L1 weight")
    ablation: str = doc_field("zero or patch")
    positions: str = doc_field("answer or all")
    steps: int = doc_field("optimiser steps")
    straight_through: bool = doc_field("trained through the hard masks")
    soft_steps: int = doc_field("soft warm-up steps before straight-through training")
    loss: str = doc_field("the distance trained: kl (at the answer position) or metric (to the full model's)", "kl")
    alpha_final: float | None = doc_field(
        "the L1 weight at max_steps, raised geometrically from alpha (null: none)", None
    )
    drop_null: bool = doc_field("null directions left out of the masked components", False)
    eval_split: str = doc_field("the split of the flat scores (val or test)")
    metric: str = doc_field("logit_diff, or prob_diff for GT")
    kl_soft: float = doc_field("KL(full || soft-masked) at the answer position")
    kl_hard: float = doc_field("KL(full || hard-masked)")
    logit_diff_full: float = doc_field("task metric of the full model")
    logit_diff_soft: float = doc_field("task metric with soft masks")
    logit_diff_hard: float = doc_field("task metric with hard masks")
    accuracy_full: float = doc_field("fraction of prompts with a positive metric, full model")
    accuracy_soft: float = doc_field("same, soft masks")
    accuracy_hard: float = doc_field("same, hard masks")
    agreement_soft: float = doc_field("fraction whose argmax token equals the full model's, soft masks")
    agreement_hard: float = doc_field("same, hard masks")
    per_kind: dict = doc_field("per component kind: n_directions, kept, kept_fraction")
    trajectory: list[dict] = doc_field("per trajectory step: step, kept_fraction, kl_soft, kl_hard (validation batch)")
    components: list[dict] = doc_field(
        "per component: name, kind, layer, group, n_groups, n_directions, kept, kept_per_group [groups]"
    )
    splits: dict = doc_field("per evaluated split: n_examples and the scores above")
    kept_without_qk: dict = doc_field("kept counts with the QK components left out")
    max_steps: int = doc_field("the trainer's max_steps", -1)
    stopped_early: bool = doc_field("the run ended before max_steps (max_time fired)", False)
    train_wall_s: float | None = doc_field("training wall time of this process (None after test)", None)
    trajectory_split: str = doc_field("split of the trajectory's batch (never test)", "val")
    steering_split: str = doc_field("split of the steering and swap batch (never test when val exists)", "val")
    data_seed: int | None = doc_field("the data module's seed", None)
    order_seed: int | None = doc_field("the data module's training-order seed", None)
    mask_unit: str = doc_field("direction or block", "direction")
    rel_gap: float | None = doc_field("relative gap of a block of near-equal singular values", None)
    kept_isolated: dict = doc_field("kept directions isolated / in blocks / past the rank, per kind", dict)
    kept_directions: list[dict] = doc_field(
        "every kept direction: component, kind, layer, head, direction, sigma, block {id, size, first, last},"
        " gap, isolated, past_rank, kept_in_block, claim",
        list,
    )
    kept_blocks: list[dict] = doc_field("block-level claims: k of m kept in block b", list)
    blocks_per_kind: dict = doc_field("per kind: ranks, isolated and in-block counts of all directions", dict)
    blocks_file: str = doc_field("file of every component's blocks (blocks.json)", "blocks.json")
    receptors: list[dict] = doc_field("top kept OV directions (largest sigma): top logit tokens and block", list)
    steering: dict | None = doc_field("one kept OV direction scaled: component, head, direction, factors", None)
    steering_swap: dict | None = doc_field(
        "two-class tasks: the most class-separating kept OV directions swapped toward the other class", None
    )

    def rows(self) -> list[dict]:
        """One row per kept direction (block as block_id, block_size, block_first, block_last)."""
        return [flat(d) for d in self.kept_directions]


@dataclass(kw_only=True, repr=False)
class MaskThresholdsResult(Result):
    """A mask run's hard masks re-cut at several lambda thresholds (``cli_tools mask-thresholds``)."""

    experiment = "mask_thresholds"
    table_file = "thresholds.csv"
    headline_keys = (
        "max_kl",
        "chosen_threshold=chosen/threshold",
        "chosen_kept_fraction=chosen/kept_fraction",
        "chosen_val_kl_hard=chosen/val/kl_hard",
        "chosen_test_kl_hard=chosen/test/kl_hard",
        "chosen_test_accuracy_hard=chosen/test/accuracy_hard",
    )

    source: str = doc_field("the mask run folder")
    max_kl: float = doc_field("the choice: the largest threshold with validation hard KL <= max_kl")
    chosen_on: str = doc_field("the split the threshold is chosen on (val)")
    thresholds: list[dict] = doc_field(
        "per threshold: threshold, kept_fraction, val and test {kl_hard, kl_soft, accuracy_hard, metric_hard,"
        " metric_full}",
        key="rows",
    )
    chosen: dict | None = doc_field("the chosen row (None: no threshold qualifies)")

    def rows(self) -> list[dict]:
        """One row per threshold (val_kl_hard, test_kl_hard, ...)."""
        return [flat(r) for r in self.thresholds]


@dataclass(kw_only=True, repr=False)
class MaskCurveResult(Result):
    """The sparsity-KL curve of several mask runs (``cli_tools mask-curve``)."""

    experiment = "mask_curve"
    table_file = "mask_curve.csv"

    runs: list[dict] = doc_field(
        "per run, sorted by alpha: label, alpha, kept_fraction, kl_hard, kl_soft, logit_diff_hard,"
        " accuracy_hard, steps, eval_split, task, model"
    )

    @property
    def headline(self) -> dict:
        """The number of runs; per run (sorted by alpha, at most four) its kept fraction and hard KL."""
        return {"n_runs": len(self.runs), **per_setting(self.runs, "alpha", ("kept_fraction", "kl_hard"))}

    def subject(self) -> str:
        models = sorted({str(r.get("model")) for r in self.runs if r.get("model")})
        tasks = sorted({str(r.get("task")) for r in self.runs if r.get("task")})
        return ", ".join([*models, *(f"task {t}" for t in tasks)])

    def rows(self) -> list[dict]:
        return [dict(r) for r in self.runs]


@dataclass(kw_only=True, repr=False)
class MaskBlocksResult(Result):
    """A mask run's kept directions annotated with blocks at several gaps (``cli_tools mask-blocks``)."""

    experiment = "mask_blocks"
    table_file = "kept_directions.csv"

    source: str = doc_field("the mask run folder")
    model: str = doc_field("its model")
    kept: int = doc_field("its kept directions")
    rel_gaps: list[float] = doc_field("the gaps")
    per_gap: list[dict] = doc_field(
        "per gap: rel_gap, kept, isolated, isolated_fraction, per_kind, all_directions, receptors, steering,"
        " steering_swap_directions (with block fields)"
    )
    kept_directions: list[dict] = doc_field("every kept direction with its block at the first gap", list)
    kept_blocks: list[dict] = doc_field("block-level claims at the first gap", list)
    directions_rel_gap: float | None = doc_field("the gap of kept_directions and blocks.json", None)
    blocks_file: str = doc_field("file of every component's blocks at the first gap", "blocks.json")

    @property
    def headline(self) -> dict:
        """The kept directions; per gap (at most four) how many of them are isolated, and their fraction."""
        return {"kept": self.kept, **per_setting(self.per_gap, "rel_gap", ("isolated", "isolated_fraction"))}

    def rows(self) -> list[dict]:
        return [flat(d) for d in self.kept_directions]
