"""Singular-value spectra during training (``SpectrumCallback``).

Every ``every_n_steps`` optimiser steps (and at the start and the end of fit) the spectra of every head's
QK and OV circuits (factored, ``lit_svd.analysis.spectrum``) and of the MLP maps of the chosen layers are
computed from the live weights (no data). The weights are the same on every DDP rank, so rank zero alone
computes and logs them.

Tracked directions: the top ``track`` directions of every matrix at the first measurement are named
``d1, d2, ...`` (``d1``: sigma_1 then) and followed from measurement to measurement by matching each SVD to
the previous one (``lit_svd.analysis.tracking``: block-aware, |cos| of the joint singular vectors), so
``d2/sigma`` is the same direction's singular value at every step even when values cross; ``match_cos`` is
its |cos| to its predecessor (block members: the block's principal-angle cosine) and the counts say how
many kept their identity (``kept``), only as a block (``block``) or were replaced (``lost``, |cos| < 0.9).

TensorBoard: ``spectrum/<matrix>/layer<l>/head<h>/{effective_rank,top<k>_energy}`` (MLP maps:
``spectrum/<matrix>/layer<l>/...``), per tracked direction ``.../d<i>/{sigma,match_cos}`` (and
``block_sigma_min`` / ``block_sigma_max`` while it lies in a block), ``.../directions_{kept,block,lost}``,
the per-matrix means ``spectrum/<matrix>/mean_effective_rank``, and with ``figures`` the image
``spectrum/values`` (every spectrum of the step, log scale) at every measured step. At the end:
``results.json["spectrum"]`` (the history, each row with its ``tracked`` record), ``spectrum_training.png``
(mean effective rank per layer against the step), ``spectrum_tracked.png`` (tracked singular values and
the identity counts against the step) and, with ``figures``, ``spectrum_values.png`` (the last step's spectra).
"""

from __future__ import annotations

from lit_svd.analysis.spectrum import row_key, spectrum_rows
from lit_svd.analysis.tracking import MIN_COS, DirectionTrack, track_scalars
from lit_svd.callbacks.training import StepCallback, update_training_result
from lit_svd.figures.training import spectrum_history, spectrum_tracked, spectrum_values
from lit_svd.output import log_figure, log_scalars, save_figure


class SpectrumCallback(StepCallback):
    """Log the singular values, effective rank and top-k energy of every head's QK / OV and of the MLP maps.

    Args:
        every_n_steps: measure every this many optimiser steps (and at the start and the end).
        layers: layers to measure (null: every layer).
        top_k: the k of the top-k energy fraction.
        track: how many leading directions of each matrix to follow over the steps (0: none).
        min_cos: |cos| to its predecessor below which a tracked direction counts as a new one.
        figures: also log the spectrum image at every measured step and write the last one as
            spectrum_values.png (off by default: drawing it costs ~20x computing the spectra of the tiny LM;
            spectrum_training.png and spectrum_tracked.png are written either way).
        keep_values: keep the singular values themselves in results.json (else only the summaries).
        write_results: write the history into results.json and spectrum_training.png at the end of fit.
    """

    def __init__(
        self,
        every_n_steps: int = 250,
        layers: list[int] | None = None,
        top_k: int = 4,
        track: int = 4,
        min_cos: float = MIN_COS,
        figures: bool = False,
        keep_values: bool = True,
        write_results: bool = True,
    ):
        super().__init__(every_n_steps)
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k={top_k!r} must be a positive integer")
        if not isinstance(track, int) or track < 0:
            raise ValueError(f"track={track!r} must be an integer >= 0")
        DirectionTrack(None, min_cos=min_cos)  # checks min_cos
        self.layers = None if layers is None else [int(l) for l in layers]
        self.top_k, self.figures, self.keep_values, self.write = top_k, figures, keep_values, write_results
        self.track, self.min_cos = track, min_cos
        self.tracks: dict[tuple, DirectionTrack] = {}

    def measure(self, trainer, module) -> dict:
        if not trainer.is_global_zero:
            return {}
        view = module.view
        layers = list(range(view.n_layers)) if self.layers is None else [view.check_layer(l) for l in self.layers]
        svds: dict[tuple, object] = {}
        rows = spectrum_rows(view, layers, self.top_k, svds if self.track else None)
        step = trainer.global_step
        self.follow(rows, svds, step)
        log_scalars(trainer, scalars(rows, self.top_k), step)
        if self.figures:
            log_figure(trainer, spectrum_values(rows, step), "spectrum/values", step)
        if not self.keep_values:
            rows = [{k: v for k, v in r.items() if k != "S"} for r in rows]
        return {"rows": rows}

    def follow(self, rows: list[dict], svds: dict, step: int) -> None:
        """Match each row's SVD to its previous measurement and store the ``tracked`` record in the row."""
        for r in rows:
            key = row_key(r)
            if key in svds:
                track = self.tracks.setdefault(key, DirectionTrack(self.track, min_cos=self.min_cos))
                r["tracked"] = track.update(step, svds[key]).as_dict()

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if not self.write or not trainer.is_global_zero or not self.history:
            return
        section = {"top_k": self.top_k, "min_cos": self.min_cos, "figures": self.figures, "history": self.history}
        update_training_result(trainer, pl_module, spectrum=section)
        save_figure(trainer, spectrum_history(self.history), "spectrum_training")
        if "tracked" in self.history[-1]["rows"][0]:
            save_figure(trainer, spectrum_tracked(self.history, self.min_cos), "spectrum_tracked")
        if self.figures and "S" in self.history[-1]["rows"][0]:
            last = self.history[-1]
            save_figure(trainer, spectrum_values(last["rows"], last["step"]), "spectrum_values")


def tag(row: dict) -> str:
    head = "" if row["head"] is None else f"/head{row['head']}"
    return f"spectrum/{row['matrix']}/layer{row['layer']}{head}"


def scalars(rows: list[dict], top_k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    by_matrix: dict[str, list[float]] = {}
    for r in rows:
        if "tracked" in r:
            out.update(track_scalars(tag(r), _step(r["tracked"])))
        out[f"{tag(r)}/effective_rank"] = r["effective_rank"]
        out[f"{tag(r)}/top{top_k}_energy"] = r["top_k_energy"]
        by_matrix.setdefault(r["matrix"], []).append(r["effective_rank"])
    for m, v in by_matrix.items():
        out[f"spectrum/{m}/mean_effective_rank"] = sum(v) / len(v)
    return out


def _step(record: dict):
    from lit_svd.analysis.tracking import TrackStep

    return TrackStep(**{k: record[k] for k in TrackStep.__dataclass_fields__})
