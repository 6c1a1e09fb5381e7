"""Task metrics at the answer position, as pure functions and as DDP-correct torchmetrics Metrics.

Every metric reads ``logits`` at the answer position, [B, V] (``answer_logits`` gathers them from a
[B, T, V] forward with the batch's ``answer_pos``), and the batch dict of
``lit_svd.datamodules.tasks``. Each Metric keeps a sum and a count (``dist_reduce_fx="sum"``), so the
value synced over DDP ranks is the mean over all examples of all ranks.

* ``LogitDifference``: logit[correct] - logit[wrong]   (IOI, GP)
* ``AnswerAccuracy``: argmax == correct                (IOI, GP)
* ``AnswerKL``: KL(p_reference || p_model) over the full vocabulary, nats per example
* ``GreaterThanProbDiff``: sum p[greater] - sum p[lesser]  (GT; sets defined in ``tasks``)

``task_scorer(task)`` is the one place that knows which of them a task uses (``TaskScorer``).

``python -m lit_svd.cli_tools evaluate --task ioi gp gt --n-test 256`` evaluates SmolLM2 on tasks and prints JSON.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection


def _upcast(x: Tensor) -> Tensor:
    """At least float32 (float64 stays float64)."""
    return x if x.dtype == torch.float64 else x.float()


def answer_logits(logits: Tensor, answer_pos: Tensor) -> Tensor:
    """[B, T, V] logits -> [B, V] at each example's answer position."""
    return logits[torch.arange(logits.shape[0], device=logits.device), answer_pos]


def forward_answer_logits(model, input_ids: Tensor, attention_mask: Tensor, answer_pos: Tensor) -> Tensor:
    """[B, V] logits of an HF causal LM at each example's answer position, computing the unembedding
    only at the batch's distinct answer positions (``logits_to_keep``) and there only at each example's own
    (a pre hook on the output embedding keeps one row per example): the vocabulary projection dominates a
    short prompt's forward. Final-logit soft-capping and the like still apply, since the model's own forward
    does the projection."""
    from lit_svd.models.hooks import Hook, first_input, hooks

    positions = answer_pos.unique()  # sorted
    own = torch.searchsorted(positions, answer_pos)

    def one_row_each(module, args, kwargs):
        hidden = first_input(args, kwargs)  # [B, len(positions), d_model]
        kept = hidden.gather(1, own.to(hidden.device)[:, None, None].expand(-1, 1, hidden.shape[-1]))
        return ((kept, *args[1:]), kwargs) if args else (args, {**kwargs, next(iter(kwargs)): kept})

    with hooks(Hook(model.get_output_embeddings(), one_row_each, "pre")):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=positions).logits
    return logits[:, 0]


def logit_diff(logits: Tensor, correct_id: Tensor, wrong_id: Tensor) -> Tensor:
    """[B]: logit of the correct answer minus logit of the wrong one."""
    return logits.gather(1, correct_id[:, None])[:, 0] - logits.gather(1, wrong_id[:, None])[:, 0]


def top1_correct(logits: Tensor, correct_id: Tensor) -> Tensor:
    """[B] float: 1 where the arg-max token is the correct answer."""
    return (logits.argmax(-1) == correct_id).float()


def kl_divergence(logits: Tensor, reference: Tensor) -> Tensor:
    """[B]: KL(softmax(reference) || softmax(logits)) in nats."""
    log_p_ref, log_p = _upcast(reference).log_softmax(-1), _upcast(logits).log_softmax(-1)
    return (log_p_ref.exp() * (log_p_ref - log_p)).sum(-1)


def gt_prob_diff(logits: Tensor, greater_mask: Tensor, lesser_mask: Tensor) -> Tensor:
    """[B]: probability on the greater answers minus probability on the at-or-below answers.

    Masks may be narrower than the logits (tokenizer vocabulary < model vocabulary): the extra
    logits count in the softmax but in neither set."""
    probs = _upcast(logits).softmax(-1)[:, : greater_mask.shape[1]]
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


class TaskScorer:
    """How one task scores logits at the answer position: the one place that knows a task's metric.

    ``metric(logits, batch) -> [B]`` (IOI / GP: logit difference correct - wrong; GT: probability difference
    greater - lesser), ``correct`` (IOI / GP: the arg-max is the answer; GT: metric > 0), ``scores`` (metric,
    correct, agreement and KL against a reference run), the logit ``columns`` the metric reads per prompt (None:
    it needs the whole softmax), ``logit_weights`` (the metric's gradient in the logits: a fixed signed one-hot
    pair for linear metrics) and ``metrics`` (DDP-correct torchmetrics). Get one with ``task_scorer(name)``.
    """

    name: str = ""
    metric_name: str = ""
    linear: bool = False  # the metric is a fixed linear function of the logits (per prompt)

    def metric(self, logits: Tensor, batch: dict) -> Tensor:
        raise NotImplementedError

    def correct(self, logits: Tensor, batch: dict) -> Tensor:
        raise NotImplementedError

    def scores(self, logits: Tensor, reference: Tensor, batch: dict) -> dict[str, Tensor]:
        """Per-example ``metric``, ``correct``, ``agree`` (same arg-max as ``reference``) and ``kl``
        (KL(reference || this))."""
        return {
            "metric": self.metric(logits, batch),
            "correct": self.correct(logits, batch),
            "agree": (logits.argmax(-1) == reference.argmax(-1)).float(),
            "kl": kl_divergence(logits, reference),
        }

    def columns(self, batch: dict) -> Tensor | None:
        """``[B, c]`` token ids whose logits the metric reads per prompt; None when it reads them all."""
        return None

    def column_metric(self, logits: Tensor, batch: dict, rows: Tensor) -> Tensor:
        """The metric of rows ``rows: [R]`` (prompt indices into ``batch``) from ``logits [R, c]`` at
        ``columns(batch)[rows]`` (or ``[R, V]``, all logits, when ``columns`` is None)."""
        return self.metric(logits, {k: v[rows] for k, v in batch.items() if isinstance(v, Tensor)})

    def logit_weights(self, logits: Tensor, batch: dict) -> Tensor:
        """``[B, V]``: d metric / d logit at ``logits`` (exact and independent of them for linear metrics)."""
        x = logits.detach().double().requires_grad_(True)
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(self.metric(x, batch).sum(), x)
        return grad.to(logits.dtype)

    def metrics(self, with_kl: bool = False) -> MetricCollection:
        """The task's metrics as one collection; call it with keywords ``(logits=..., batch=..., reference=...)``."""
        raise NotImplementedError


class LogitDiffScorer(TaskScorer):
    """IOI, GP: logit of the correct answer minus logit of the wrong one (``correct_id``, ``wrong_id``)."""

    metric_name, linear = "logit_diff", True

    def __init__(self, name: str):
        self.name = name

    def metric(self, logits, batch):
        return logit_diff(logits, batch["correct_id"], batch["wrong_id"])

    def correct(self, logits, batch):
        return top1_correct(logits, batch["correct_id"])

    def answer_ids(self, batch: dict) -> Tensor:
        return batch["correct_id"]

    def wrong_ids(self, batch: dict) -> Tensor:
        return batch["wrong_id"]

    def columns(self, batch):
        return torch.stack([batch["correct_id"], batch["wrong_id"]], -1)

    def column_metric(self, logits, batch, rows):
        return logits[:, 0] - logits[:, 1]

    def metrics(self, with_kl=False):
        out: dict[str, Metric] = {"logit_diff": LogitDifference(), "accuracy": AnswerAccuracy()}
        return MetricCollection({**out, **({"kl": AnswerKL()} if with_kl else {})})


class ProbDiffScorer(TaskScorer):
    """GT: probability on the greater answers minus on the at-or-below ones (``greater_mask``, ``lesser_mask``);
    ``correct``: that difference is positive."""

    name, metric_name = "gt", "prob_diff"

    def metric(self, logits, batch):
        return gt_prob_diff(logits, batch["greater_mask"], batch["lesser_mask"])

    def correct(self, logits, batch):
        return (self.metric(logits, batch) > 0).float()

    def metrics(self, with_kl=False):
        out: dict[str, Metric] = {"prob_diff": GreaterThanProbDiff()}
        return MetricCollection({**out, **({"kl": AnswerKL()} if with_kl else {})})


def task_scorer(task: str | TaskScorer) -> TaskScorer:
    """The scorer of ``task`` ("ioi", "gp", "gt" or an alias; a scorer is returned as it is)."""
    if isinstance(task, TaskScorer):
        return task
    from lit_svd.data_options import canonical_task

    key = canonical_task(task)
    return ProbDiffScorer() if key == "gt" else LogitDiffScorer(key)


@torch.no_grad()
def evaluate_task(
    model, loader, task: str, progress: bool = True, per_example: dict[str, list[Tensor]] | None = None
) -> dict[str, float]:
    """Run ``model`` (an HF causal LM) over ``loader``'s batches; return the task metrics on the clean
    prompts, the same on the corrupted prompts (``corrupt_*``, scored against the clean answers), and
    ``kl_clean_corrupt``, the mean KL(p_clean || p_corrupt) at the answer position. With a dict as
    ``per_example``, its lists ``"clean"`` / ``"corrupt"`` receive each batch's per-example task metric."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    scorer = task_scorer(task)
    clean, corrupt, shift = scorer.metrics().to(device), scorer.metrics().to(device), AnswerKL().to(device)
    for batch in tqdm(loader, desc=f"evaluate {task}", disable=not progress):
        batch = {k: v.to(device) for k, v in batch.items()}
        out = {}
        for kind in ("clean", "corrupt"):
            out[kind] = forward_answer_logits(model, batch[f"{kind}_ids"], batch["attention_mask"], batch["answer_pos"])
            if per_example is not None:
                per_example.setdefault(kind, []).append(scorer.metric(out[kind], batch).cpu())
        clean.update(logits=out["clean"], batch=batch)
        corrupt.update(logits=out["corrupt"], batch=batch)
        shift.update(out["corrupt"], out["clean"])
    return {
        **{k: float(v) for k, v in clean.compute().items()},
        **{f"corrupt_{k}": float(v) for k, v in corrupt.compute().items()},
        "kl_clean_corrupt": float(shift.compute()),
    }
