"""FaithfulnessReport: the curves of ``FaithfulnessModule`` written into the run folder.

After ``test`` (rank zero): ``results.json`` (``lit_svd.results.FaithfulnessResult``, experiment ``faithfulness``),
``faithfulness.csv`` (one row per method, ranking, size axis and size) and ``faithfulness_curves.png`` (also a
TensorBoard image). It reads the module's rows only (``faithfulness``, ``summary``); it never runs the model.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from lit_svd.callbacks.provenance import provenance
from lit_svd.figures.faithfulness import figures
from lit_svd.output import save_figures, write_result
from lit_svd.results.faithfulness import FaithfulnessResult


class FaithfulnessReport(Callback):
    """Writes the faithfulness curves of ``FaithfulnessModule`` after ``test`` (see the module docstring)."""

    def on_test_end(self, trainer, module) -> None:
        s, hp = module.summary, module.hparams
        result = FaithfulnessResult(
            task=module.task,
            model=module.model_name,
            n_prompts=s["n_prompts"],
            n_directions=s["n_directions"],
            m_full=s["m_full"],
            m_empty=s["m_empty"],
            faithfulness=module.faithfulness,
            random=s.get("random"),
            vs_heads=s.get("vs_heads"),
            intervals=intervals(s),
            rankings=s["rankings"],
            mask_run=hp.mask_run,
            graph_run=hp.graph_run,
            wall_s=s["wall_s"],
            provenance=provenance(trainer, module),
        )
        write_result(trainer, result)
        if trainer.is_global_zero:
            save_figures(trainer, figures(result))


def intervals(summary: dict) -> dict | None:
    """What the bootstrap intervals are, with the per-prompt ends and the prompts' order (None: no intervals)."""
    about = summary.get("intervals")
    if about is None:
        return None
    return {**about, **{k: summary[k] for k in ("prompt_full", "prompt_empty", "prompt_index") if k in summary}}
