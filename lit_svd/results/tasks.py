"""A model's clean and corrupted task metrics (``cli_tools evaluate``)."""

from __future__ import annotations

from dataclasses import dataclass

from lit_svd.results.base import Result, doc_field


@dataclass(kw_only=True, repr=False)
class EvaluateResult(Result):
    """Per task: the model's metrics on the test split's clean and corrupted prompts (``metrics.evaluate_task``)."""

    experiment = "evaluate"
    table_file = "tasks.csv"

    model: str = doc_field("the model")
    tasks: list[dict] = doc_field(
        "per task: task, model, n_test, seed, prepend_bos and evaluate_task's figures (clean / corrupt means)"
    )

    @property
    def headline(self) -> dict:
        """Per task: the metric (logit_diff, prob_diff for GT) and accuracy on clean prompts, the metric on corrupted
        ones."""
        out: dict = {}
        for t in self.tasks:
            metric = "logit_diff" if "logit_diff" in t else "prob_diff"
            for key in (metric, "accuracy", f"corrupt_{metric}"):
                if key in t:
                    out[f"{t['task']}_{key}"] = t[key]
        return out

    def rows(self) -> list[dict]:
        """One row per task: its scalar figures."""
        from lit_svd.results._rows import flat

        return [flat(t) for t in self.tasks]
