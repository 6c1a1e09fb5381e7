"""What a direction-mask run measures besides its loss, for its report (``callbacks.masks.DirectionMaskReport``).

The report callback says what the report holds (``MaskReportPlan``, from its options) and sets it as the
module's ``report_plan``; the module then measures, in its own hooks: every ``trajectory_every`` steps the
KL with hard and soft masks on the first validation batch (``trajectory_point``); at the end of fit the
evaluation of the validation and test splits, the logit receptors of the kept OV directions, one steered
direction and the two-class swap (``final_measures``; after ``test``, the same on the test split), and the
blocks of the kept directions. The callback only turns ``module.report_rows`` into the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from lit_svd.analysis.blocks import block_report, direction_block, kept_blocks
from lit_svd.analysis.masks import logit_receptors, steer, swap_steer
from lit_svd.choices import choices

Split = Literal["val", "test"]
SPLITS: tuple[Split, ...] = choices(Split)


@dataclass
class MaskReportPlan:
    """What the report holds (the options of ``DirectionMaskReport``, documented there)."""

    receptors_top: int = 12
    steer_factors: Sequence[float] = (-2.0, -1.0, 0.0, 2.0, 4.0)
    steer_target: tuple[str | None, int | None, int | None] = (None, None, None)
    trajectory_every: int = 10
    swap_counts: Sequence[int] = (1, 2, 4, 8, 16)
    trajectory_split: str = "val"  # never the test split: nothing is chosen or watched on it
    trajectory: list[dict] = field(default_factory=list)


def loader(module, split: str):
    return getattr(module.trainer.datamodule, f"{split}_dataloader")()


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def trajectory_point(module, plan: MaskReportPlan) -> dict:
    """Kept fraction and KL (soft, hard) on the first batch of the trajectory split (this rank's)."""
    if not hasattr(module, "_trajectory_probe"):
        module._trajectory_probe = to_device(next(iter(loader(module, plan.trajectory_split))), module.device)
    batch = module._trajectory_probe
    full = module.answer_logits(batch["clean_ids"], batch)
    reference = module.reference(batch)
    point = {"step": module.trainer.global_step, "kept_fraction": module.kept()["kept_fraction"]}
    for setting, scales in (
        ("soft", {n: l.detach() for n, l in module.lambdas().items()}),
        ("hard", module.hard()),
    ):
        logits = module.answer_logits(batch["clean_ids"], batch, scales, reference)
        point[f"kl_{setting}"] = float(module.scores(logits, full, batch)["kl"].mean())
    return point


def final_measures(module, plan: MaskReportPlan, evals: dict[str, dict]) -> dict:
    """Everything the report needs at the end of a stage, given the evaluated splits (``evals``: split ->
    the module's evaluation dict): kept counts, the steering split's receptors, steering and swap, blocks."""
    probe_split = "val" if "val" in evals else next(iter(evals))  # steering picks and measures off the test split
    first = to_device(next(iter(loader(module, probe_split))), module.device)
    kb = kept_blocks(module.components, {n: h.bool() for n, h in module.hard().items()}, module.rel_gap)
    return {
        "evals": evals,
        "n_examples": {split: len(loader(module, split).dataset) for split in evals},
        "kept": module.kept(),
        "probe_split": probe_split,
        "kept_blocks": kb,
        "block_report": block_report(module.components, module.rel_gap),
        "receptors": receptors(module, plan.receptors_top),
        "steering": steering(module, first, plan.steer_target, plan.steer_factors),
        "steering_swap": swap(module, first, plan.swap_counts),
        "trajectory": list(plan.trajectory),
    }


def evaluate_splits(module, progress: bool) -> dict[str, dict]:
    """The module's evaluation of each of the validation and test splits that has examples."""
    return {
        split: module.evaluate(loader(module, split), progress=progress)
        for split in SPLITS
        if len(loader(module, split).dataset)
    }


def receptors(module, top: int) -> list[dict]:
    """The top logit tokens of the ``top`` kept OV directions of largest singular value."""
    hard = module.hard()
    rows = []
    for c in module.components:
        if c.kind == "ov":
            rows += logit_receptors(module.view, c, hard[c.name].bool(), module.tokenizer, rel_gap=module.rel_gap)
    rows.sort(key=lambda r: -r["sigma"])
    return rows[:top]


def steered_run(module, batch: dict):
    """``run(scales, reference=None)``: answer-position logits of the clean prompts with ``scales``
    applied at the answer positions, patched toward ``reference`` (None scales: the unmodified model)."""

    @torch.no_grad()
    def run(scales: dict | None, reference: dict | None = None):
        if scales is None:
            return module.answer_logits(batch["clean_ids"], batch)
        with module.intervention.apply(scales, positions=batch["answer_pos"], reference=reference):
            return module.answer_logits(batch["clean_ids"], batch)

    return run


def steering(module, batch: dict, target: tuple, factors: Sequence[float]) -> dict | None:
    """One OV direction's coefficient scaled by each factor (``target``, or the most effective kept one)."""
    name, head, direction = target
    if name is None:
        picked = module.most_effective_ov_direction(batch)
        if picked is None:
            return None
        name, head, direction = picked.component, picked.group, picked.index
    rows = steer(
        steered_run(module, batch), module.intervention, batch, name, head, direction, list(factors), task=module.task
    )
    return {
        "component": name,
        "head": head,
        "direction": direction,
        **direction_block(module.blocks()[name], head, direction),
        "n_examples": len(batch["answer_pos"]),
        "factors": rows,
    }


def swap(module, batch: dict, counts: Sequence[int]) -> dict | None:
    """Two-class tasks (GP): kept OV directions swapped toward the other class's mean coefficient."""
    names = [c.name for c in module.components if c.kind == "ov"]
    if not names:
        return None
    with torch.no_grad(), module.intervention.record(names, positions=batch["answer_pos"]) as coefficients:
        module.answer_logits(batch["clean_ids"], batch)
    hard = module.hard()
    out = swap_steer(
        steered_run(module, batch),
        batch,
        dict(coefficients),
        {n: hard[n] for n in names},
        list(counts),
        task=module.task,
    )
    if out is not None:
        blocks = module.blocks()
        for row in out["directions"]:
            row.update(direction_block(blocks[row["component"]], row["head"], row["direction"]))
    return out
