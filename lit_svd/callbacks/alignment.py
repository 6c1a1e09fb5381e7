"""SVDAlignmentCallback: watches the toy head's Omega = W_Q^T W_K align with the template's feature pairs.

Every ``every_n_steps`` (and before the first step) it logs to TensorBoard, per instance:
``alignment/mean_abs_cos/<instance>`` (mean over pairs of |cos(w_i, u_k)| and |cos(w_j, v_k)|),
``alignment/mean_abs_cos`` (over instances), ``alignment/pair{p}_cos_query|key/<instance>`` (first pairs),
``spectrum/sigma_ratio/<instance>`` (sigma_1 / sigma_2), the tracked directions
``spectrum/d{k}/sigma/<instance>`` and ``spectrum/d{k}/match_cos/<instance>`` (k from 1), the counts
``spectrum/directions_{kept,block,lost}/<instance>``, and heatmap images ``heatmap/cos_W_U/<instance>``,
``heatmap/cos_W_V/<instance>`` (rows: features, columns: the tracked directions d1, d2, ...).

Tracked directions (``lit_svd.analysis.tracking``): ``d_k`` is the direction that held sigma_k at the first
logged step, followed from each logged step to the next by matching Omega's SVDs (block-aware, |cos| of the
joint singular vectors, signs fixed to the first step's), not the k-th largest value at each step: when two
singular values cross, ``d_k`` stays with its direction, and a heatmap column stays one direction.
``<instance>`` names the settings that differ between instances (``lambda=0.3,seed=2``; ``seed=0`` for one).
At the end of fit it writes ``results.json`` (keys in docs/toy.md) and PNG figures. Rank zero only.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from lit_svd.analysis.alignment import alignment_report, feature_singular_cosines, interference, theorem1_groups
from lit_svd.analysis.tracking import DirectionTrack, track_scalars
from lit_svd.callbacks.provenance import provenance
from lit_svd.figures import toy as figs
from lit_svd.linalg import SVD
from lit_svd.output import save_figures, write_result
from lit_svd.results.toy import ToyAlignmentResult


class SVDAlignmentCallback(Callback):
    """Logs the toy head's alignment with the template's feature pairs; writes results.json and figures.

    Args:
        every_n_steps: log interval in optimizer steps.
        heatmap_instances: how many instances (from 0) get heatmap images.
        pair_scalars: how many pairs (from the largest target) get their own scalar tags.
        spectrum_scalars: how many tracked directions (d1, d2, ...) get scalar tags.
    """

    def __init__(
        self, every_n_steps: int = 50, heatmap_instances: int = 2, pair_scalars: int = 4, spectrum_scalars: int = 4
    ):
        super().__init__()
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r}: must be a positive integer")
        for name, v in (
            ("heatmap_instances", heatmap_instances),
            ("pair_scalars", pair_scalars),
            ("spectrum_scalars", spectrum_scalars),
        ):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r}: must be an integer >= 0")
        self.every_n_steps, self.heatmap_instances = every_n_steps, heatmap_instances
        self.pair_scalars, self.spectrum_scalars = pair_scalars, spectrum_scalars
        self.history: list[tuple[int, list[float]]] = []
        self.progress_bar_metrics: dict[str, float] = {}  # read by lit_svd.progress.StepProgressBar
        self._last_step = -1
        self.tracks: list[DirectionTrack] = []  # one per instance
        self.tracked: list[dict] = []  # per logged step: {"step", "instances": [TrackStep dicts]}

    @staticmethod
    def report(module) -> list[dict]:
        W_Q, W_K = (w.float().cpu() for w in module.head_weights())
        return alignment_report(
            module.feature_directions(), W_Q, W_K, module.template.cpu(), module.pairs, frozen=module.frozen_features
        )

    def on_train_start(self, trainer: pl.Trainer, module) -> None:
        self.observe(trainer, module)

    def on_train_batch_end(self, trainer: pl.Trainer, module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self.observe(trainer, module)

    def observe(self, trainer: pl.Trainer, module) -> list[dict] | None:
        step = trainer.global_step
        if not trainer.is_global_zero or step == self._last_step:
            return None
        self._last_step = step
        reports = self.report(module)
        self.history.append((step, [r["mean_abs_cos"] for r in reports]))
        svd = module.omega_svd()
        steps = self.follow(step, svd)
        metrics = {"alignment/mean_abs_cos": sum(r["mean_abs_cos"] for r in reports) / len(reports)}
        self.progress_bar_metrics = {"alignment/mean_abs_cos": metrics["alignment/mean_abs_cos"]}
        for r, tag, tracked in zip(reports, instance_tags(module), steps):
            metrics[f"alignment/mean_abs_cos/{tag}"] = r["mean_abs_cos"]
            metrics[f"spectrum/sigma_ratio/{tag}"] = min(r["sigma_ratio"], 1e6)
            for p, m in enumerate(r["pairs"][: self.pair_scalars]):
                metrics[f"alignment/pair{p}_cos_query/{tag}"] = m["cos_query"]
                metrics[f"alignment/pair{p}_cos_key/{tag}"] = m["cos_key"]
            if self.spectrum_scalars:
                for key, v in track_scalars("spectrum", tracked).items():
                    metrics[f"{key}/{tag}"] = v
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        self.log_heatmaps(trainer, module, step, svd)
        return reports

    def follow(self, step: int, svd: SVD) -> list:
        """Match every instance's Omega SVD to its previous logged one; returns the ``TrackStep`` of each."""
        n = svd.S.shape[0]
        if not self.tracks:
            self.tracks = [DirectionTrack(self.spectrum_scalars or 1) for _ in range(n)]
        steps = [t.update(step, SVD(svd.U[i], svd.S[i], svd.V[i])) for i, t in enumerate(self.tracks)]
        self.tracked.append({"step": step, "instances": [s.as_dict() for s in steps]})
        return steps

    def log_heatmaps(self, trainer: pl.Trainer, module, step: int, svd: SVD) -> None:
        """Rendered heatmaps (features against the tracked directions d1, d2, ..., colour bar) as TensorBoard
        images; a column is the same direction at every step."""
        loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        if not loggers or self.heatmap_instances == 0:
            return
        n = min(self.heatmap_instances, module.n_instances)
        W = module.feature_directions()
        tags, labels = instance_tags(module), instance_labels(module)
        for i in range(n):
            aligned = self.tracks[i].aligned(SVD(svd.U[i], svd.S[i], svd.V[i]))
            cos_u, cos_v = feature_singular_cosines(W[i], aligned)
            for name, cos, side in (("cos_W_U", cos_u, "query"), ("cos_W_V", cos_v, "key")):
                fig = figs.heatmap(cos, side, module.pairs, f"{labels[i]}, step {step}", tracked=True)
                for lg in loggers:
                    lg.experiment.add_figure(f"heatmap/{name}/{tags[i]}", fig, global_step=step, close=False)

    def on_fit_end(self, trainer: pl.Trainer, module) -> None:
        if not trainer.is_global_zero:
            return
        self.observe(trainer, module)
        result = self.result(trainer, module)
        path = write_result(trainer, result)
        save_figures(trainer, figs.figures(result))
        print(f"[SVDAlignmentCallback] results: {path}")

    def result(self, trainer: pl.Trainer, module) -> ToyAlignmentResult:
        """The run's result (keys in docs/toy.md) from the module's final state and the logged history."""
        reports = self.report(module)
        dm = trainer.datamodule
        p = dm.p.tolist() if dm is not None and hasattr(dm, "p") else None
        targets = module.interference_targets
        W = module.feature_directions()
        instances = []
        for n, r in enumerate(reports):
            inst = {
                "index": n,
                "seed": module.seeds[n],
                "lambda": module.lambdas[n],
                "d_head": module.d_heads[n],
                "d_model": module.d_models[n],
                **({"p": p[n]} if p is not None else {}),
                **r,
                "interference_target": targets[n],
                # reached ||E_X||_2: as built (frozen) or of the learnt features at the end
                "interference": module.interference[n] if module.frozen_features else float(interference(W[n])),
            }
            instances.append(inst)
        headline = summarise(instances)
        headline["theorem1_groups"] = theorem1_groups(instances)
        cos_u, cos_v = feature_singular_cosines(W[:1], _first(module.omega_svd(), 1))
        return ToyAlignmentResult(
            global_step=trainer.global_step,
            n_instances=module.n_instances,
            frozen_features=module.frozen_features,
            template_pairs=[list(pr) for pr in module.pairs],
            overall=headline,
            history=[{"step": s, "mean_abs_cos": v} for s, v in self.history],
            tracked_directions=self.tracked,
            instances=instances,
            n_features=module.n_features,
            labels=instance_labels(module),
            heatmap_cos=[cos_u[0].tolist(), cos_v[0].tolist()],
            provenance=provenance(trainer, module),
        )


def _varying_settings(module) -> dict[str, list]:
    """The settings (seed, lambda, D, H, ||E_X||) that differ between the instances; the seed alone if none do."""
    settings = {
        "seed": module.seeds,
        "lambda": module.lambdas,
        "D": module.d_models,
        "H": module.d_heads,
        "||E_X||": getattr(module, "interference", None) if module.frozen_features else None,
    }
    varying = {k: v for k, v in settings.items() if v is not None and len(set(v)) > 1}
    return varying or {"seed": module.seeds}


def instance_labels(module) -> list[str]:
    """Each instance named by the settings that differ between instances, for legends (``lambda 0.3, seed 2``)."""
    varying = _varying_settings(module)
    return [", ".join(f"{k} {v[i]:.3g}" for k, v in varying.items()) for i in range(module.n_instances)]


def instance_tags(module) -> list[str]:
    """The same names as TensorBoard tag suffixes (``lambda=0.3,seed=2``); ``#i`` is added where two coincide."""
    varying = _varying_settings(module)
    tags = [",".join(f"{k}={v[i]:.3g}" for k, v in varying.items()) for i in range(module.n_instances)]
    return [t if tags.count(t) == 1 else f"{t}#{i}" for i, t in enumerate(tags)]


def _first(svd: SVD, n: int) -> SVD:
    """The first ``n`` instances of a batched SVD."""
    return SVD(svd.U[:n], svd.S[:n], svd.V[:n])


def summarise(instances: list[dict]) -> dict:
    """Ensemble-level figures: how many instances have every pair at |cos| >= 0.95 on both sides, etc."""

    def aligned(inst: dict, thr: float) -> bool:
        return all(m["cos_query"] >= thr and m["cos_key"] >= thr for m in inst["pairs"])

    out = {
        "n_instances": len(instances),
        "n_all_pairs_cos_ge_0.95": sum(aligned(i, 0.95) for i in instances),
        "n_all_pairs_cos_ge_0.9": sum(aligned(i, 0.9) for i in instances),
        "mean_abs_cos": sum(i["mean_abs_cos"] for i in instances) / len(instances),
        "min_sigma_ratio": min(i["sigma_ratio"] for i in instances),
        "n_distinct_indices": sum(i["distinct_indices"] for i in instances),
    }
    if "spearman_sigma_target" in instances[0]:
        out["min_spearman_sigma_target"] = min(i["spearman_sigma_target"] for i in instances)
    return out
