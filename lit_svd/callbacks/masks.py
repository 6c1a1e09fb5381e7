"""DirectionMaskReport: what a direction-mask run measured, written into the run folder.

Its options say what the report holds; the module measures it (``lit_svd.modules.mask_measures``): at the
end of ``fit`` the masks on the validation and the test split (each that has examples) with the full model,
soft masks (the paper's evaluation) and hard masks; after ``test`` on the test split. This callback turns
those rows into a ``lit_svd.results.MaskResult`` and writes (rank zero):

* ``results.json``: ``experiment`` ("direction_mask"), ``task``, ``model``, ``n_directions``, ``kept``,
  ``kept_fraction``, ``kl_soft``, ``kl_hard``, ``logit_diff_full``, ``logit_diff_hard`` (GT: the
  probability difference greater - lesser), ``accuracy_full``, ``accuracy_hard`` (GT: fraction with a
  positive probability difference), plus ``logit_diff_soft``, ``accuracy_soft``, ``agreement_soft``,
  ``agreement_hard`` (these flat figures are ``eval_split``'s), ``splits`` (the same figures and
  ``n_examples`` per split), ``per_kind``, ``kept_without_qk`` and ``components`` (kept counts per
  component and group), ``steps``, ``max_steps``, ``stopped_early`` (the run ended before
  ``max_steps``: the ``max_time`` safety net fired), ``train_wall_s`` (of this
  process: a resumed run counts from the resume), ``receptors``, ``steering`` (one
  direction scaled) and ``steering_swap`` (two-class tasks: the most class-separating kept OV
  directions swapped toward the other class's mean); the trajectory and steering use the validation
  split, never the test split;
  Identifiability (docs/masks.md, "Blocks"): ``mask_unit``, ``rel_gap``; ``kept_isolated`` (kept
  directions that are isolated vs in blocks of near-equal singular values vs past the rank, per kind);
  ``kept_directions`` (every kept direction with its ``block`` (id, size, first, last), ``gap``,
  ``isolated``, ``kept_in_block`` and ``claim``: "direction" or "block"); ``kept_blocks`` (the block-level
  claims: "k of m kept in block b"); ``blocks_per_kind`` and ``blocks_file`` (``blocks.json``: every
  component's ranks, blocks and per-direction gaps). Receptor, steering and swap rows carry their
  direction's block fields too;
* ``masks.pt``: ``torch.load`` it for ``{"lambdas": {component: [groups, directions]}, "threshold", ...}``;
* ``masks_kept_<kind>.png``: kept directions per layer and head (group), also in TensorBoard;
* ``masks_blocks.png``: kept directions per kind, isolated vs in blocks vs past the rank;
* ``kept_directions.csv``: the table of ``kept_directions``.

During training it logs the kept fraction per component type to TensorBoard every ``log_every`` steps
(the module itself logs KL, L1 and the overall kept fraction every step).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import lightning.pytorch as pl
import torch

from lit_svd.callbacks.provenance import provenance
from lit_svd.choices import check_choice
from lit_svd.figures import masks as figs
from lit_svd.modules.mask_measures import MaskReportPlan, Split
from lit_svd.output import run_dir, save_figures, write_result, write_results
from lit_svd.results.masks import MaskResult


def _scores(ev: dict) -> dict:
    """The module's evaluation dict (``{setting}_{score}``) under results.json's names."""
    out = {"kl_soft": ev["soft_kl"], "kl_hard": ev["hard_kl"]}
    for key, score in (("logit_diff", "metric"), ("accuracy", "correct")):
        out.update({f"{key}_{s}": ev[f"{s}_{score}"] for s in ("full", "soft", "hard")})
    out.update({f"agreement_{s}": ev[f"{s}_agree"] for s in ("soft", "hard")})
    return out


class DirectionMaskReport(pl.Callback):
    """Writes what a direction-mask run measured: results.json, masks.pt and figures (module docstring).

    Args:
        log_every: steps between per-type kept-fraction logs.
        receptors_top: how many kept OV directions (largest singular value first) get logit receptors.
        steer_factors: factors a chosen OV direction's coefficient is scaled by at the answer position.
        steer_component: the component of the direction to steer (e.g. "L9.ov"); None (with the next two)
            picks the kept OV direction whose hard-mask scale has the largest effect on the task metric
            (first-order, one backward pass).
        steer_head: its head (group) index, e.g. 6.
        steer_direction: its direction index within the head, e.g. 0.
        eval_split: "val" or "test": whose figures are the flat (headline) keys of results.json; both
            splits are evaluated and reported under ``splits``.
        trajectory_every: every so many steps, KL with hard and soft masks and the kept fraction on
            the first validation batch (``results["trajectory"]``: the sparsity-KL path of the run;
            0 turns it off).
        swap_counts: on two-class tasks (GP), how many of the most class-separating kept OV
            directions are swapped toward the other class's mean (``results["steering_swap"]``).
    """

    def __init__(
        self,
        log_every: int = 10,
        receptors_top: int = 12,
        steer_factors: Sequence[float] = (-2.0, -1.0, 0.0, 2.0, 4.0),
        steer_component: str | None = None,
        steer_head: int | None = None,
        steer_direction: int | None = None,
        eval_split: Split = "val",
        trajectory_every: int = 10,
        swap_counts: Sequence[int] = (1, 2, 4, 8, 16),
    ):
        check_choice("eval_split", eval_split, Split)
        self.log_every, self.eval_split = log_every, eval_split
        self.plan = MaskReportPlan(
            receptors_top=receptors_top,
            steer_factors=list(steer_factors),
            steer_target=(steer_component, steer_head, steer_direction),
            trajectory_every=trajectory_every,
            swap_counts=list(swap_counts),
        )
        self.train_wall_s = None

    def setup(self, trainer, module, stage: str) -> None:
        module.report_plan = self.plan  # the module measures what the report holds

    @property
    def trajectory(self) -> list[dict]:
        return self.plan.trajectory

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.log_every == 0:
            per_kind = module.kept()["per_kind"]
            module.log_dict({f"kept_fraction/{k}": v["kept_fraction"] for k, v in per_kind.items()}, on_step=True)

    def state_dict(self) -> dict:
        """Saved in checkpoints, so that a resumed run reports the whole trajectory."""
        return {"trajectory": list(self.plan.trajectory)}

    def load_state_dict(self, state: dict) -> None:
        self.plan.trajectory[:] = list(state.get("trajectory", []))

    def on_fit_start(self, trainer, module) -> None:
        if not len(getattr(trainer.datamodule, f"{self.eval_split}_dataloader")().dataset):
            raise ValueError(
                f"eval_split={self.eval_split!r} but the data module's {self.eval_split} split is empty;"
                f" give n_{self.eval_split} > 0"
            )

    def on_train_start(self, trainer, module) -> None:
        self._train_start = time.monotonic()

    def on_train_end(self, trainer, module) -> None:
        self.train_wall_s = time.monotonic() - self._train_start

    def on_fit_end(self, trainer, module) -> None:
        self.report(trainer, module, fit=True)

    def on_test_end(self, trainer, module) -> None:
        self.report(trainer, module, fit=False)

    # --------------------------------------------------------------------------------------------
    def result(self, trainer, module, fit: bool) -> MaskResult:
        """The module's report rows as a result: the headline keys are ``eval_split``'s (test after
        ``trainer.test``); every evaluated split is also reported under ``splits``."""
        rows = module.report_rows
        evals, kept, kb = rows["evals"], rows["kept"], rows["kept_blocks"]
        headline = self.eval_split if self.eval_split in evals else next(iter(evals))
        max_steps = trainer.max_steps
        dm = trainer.datamodule
        return MaskResult(
            task=getattr(getattr(dm, "task", None), "name", None),
            model=module.model_name,
            n_directions=kept["n_directions"],
            kept=kept["kept"],
            kept_fraction=kept["kept_fraction"],
            threshold=module.threshold,
            alpha=module.alpha,
            ablation=module.ablation,
            positions=module.positions,
            steps=trainer.global_step,
            straight_through=module.hparams.straight_through,
            soft_steps=module.hparams.soft_steps,
            loss=module.loss_kind,
            alpha_final=module.alpha_final,
            drop_null=module.hparams.drop_null,
            eval_split=headline,
            metric="prob_diff" if module.task == "gt" else "logit_diff",
            **_scores(evals[headline]),
            per_kind=kept["per_kind"],
            trajectory=rows["trajectory"],
            components=kept["components"],
            splits={split: {"n_examples": rows["n_examples"][split], **_scores(ev)} for split, ev in evals.items()},
            kept_without_qk=kept["without_qk"],
            max_steps=max_steps,
            stopped_early=fit and max_steps > 0 and trainer.global_step < max_steps,
            train_wall_s=self.train_wall_s if fit else None,
            trajectory_split=self.plan.trajectory_split,
            steering_split=rows["probe_split"],
            data_seed=getattr(dm, "seed", None),
            order_seed=getattr(dm, "order_seed", None),
            mask_unit=module.mask_unit,
            rel_gap=module.rel_gap,
            kept_isolated={k: kb[k] for k in ("kept", "isolated", "isolated_fraction", "per_kind")},
            kept_directions=kb["directions"],
            kept_blocks=kb["blocks"],
            blocks_per_kind=rows["block_report"]["per_kind"],
            blocks_file="blocks.json",
            receptors=rows["receptors"],
            steering=rows["steering"],
            steering_swap=rows["steering_swap"],
            provenance=provenance(trainer, module),
        )

    def report(self, trainer, module, fit: bool) -> None:
        if module.report_rows is None:
            raise RuntimeError("the module measured nothing for the report (was its report_plan set in setup?)")
        result = self.result(trainer, module, fit)
        write_result(trainer, result)
        write_results(trainer, module.report_rows["block_report"], "blocks.json")
        if trainer.is_global_zero:
            torch.save(module.masks_state(), run_dir(trainer) / "masks.pt")
            save_figures(trainer, figs.figures(result))
