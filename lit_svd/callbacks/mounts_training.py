"""Tiled-SVD mount scores during training (``MountsCallback``).

Every ``every_n_steps`` optimiser steps (and at the start and the end of fit) the chosen site-layers of
the model being trained are mounted from their live weights and scored on a fixed held-out text batch
(``probe_path``, never the training text) with the same pure functions as the mounts ``test`` run
(``lit_svd.analysis.mounts``: ``plan_site``, ``site_sums``, ``summarize``, ``judge``): the lift of the
four strategies (tiled, whole, columns, random), the coverage sweep, the SVD identity and the pass checks
A1-A4 and B1; with ``steer`` also C1 (steering; else None at every layer, as the test run reports it for
layers below ``rules.c1_min_layer``), with ``null_control`` the same for each site-layer's structureless
null. Tile widths default to the test run's ``"scaled"``. Module paths only (no effective up / v maps: they
need a fit split of the probe).

Under DDP each rank scores its share of the probe windows (``i % world_size == rank``) and the token sums
are summed over ranks before ``summarize``, so two processes give one process's numbers.

TensorBoard: ``mounts/<site>/layer<l>/<stat>`` (stat: ``lift_<strategy>``, ``lift_tiled_minus_random``,
``coverage_lift/modes=<m>``, ``identity_rel_err``, ``pass``; ``steer_rho`` with ``steer``; ``null/lift_tiled``,
``null/pass`` with ``null_control``), ``mounts/pass_fraction`` and, with ``figures``, the image
``mounts/depth`` (lift per strategy against depth, one panel per site) at every measured step. At the end
(rank zero): ``results.json["mounts_training"]`` (the settings and the history), ``mounts_training.png`` and,
with ``figures``, ``mounts_depth.png``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lit_svd.analysis import mounts as M
from lit_svd.callbacks.training import StepCallback, all_reduce_sum, held_out_probe, update_training_result
from lit_svd.datamodules.common import rank_and_world
from lit_svd.figures.training import mounts_depth, mounts_history
from lit_svd.modules.mounts_training import score_site_layers
from lit_svd.output import log_figure, log_scalars, save_figure


class MountsCallback(StepCallback):
    """Score tiled-SVD mounts of chosen site-layers on a held-out batch while a language model trains.

    Args:
        probe_path: held-out text file scored (never the training text; e.g. WikiText-2 test.txt when
            training on valid.txt).
        every_n_steps: measure every this many optimiser steps (and at the start and the end).
        sites: linear sites among q, k, v, o, gate, up, down.
        layers: layers to score (null: every layer).
        probe_windows: windows of the probe text (the first ones of the file).
        probe_seq_len: tokens per probe window.
        tile_widths: column-tile width per site: "scaled" (default, as the mounts test run: the paper's number
            of tiles for this model's input sizes, ``analysis.mounts.scaled_tile_width``), "fixed" (the paper's
            absolute widths) or a dict of widths per site.
        modes_per_tile: singular modes kept per tile (k).
        modes_sweep: mode counts of the coverage sweep.
        k_active: atoms per token in the coverage score.
        seed: seeds column sampling, random mounts and random dictionaries, as the test run.
        rules: thresholds of the pass rule (null: the paper's values).
        null_control: also score each site-layer's structureless null (its singular values, Haar-random
            singular vectors; the test run's seeds) by the same rules (``row["null"]``; ~2x the compute).
        steer: also check C1 (steering) on o / down at layers >= ``rules.c1_min_layer``: the ``steer_mounts``
            tiled mounts of highest tile-local lift are added (``steer_alpha``) at the last token of the first
            ``steer_texts`` probe windows cut to ``steer_tokens`` tokens, as the test run's ``"last"`` mode
            (off by default: one extra forward per mount and site-layer; C1 is None without it).
        steer_alpha: steering strength alpha (u added with alpha times the residual norm scale), as the test run.
        steer_mounts: tiled mounts of highest tile-local lift steered per residual site-layer.
        steer_texts: probe windows used for steering (the first ones).
        steer_tokens: tokens of each steering window (its prefix is cached; the last token is steered).
        figures: also log the depth figure at every measured step and write the last one as mounts_depth.png
            (off by default: drawing it costs about as much as the measurement; mounts_training.png is written
            either way).
        write_results: write the history into results.json and mounts_training.png at the end of fit.
    """

    def __init__(
        self,
        probe_path: str,
        every_n_steps: int = 250,
        sites: list[str] = ("o", "down"),
        layers: list[int] | None = None,
        probe_windows: int = 8,
        probe_seq_len: int = 64,
        tile_widths: dict[str, int] | Literal["scaled", "fixed"] = "scaled",
        modes_per_tile: int = 2,
        modes_sweep: list[int] = (1, 2, 4, 8),
        k_active: int = 8,
        seed: int = 0,
        rules: dict | None = None,
        null_control: bool = False,
        steer: bool = False,
        steer_alpha: float = 2.0,
        steer_mounts: int = 8,
        steer_texts: int = 8,
        steer_tokens: int = 32,
        figures: bool = False,
        write_results: bool = True,
    ):
        super().__init__(every_n_steps)
        for key, value in (
            ("probe_windows", probe_windows),
            ("probe_seq_len", probe_seq_len),
            ("steer_mounts", steer_mounts),
            ("steer_texts", steer_texts),
            ("steer_tokens", steer_tokens),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r} must be a positive integer")
        if steer and steer_tokens < 2:
            raise ValueError(f"steer_tokens={steer_tokens!r} must be >= 2 (a prefix and the steered last token)")
        M.tile_widths_for(tile_widths, {})  # checks the value
        self.probe_path, self.sites = probe_path, list(sites)
        self.layers = None if layers is None else [int(l) for l in layers]
        self.probe_windows, self.probe_seq_len = probe_windows, probe_seq_len
        self.tile_widths = tile_widths
        self.modes, self.sweep, self.k_active, self.seed = modes_per_tile, list(modes_sweep), k_active, seed
        rules = M.MountRules.from_dict(rules)
        # without steering C1 is not evaluated (None) at any layer, instead of failing for want of a steer
        self.rules = rules if steer else dataclasses.replace(rules, c1_min_layer=math.inf)
        self.null_control, self.steer = null_control, steer
        self.steer_args = {"alpha": steer_alpha, "mounts": steer_mounts, "texts": steer_texts, "tokens": steer_tokens}
        self.figures, self.write = figures, write_results
        self.probe = None

    def keys(self, view) -> list[tuple[int, str]]:
        layers = list(range(view.n_layers)) if self.layers is None else [view.check_layer(l) for l in self.layers]
        return [(l, view.check_site(s)) for l in layers for s in self.sites]

    def widths(self, view) -> dict[str, int]:
        return M.tile_widths_for(self.tile_widths, {s: view.site_weight(0, s)[0].shape[0] for s in self.sites})

    def measure(self, trainer, module) -> dict:
        if not hasattr(module, "view") or getattr(module, "lm", None) is None:
            raise ValueError("MountsCallback needs a module with a language model (.lm) and its view (.view)")
        if self.probe is None:
            self.probe = held_out_probe(trainer, module, self.probe_path, self.probe_windows, self.probe_seq_len)
        rank, size = rank_and_world(trainer)
        ids, mask = (t[rank::size].to(module.device) for t in self.probe)
        view = module.view
        steer = None
        if self.steer:  # the same texts on every rank (the first windows), as the test run
            a = self.steer_args
            texts = self.probe[0][: a["texts"], : a["tokens"]].to(module.device)
            steer = {"texts": texts, "alpha": a["alpha"], "mounts": a["mounts"]}
        rows = score_site_layers(
            view,
            module.lm,
            ids,
            mask,
            self.keys(view),
            self.widths(view),
            self.modes,
            self.sweep,
            self.k_active,
            self.seed,
            self.rules,
            all_reduce_sum,
            self.null_control,
            steer,
        )
        step = trainer.global_step
        log_scalars(trainer, scalars(rows), step)
        if self.figures and trainer.is_global_zero:
            log_figure(trainer, mounts_depth(rows, step), "mounts/depth", step)
        return {"rows": rows, "pass_fraction": sum(r["pass"] for r in rows) / len(rows)}

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if not self.write or not trainer.is_global_zero or not self.history:
            return
        view = pl_module.view
        section = {
            "probe_path": self.probe_path,
            "probe_windows": self.probe_windows,
            "probe_seq_len": self.probe_seq_len,
            "tile_widths": self.widths(view),
            "modes_per_tile": self.modes,
            "modes_sweep": self.sweep,
            "k_active": self.k_active,
            "seed": self.seed,
            "null_control": self.null_control,
            "steer": self.steer,
            "figures": self.figures,
            "history": self.history,
        }
        update_training_result(trainer, pl_module, mounts_training=section)
        save_figure(trainer, mounts_history(self.history), "mounts_training")
        if self.figures:
            save_figure(trainer, mounts_depth(self.history[-1]["rows"], self.history[-1]["step"]), "mounts_depth")


def scalars(rows: list[dict]) -> dict[str, float]:
    """TensorBoard scalars of one measurement, tagged ``mounts/<site>/layer<l>/<stat>``."""
    out = {"mounts/pass_fraction": sum(r["pass"] for r in rows) / len(rows)}
    for r in rows:
        tag = f"mounts/{r['site']}/layer{r['layer']}"
        for s in M.STRATEGIES:
            out[f"{tag}/lift_{s}"] = r[f"lift_{s}"]
        out[f"{tag}/lift_tiled_minus_random"] = r["lift_tiled"] - r["lift_random"]
        for m, c in zip(r["coverage_modes"], r["coverage_lift"]):
            out[f"{tag}/coverage_lift/modes={m}"] = c
        out[f"{tag}/identity_rel_err"] = r["identity_rel_err"]
        out[f"{tag}/pass"] = float(r["pass"])
        if r.get("steer_rho") is not None:
            out[f"{tag}/steer_rho"] = r["steer_rho"]
        if "null" in r:
            out[f"{tag}/null/lift_tiled"] = r["null"]["lift_tiled"]
            out[f"{tag}/null/lift_tiled_minus_random"] = r["null"]["lift_tiled"] - r["null"]["lift_random"]
            out[f"{tag}/null/pass"] = float(r["null"]["pass"])
    return out
