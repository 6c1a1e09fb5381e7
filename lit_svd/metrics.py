"""Task metrics at the answer position, as pure functions and as DDP-correct torchmetrics Metrics.

Every metric reads ``logits`` at the answer position, [B, V] (``answer_logits`` gathers them from a
[B, T, V] forward with the batch's ``answer_pos``), and the batch dict of
``lit_svd.datamodules.tasks``. Each Metric keeps a sum and a count (``dist_reduce_fx="sum"``), so the
value synced over DDP ranks is the mean over all examples of all ranks.

* ``LogitDifference``: logit[correct] - logit[wrong]   (IOI, GP)
* ``AnswerAccuracy``: argmax == correct                (IOI, GP)
* ``AnswerKL``: KL(p_reference || p_model) over the full vocabulary, nats per example
* ``GreaterThanProbDiff``: sum p[greater] - sum p[lesser]  (GT; sets defined in ``tasks``)

``python -m lit_svd.cli_tools evaluate --task ioi gp gt --n-test 256`` evaluates SmolLM2 on tasks and prints JSON.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection


def answer_logits(logits: Tensor, answer_pos: Tensor) -> Tensor:
    """[B, T, V] logits -> [B, V] at each example's answer position."""
    return logits[torch.arange(logits.shape[0], device=logits.device), answer_pos]


def forward_answer_logits(model, input_ids: Tensor, attention_mask: Tensor, answer_pos: Tensor) -> Tensor:
    """[B, V] logits of an HF causal LM at each example's answer position, computing the unembedding
    only at the distinct answer positions of the batch (``logits_to_keep``; the vocabulary projection
    dominates a short prompt's forward). Final-logit soft-capping and the like still apply, since the
    model's own forward does the projection."""
    positions = answer_pos.unique()  # sorted
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=positions).logits
    return logits[torch.arange(logits.shape[0], device=logits.device), torch.searchsorted(positions, answer_pos)]


def logit_diff(logits: Tensor, correct_id: Tensor, wrong_id: Tensor) -> Tensor:
    """[B]: logit of the correct answer minus logit of the wrong one."""
    return logits.gather(1, correct_id[:, None])[:, 0] - logits.gather(1, wrong_id[:, None])[:, 0]


def top1_correct(logits: Tensor, correct_id: Tensor) -> Tensor:
    """[B] float: 1 where the arg-max token is the correct answer."""
    return (logits.argmax(-1) == correct_id).float()


def kl_divergence(logits: Tensor, reference: Tensor) -> Tensor:
    """[B]: KL(softmax(reference) || softmax(logits)) in nats."""
    log_p_ref, log_p = reference.float().log_softmax(-1), logits.float().log_softmax(-1)
    return (log_p_ref.exp() * (log_p_ref - log_p)).sum(-1)


def gt_prob_diff(logits: Tensor, greater_mask: Tensor, lesser_mask: Tensor) -> Tensor:
    """[B]: probability on the greater answers minus probability on the at-or-below answers.

    Masks may be narrower than the logits (tokenizer vocabulary < model vocabulary): the extra
    logits count in the softmax but in neither set."""
    probs = logits.float().softmax(-1)[:, : greater_mask.shape[1]]
    return (probs * greater_mask).sum(-1) - (probs * lesser_mask).sum(-1)


class _MeanOverExamples(Metric):
    """Mean of a per-example value; sum and count are summed across DDP ranks."""

    full_state_update = False
    higher_is_better: bool | None = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _add(self, values: Tensor) -> None:
        if not torch.isfinite(values).all():
            raise ValueError(f"{type(self).__name__}: non-finite per-example values (the model produced NaN/inf)")
        self.total += values.double().sum()
        self.count += values.numel()

    def compute(self) -> Tensor:
        if self.count == 0:
            raise ValueError(f"{type(self).__name__}.compute() called before any update")
        return (self.total / self.count).float()


class LogitDifference(_MeanOverExamples):
    higher_is_better = True

    def update(self, logits: Tensor, batch: dict) -> None:
        self._add(logit_diff(logits, batch["correct_id"], batch["wrong_id"]))


class AnswerAccuracy(_MeanOverExamples):
    higher_is_better = True

    def update(self, logits: Tensor, batch: dict) -> None:
        self._add(top1_correct(logits, batch["correct_id"]))


class AnswerKL(_MeanOverExamples):
    higher_is_better = False

    def update(self, logits: Tensor, reference: Tensor) -> None:
        self._add(kl_divergence(logits, reference))


class GreaterThanProbDiff(_MeanOverExamples):
    higher_is_better = True

    def update(self, logits: Tensor, batch: dict) -> None:
        self._add(gt_prob_diff(logits, batch["greater_mask"], batch["lesser_mask"]))


def task_metrics(task: str, with_kl: bool = False) -> MetricCollection:
    """The metrics of ``task`` as one collection; call it with keywords
    ``(logits=..., batch=..., reference=...)`` (each metric takes the ones it needs)."""
    from lit_svd.datamodules.tasks import canonical_task

    key = canonical_task(task)
    metrics: dict[str, Metric] = (
        {"prob_diff": GreaterThanProbDiff()}
        if key == "gt"
        else {"logit_diff": LogitDifference(), "accuracy": AnswerAccuracy()}
    )
    if with_kl:
        metrics["kl"] = AnswerKL()
    return MetricCollection(metrics)


def main_value(task: str, logits: Tensor, batch: dict) -> Tensor:
    """[B]: the task's headline per-example value (GT probability difference, else logit difference)."""
    from lit_svd.datamodules.tasks import canonical_task

    if canonical_task(task) == "gt":
        return gt_prob_diff(logits, batch["greater_mask"], batch["lesser_mask"])
    return logit_diff(logits, batch["correct_id"], batch["wrong_id"])


@torch.no_grad()
def evaluate_task(
    model, loader, task: str, progress: bool = True, per_example: dict[str, list[Tensor]] | None = None
) -> dict[str, float]:
    """Run ``model`` (an HF causal LM) over ``loader``'s batches; return the task metrics on the clean
    prompts, the same on the corrupted prompts (``corrupt_*``, scored against the clean answers), and
    ``kl_clean_corrupt``, the mean KL(p_clean || p_corrupt) at the answer position. With a dict as
    ``per_example``, its lists ``"clean"`` / ``"corrupt"`` receive each batch's ``main_value``."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    clean, corrupt, shift = task_metrics(task).to(device), task_metrics(task).to(device), AnswerKL().to(device)
    for batch in tqdm(loader, desc=f"evaluate {task}", disable=not progress):
        batch = {k: v.to(device) for k, v in batch.items()}
        out = {}
        for kind in ("clean", "corrupt"):
            out[kind] = forward_answer_logits(model, batch[f"{kind}_ids"], batch["attention_mask"], batch["answer_pos"])
            if per_example is not None:
                per_example.setdefault(kind, []).append(main_value(task, out[kind], batch).cpu())
        clean.update(logits=out["clean"], batch=batch)
        corrupt.update(logits=out["corrupt"], batch=batch)
        shift.update(out["corrupt"], out["clean"])
    return {
        **{k: float(v) for k, v in clean.compute().items()},
        **{f"corrupt_{k}": float(v) for k, v in corrupt.compute().items()},
        "kl_clean_corrupt": float(shift.compute()),
    }
