"""Directional circuits as pure functions: masks over components' singular directions, the loss, kept
counts, logit receptors and steering. The component SVDs and the masked forward live in
``lit_svd.models.intervene``; nothing here touches Lightning.

A mask is one logit ``theta`` per direction, ``lambda = sigmoid(theta)``; a direction is *kept* when
``lambda >= threshold`` (default 1e-3, as the paper), and the *hard* mask is that indicator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lit_svd.addresses import Address
from lit_svd.analysis.blocks import component_blocks, direction_block
from lit_svd.linalg import REL_GAP
from lit_svd.metrics import TaskScorer, kl_divergence, task_scorer
from lit_svd.models.base import ModelView, PostNormPoint
from lit_svd.models.intervene import Component, Intervention

QK_KINDS = ("qk", "q", "k")  # the attention-pattern maps; "without_qk" counts the rest (OV, MLP)


def initial_logits(components: Sequence[Component], init: float) -> dict[str, Tensor]:
    """``theta`` with ``sigmoid(theta) = init`` for every direction."""
    value = math.log(init / (1 - init))
    return {c.name: torch.full(c.shape, value) for c in components}


def hard_masks(lambdas: dict[str, Tensor], threshold: float) -> dict[str, Tensor]:
    """The binarised masks: 1 where ``lambda >= threshold``, else 0."""
    return {n: (lam >= threshold).to(lam.dtype) for n, lam in lambdas.items()}


def l1(lambdas: dict[str, Tensor]) -> Float[Tensor, ""]:
    total = sum(lam.sum() for lam in lambdas.values())
    assert isinstance(total, Tensor), "no mask values"  # sum() starts from 0
    return total


def mask_loss(
    masked_logits: Float[Tensor, "batch vocab"],
    full_logits: Float[Tensor, "batch vocab"],
    lambdas: dict[str, Tensor],
    alpha: float,
) -> tuple[Float[Tensor, ""], Float[Tensor, ""], Float[Tensor, ""]]:
    """``(loss, kl, l1)``: KL(p_full || p_masked) at the answer position (mean over the batch, full
    vocabulary) + ``alpha * sum(lambda)``."""
    kl = kl_divergence(masked_logits, full_logits).mean()
    total = l1(lambdas)
    return kl + alpha * total, kl, total


def metric_distance(
    masked: Float[Tensor, " batch"], full: Float[Tensor, " batch"], corrupt: Float[Tensor, " batch"]
) -> Float[Tensor, ""]:
    """Mean over the batch of ``((m_masked - m_full) / gap)^2``, ``m`` the task metric and ``gap = |mean(m_full -
    m_corrupt)|`` the batch's clean-corrupted gap (no gradient): 0 for the full model, about 1 for the empty circuit
    under patching, whatever the task's scale."""
    gap = (full - corrupt).mean().abs().detach().clamp_min(1e-6)
    return ((masked - full.detach()) / gap).square().mean()


def alpha_at(alpha: float, alpha_final: float | None, step: int, max_steps: int) -> float:
    """The L1 weight at optimiser step ``step``: ``alpha`` throughout (``alpha_final`` None), else raised (or lowered)
    geometrically from ``alpha`` at step 0 to ``alpha_final`` at ``max_steps``, held there after."""
    if alpha_final is None:
        return alpha
    t = min(max(step / max(max_steps, 1), 0.0), 1.0)
    return alpha * (alpha_final / alpha) ** t


def kept_report(components: Sequence[Component], lambdas: dict[str, Tensor], threshold: float) -> dict:
    """Kept counts overall, per component type, per component (per group: head, KV head, layer), and
    ``without_qk``: over OV and MLP directions only (the q / k or qk maps left out)."""
    per_kind: dict[str, dict[str, float]] = {}
    records = []
    n_total = kept_total = 0
    for c in components:
        keep = lambdas[c.name].detach() >= threshold  # [G, K]
        kept = int(keep.sum())
        n_total += c.n_directions
        kept_total += kept
        slot = per_kind.setdefault(c.kind, {"n_directions": 0, "kept": 0})
        slot["n_directions"] += c.n_directions
        slot["kept"] += kept
        records.append(
            {
                "name": c.name,
                "kind": c.kind,
                "layer": c.layer,
                "group": c.group,
                "n_groups": c.shape[0],
                "n_directions": c.n_directions,
                "kept": kept,
                "kept_per_group": keep.sum(-1).tolist(),
            }
        )
    for slot in per_kind.values():
        slot["kept_fraction"] = slot["kept"] / max(slot["n_directions"], 1)
    rest = [v for k, v in per_kind.items() if k not in QK_KINDS]
    n_rest, kept_rest = sum(v["n_directions"] for v in rest), sum(v["kept"] for v in rest)
    return {
        "n_directions": n_total,
        "kept": kept_total,
        "kept_fraction": kept_total / max(n_total, 1),
        "per_kind": per_kind,
        "components": records,
        "without_qk": {"n_directions": n_rest, "kept": kept_rest, "kept_fraction": kept_rest / max(n_rest, 1)},
    }


def most_effective_direction(
    metric_of: Callable[[dict[str, Tensor]], Tensor], hard: dict[str, Tensor], names: Sequence[str]
) -> Address | None:
    """The kept direction of components ``names`` with the largest ``|d metric / d scale|`` at the hard
    masks (first order, one backward pass). ``metric_of(scales)`` is the scalar task metric of a forward
    with ``scales``. Returns its address; None without candidates."""
    if not names:
        return None
    scales = {n: h.clone().requires_grad_(n in names) for n, h in hard.items()}
    with torch.enable_grad():
        grads = torch.autograd.grad(metric_of(scales), [scales[n] for n in names])
    best, best_val = None, 0.0
    for n, g in zip(names, grads):
        score = g.abs() * hard[n]
        val = float(score.max())
        if val > best_val:
            idx = int(score.argmax())
            layer, kind = n.split(".", 1)
            best, best_val = Address(int(layer[1:]), kind, idx // score.shape[1], idx % score.shape[1]), val
    return best


@torch.no_grad()
def write_readings(
    view: ModelView, point: PostNormPoint, layer: int, V: Float[Tensor, "n d_model"]
) -> Float[Tensor, "n vocab"]:
    """``[n, vocab]``: how the unembedding reads directions ``V: [n, d_model]`` written by the attention
    (``point="attn"``) or MLP (``"mlp"``) of ``layer``: through what follows the write in the model (Gemma's
    post-attention / post-feed-forward norm, ``view.post_norm``), then the final norm and ``W_U``."""
    W_U, _ = view.unembed()
    written = view.post_norm(point, layer, V.to(W_U.dtype))
    return view.normalized("final", None, written) @ W_U


@torch.no_grad()
def logit_receptors(
    view: ModelView,
    component: Component,
    keep: Tensor,
    tokenizer: PreTrainedTokenizerBase,
    top_k: int = 8,
    *,
    rel_gap: float = REL_GAP,
) -> list[dict]:
    """For each kept OV direction, its write direction ``v_k`` read through what follows it (``write_readings``:
    Gemma's post-attention norm, the final norm, the unembedding): the ``top_k`` tokens it promotes (``+v``)
    and those it promotes with the opposite sign (``-v``). (The norms' gains and centring are applied; their
    data-dependent RMS only rescales.) Each row carries its block fields at ``rel_gap``
    (``analysis.blocks.direction_block``): inside a block the single ``v_k`` is arbitrary."""
    if component.kind != "ov":
        raise ValueError(f"logit receptors are read from OV components; got {component.kind!r}")
    out: list[dict] = []
    heads, dirs = torch.nonzero(keep, as_tuple=True)
    if len(heads) == 0:
        return out
    logits = write_readings(view, "attn", component.layer, component.V[heads, :, dirs])  # [n, vocab]
    pos, neg = logits.topk(top_k, dim=-1).indices, (-logits).topk(top_k, dim=-1).indices
    blocks = component_blocks(component, rel_gap)
    for i, (h, k) in enumerate(zip(heads.tolist(), dirs.tolist())):
        out.append(
            {
                "layer": component.layer,
                "head": h,
                "direction": k,
                "sigma": float(component.S[h, k]),
                **direction_block(blocks, h, k),
                "promotes": [tokenizer.decode([t]) for t in pos[i].tolist()],
                "promotes_negative": [tokenizer.decode([t]) for t in neg[i].tolist()],
            }
        )
    return out


@torch.no_grad()
def steer(
    run: Callable[[dict | None], Tensor],
    intervention: Intervention,
    batch: dict,
    name: str,
    group: int,
    direction: int,
    factors: Sequence[float],
    base_scales: dict[str, Tensor] | None = None,
    *,
    task: str | TaskScorer,
) -> list[dict]:
    """Scale one direction's coefficient at the answer position by each factor and report the task
    metric (``task``: its name or ``metrics.TaskScorer``). ``run(scales)`` returns answer-position logits
    ``[B, V]`` with ``scales`` applied at the answer positions (None: the unmodified model). ``flipped``: fraction
    of examples whose preferred answer (correct vs wrong; GT: greater vs lesser) changes against the unmodified
    model."""
    comp = intervention.components[name]
    task = task_scorer(task)
    base = run(None)
    base_scores = task.scores(base, base, batch)
    rows = []
    for factor in factors:
        scales = {k: v.clone() for k, v in (base_scales or {}).items()}
        lam = scales.get(name, torch.ones(comp.shape, device=comp.S.device)).clone()
        lam[group, direction] = factor
        scales[name] = lam
        rows.append({"factor": float(factor), **_effect(run(scales), base, base_scores, batch, task)})
    return rows


def _effect(
    logits: Tensor, base: Tensor, base_scores: dict[str, Tensor], batch: dict, task: TaskScorer
) -> dict[str, float]:
    """A steered run against the unmodified one: mean task metric, its change, the fraction of examples
    whose preferred answer flips, and the KL from the unmodified model."""
    scores = task.scores(logits, base, batch)
    return {
        "metric": float(scores["metric"].mean()),
        "metric_change": float((scores["metric"] - base_scores["metric"]).mean()),
        "flipped": float(((scores["metric"] > 0) != (base_scores["metric"] > 0)).float().mean()),
        "kl": float(scores["kl"].mean()),
    }


@torch.no_grad()
def swap_steer(
    run: Callable[[dict | None, dict | None], Tensor],
    batch: dict,
    coefficients: dict[str, Tensor],
    keep: dict[str, Tensor],
    counts: Sequence[int] = (1, 2, 4, 8),
    *,
    task: str | TaskScorer,
) -> dict | None:
    """Swap the coefficients of the most class-separating kept directions toward the other class's mean.

    For a two-class task (the batch's ``correct_id`` takes two values, e.g. he / she on GP), each kept
    direction of ``coefficients`` (``[B, G, K]`` at the answer position, recorded on the clean prompts)
    is ranked by its separation ``|mean_a - mean_b| / pooled std``; for each ``n`` in ``counts`` the top
    ``n`` are set to the other class's mean (``run(scales, reference)`` patches toward ``reference``
    where a scale is 0). Reports per ``n`` the task metric, its change and the fraction of examples
    whose preferred answer flips. None if the batch is not two-class."""
    if "correct_id" not in batch or len(classes := batch["correct_id"].unique().tolist()) != 2:
        return None
    in_a = batch["correct_id"] == classes[0]
    ranked = []
    for name, coef in coefficients.items():
        a, b = coef[in_a], coef[~in_a]
        spread = ((a.var(0, unbiased=False) * len(a) + b.var(0, unbiased=False) * len(b)) / len(coef)).sqrt()
        sep = ((a.mean(0) - b.mean(0)).abs() / (spread + 1e-6)) * keep[name]
        layer, kind = name.split(".", 1)
        for g, k in zip(*torch.nonzero(sep, as_tuple=True)):
            ranked.append((float(sep[g, k]), Address(int(layer[1:]), kind, int(g), int(k))))
    ranked.sort(key=lambda r: (r[0], r[1].component, r[1].group, r[1].index), reverse=True)
    task = task_scorer(task)
    base = run(None, None)
    base_scores = task.scores(base, base, batch)
    rows = []
    for n in [n for n in counts if n <= len(ranked)]:
        scales, reference = {}, {}
        for _, addr in ranked[:n]:
            name, g, k = addr.component, addr.group, addr.index
            coef = coefficients[name]
            if name not in scales:
                scales[name] = torch.ones(coef.shape[1:], device=coef.device)
                reference[name] = coef.clone()
            other = torch.where(in_a, coef[~in_a, g, k].mean(), coef[in_a, g, k].mean())
            scales[name][g, k] = 0.0
            reference[name][:, g, k] = other
        rows.append({"n_directions": n, **_effect(run(scales, reference), base, base_scores, batch, task)})
    return {
        "classes": classes,
        "directions": [
            {"component": a.component, "head": a.group, "direction": a.index, "separation": s}
            for s, a in ranked[: max(counts)]
        ],
        "swaps": rows,
    }
