"""DirectionMaskReport: what a direction-mask run measured, written into the run folder.

At the end of ``fit`` it evaluates the masks on the validation and the test split (each that has
examples) with the full model, soft masks (the paper's evaluation) and hard masks; after ``test`` on
the test split. It writes (rank zero):

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
* ``masks_blocks.png``: kept directions per kind, isolated vs in blocks vs past the rank.

During training it logs the kept fraction per component type to TensorBoard every ``log_every`` steps
(the module itself logs KL, L1 and the overall kept fraction every step).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

import lightning.pytorch as pl
import torch

from lit_svd.analysis.blocks import block_report, direction_block, kept_blocks
from lit_svd.analysis.masks import logit_receptors, steer, swap_steer
from lit_svd.output import run_dir, save_figure, write_results

SPLITS = ("val", "test")


def _scores(ev: dict) -> dict:
    """The module's evaluation dict (``{setting}_{score}``) under results.json's names."""
    out = {"kl_soft": ev["soft_kl"], "kl_hard": ev["hard_kl"]}
    for key, score in (("logit_diff", "metric"), ("accuracy", "correct")):
        out.update({f"{key}_{s}": ev[f"{s}_{score}"] for s in ("full", "soft", "hard")})
    out.update({f"agreement_{s}": ev[f"{s}_agree"] for s in ("soft", "hard")})
    return out


class DirectionMaskReport(pl.Callback):
    """Evaluates a direction-mask run and writes results.json, masks.pt and figures (module docstring).

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
        eval_split: Literal["val", "test"] = "val",
        trajectory_every: int = 10,
        swap_counts: Sequence[int] = (1, 2, 4, 8, 16),
    ):
        if eval_split not in ("val", "test"):
            raise ValueError(f"eval_split={eval_split!r} is unknown; choose val or test")
        self.log_every, self.receptors_top, self.steer_factors = log_every, receptors_top, list(steer_factors)
        self.steer_target = (steer_component, steer_head, steer_direction)
        self.eval_split = eval_split
        self.swap_counts = list(swap_counts)
        self.trajectory_every, self.trajectory = trajectory_every, []
        self.train_wall_s = None
        self.trajectory_split = "val"  # never the test split: nothing is chosen or watched on it

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.log_every == 0:
            per_kind = module.kept()["per_kind"]
            module.log_dict({f"kept_fraction/{k}": v["kept_fraction"] for k, v in per_kind.items()}, on_step=True)
        if self.trajectory_every and step % self.trajectory_every == 0:
            self.trajectory.append(self.trajectory_point(trainer, module))
            module.log_dict({"trajectory/kl_hard": self.trajectory[-1]["kl_hard"]}, on_step=True)

    @torch.no_grad()
    def trajectory_point(self, trainer, module) -> dict:
        """Kept fraction and KL (soft, hard) on the first validation batch (this rank's)."""
        if not hasattr(self, "_probe"):
            self._probe = _to(next(iter(self._loader(trainer, self.trajectory_split))), module.device)
        batch = self._probe
        full = module.answer_logits(batch["clean_ids"], batch)
        reference = module.reference(batch)
        point = {"step": trainer.global_step, "kept_fraction": module.kept()["kept_fraction"]}
        for setting, scales in (
            ("soft", {n: l.detach() for n, l in module.lambdas().items()}),
            ("hard", module.hard()),
        ):
            logits = module.answer_logits(batch["clean_ids"], batch, scales, reference)
            point[f"kl_{setting}"] = float(module.scores(logits, full, batch)["kl"].mean())
        return point

    def state_dict(self) -> dict:
        """Saved in checkpoints, so that a resumed run reports the whole trajectory."""
        return {"trajectory": list(self.trajectory)}

    def load_state_dict(self, state: dict) -> None:
        self.trajectory = list(state.get("trajectory", []))

    def on_fit_start(self, trainer, module) -> None:
        if not len(self._loader(trainer, self.eval_split).dataset):
            raise ValueError(
                f"eval_split={self.eval_split!r} but the data module's {self.eval_split} split is empty;"
                f" give n_{self.eval_split} > 0"
            )

    def on_train_start(self, trainer, module) -> None:
        self._train_start = time.monotonic()

    def on_train_end(self, trainer, module) -> None:
        self.train_wall_s = time.monotonic() - self._train_start

    def on_fit_end(self, trainer, module) -> None:
        show = trainer.is_global_zero and trainer.progress_bar_callback is not None
        evals = {
            split: module.evaluate(self._loader(trainer, split), progress=show)
            for split in SPLITS
            if len(self._loader(trainer, split).dataset)
        }
        self.report(trainer, module, evals, fit=True)

    def on_test_end(self, trainer, module) -> None:
        self.report(trainer, module, {"test": module.last_eval}, fit=False)

    @staticmethod
    def _loader(trainer, split: str):
        return getattr(trainer.datamodule, f"{split}_dataloader")()

    # --------------------------------------------------------------------------------------------
    def report(self, trainer, module, evals: dict[str, dict], fit: bool) -> None:
        """``evals``: split -> the module's evaluation dict; the headline keys are ``eval_split``'s (test
        after ``trainer.test``); every evaluated split is also reported under ``splits``."""
        kept = module.kept()
        headline = self.eval_split if self.eval_split in evals else next(iter(evals))
        probe_split = "val" if "val" in evals else headline  # steering picks and measures off the test split
        first = _to(next(iter(self._loader(trainer, probe_split))), module.device)
        gt = module.task == "gt"
        max_steps = trainer.max_steps
        results = {
            "experiment": "direction_mask",
            "task": _task_name(trainer),
            "model": module.model_name,
            "n_directions": kept["n_directions"],
            "kept": kept["kept"],
            "kept_fraction": kept["kept_fraction"],
            "threshold": module.threshold,
            "alpha": module.alpha,
            "ablation": module.ablation,
            "positions": module.positions,
            "steps": trainer.global_step,
            "straight_through": module.hparams.straight_through,
            "soft_steps": module.hparams.soft_steps,
            "eval_split": headline,
            "metric": "prob_diff" if gt else "logit_diff",
            **_scores(evals[headline]),
            "per_kind": kept["per_kind"],
            "trajectory": self.trajectory,
            "components": kept["components"],
            "splits": {
                split: {"n_examples": len(self._loader(trainer, split).dataset), **_scores(ev)}
                for split, ev in evals.items()
            },
            "kept_without_qk": kept["without_qk"],
            "max_steps": max_steps,
            "stopped_early": fit and max_steps > 0 and trainer.global_step < max_steps,
            "train_wall_s": self.train_wall_s if fit else None,
            "trajectory_split": self.trajectory_split,
            "steering_split": probe_split,
            "data_seed": getattr(trainer.datamodule, "seed", None),
            "order_seed": getattr(trainer.datamodule, "order_seed", None),
        }
        kb = kept_blocks(module.components, {n: h.bool() for n, h in module.hard().items()}, module.rel_gap)
        report = block_report(module.components, module.rel_gap)
        results.update(
            mask_unit=module.mask_unit,
            rel_gap=module.rel_gap,
            kept_isolated={k: kb[k] for k in ("kept", "isolated", "isolated_fraction", "per_kind")},
            kept_directions=kb["directions"],
            kept_blocks=kb["blocks"],
            blocks_per_kind=report["per_kind"],
            blocks_file="blocks.json",
        )
        results["receptors"] = self.receptors(module)
        results["steering"] = self.steering(module, first)
        results["steering_swap"] = self.swap(module, first)
        write_results(trainer, results)
        write_results(trainer, report, "blocks.json")
        if trainer.is_global_zero:
            torch.save(module.masks_state(), run_dir(trainer) / "masks.pt")
            self.figures(trainer, module, kept)
            self.blocks_figure(trainer, results["kept_isolated"]["per_kind"], module.rel_gap)

    def receptors(self, module) -> list[dict]:
        hard = module.hard()
        rows = []
        for c in module.components:
            if c.kind == "ov":
                rows += logit_receptors(module.view, c, hard[c.name].bool(), module.tokenizer, rel_gap=module.rel_gap)
        rows.sort(key=lambda r: -r["sigma"])
        return rows[: self.receptors_top]

    def steering(self, module, batch: dict) -> dict | None:
        name, head, direction = self.steer_target
        if name is None:
            picked = module.most_effective_ov_direction(batch)
            if picked is None:
                return None
            name, head, direction = picked.component, picked.group, picked.index
        rows = steer(
            _steered_run(module, batch),
            module.intervention,
            batch,
            name,
            head,
            direction,
            self.steer_factors,
            task=module.task,
        )
        blocks = module.blocks()[name]
        return {
            "component": name,
            "head": head,
            "direction": direction,
            **direction_block(blocks, head, direction),
            "n_examples": len(batch["answer_pos"]),
            "factors": rows,
        }

    def swap(self, module, batch: dict) -> dict | None:
        """Two-class tasks (GP): kept OV directions swapped toward the other class's mean coefficient."""
        names = [c.name for c in module.components if c.kind == "ov"]
        if not names:
            return None
        with torch.no_grad(), module.intervention.record(names, positions=batch["answer_pos"]) as coefficients:
            module.answer_logits(batch["clean_ids"], batch)
        hard = module.hard()
        out = swap_steer(
            _steered_run(module, batch),
            batch,
            dict(coefficients),
            {n: hard[n] for n in names},
            self.swap_counts,
            task=module.task,
        )
        if out is not None:
            blocks = module.blocks()
            for row in out["directions"]:
                row.update(direction_block(blocks[row["component"]], row["head"], row["direction"]))
        return out

    def figures(self, trainer, module, kept: dict) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        by_kind: dict[str, list[dict]] = {}
        for rec in kept["components"]:
            by_kind.setdefault(rec["kind"], []).append(rec)
        for kind, recs in by_kind.items():
            layers = sorted(r["layer"] for r in recs)
            groups = max(r["n_groups"] for r in recs)
            grid = np.full((len(layers), groups), np.nan)
            for r in recs:
                grid[layers.index(r["layer"]), : r["n_groups"]] = r["kept_per_group"]
            per_group = recs[0]["n_directions"] // recs[0]["n_groups"]
            fig, ax = plt.subplots(figsize=(1.2 + 0.45 * groups, 1.0 + 0.16 * len(layers)))
            im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=per_group)
            ax.set_xlabel(recs[0]["group"])
            ax.set_ylabel("layer")
            ax.set_yticks(range(0, len(layers), max(1, len(layers) // 10)))
            ax.set_yticklabels(layers[:: max(1, len(layers) // 10)])
            ax.set_title(f"kept {kind} directions (of {per_group})")
            fig.colorbar(im, ax=ax)
            save_figure(trainer, fig, f"masks_kept_{kind}")

    @staticmethod
    def blocks_figure(trainer, per_kind: dict, rel_gap: float) -> None:
        """``masks_blocks.png``: kept directions per kind, split into isolated, in blocks and past the rank."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        kinds = list(per_kind)
        fig, ax = plt.subplots(figsize=(1.5 + 0.9 * len(kinds), 3.0))
        bottom = [0] * len(kinds)
        for key, color in (("isolated", "tab:green"), ("in_blocks", "tab:orange"), ("past_rank", "tab:gray")):
            values = [per_kind[k][key] for k in kinds]
            ax.bar(kinds, values, bottom=bottom, color=color, label=key.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_ylabel("kept directions")
        ax.set_title(f"kept directions: isolated or in blocks (rel_gap {rel_gap:g})", fontsize=9)
        ax.legend(fontsize=7)
        save_figure(trainer, fig, "masks_blocks")


def _steered_run(module, batch: dict):
    """``run(scales, reference=None)``: answer-position logits of the clean prompts with ``scales``
    applied at the answer positions, patched toward ``reference`` (None scales: the unmodified model)."""

    @torch.no_grad()
    def run(scales: dict | None, reference: dict | None = None):
        if scales is None:
            return module.answer_logits(batch["clean_ids"], batch)
        with module.intervention.apply(scales, positions=batch["answer_pos"], reference=reference):
            return module.answer_logits(batch["clean_ids"], batch)

    return run


def _task_name(trainer) -> str | None:
    task = getattr(getattr(trainer, "datamodule", None), "task", None)
    return getattr(task, "name", None)


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}
