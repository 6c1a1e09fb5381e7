"""Attribution patching for every direction of the faithfulness universe: EAP and EAP-IG, one backward per step.

The intervention's per-direction scales (``models.intervene``) move a direction's coefficient along its
corrupted-to-clean path, ``c' = c_ref + lambda (c - c_ref)`` (``c_ref``: the corrupted prompt's coefficient at
that position, ``c``: the live one). The attribution of direction ``k`` is the derivative of the summed task
metric ``m`` (``metrics.task_scorer``) with respect to its ``lambda_k``,

    d m / d lambda_k = sum over prompts, positions of (d m / d own') . (c_k - c_ref,k) v_k
                     = sum (g V)_k (c - c_ref)_k,

with ``g`` the gradient at the site's (modified) output: one backward gives it for every direction at once.
Divided by the number of prompts it is the attribution to the mean metric; positive when keeping the direction
clean raises the metric (an estimate of ``m(clean) - m(that direction patched)``).

**EAP** (``steps=1``): the derivative at the clean run (every ``lambda = 1``). **EAP-IG**: the mean of the
derivative over ``alpha = k / steps``, ``k = 1 .. steps`` (MIB's 5 steps and right-hand points by default; no
point at 0), along one of three paths (``path``):

* ``joint``: every attributed direction's ``lambda = alpha`` at once: every site writes
  ``own_ref + alpha (own - own_ref)``, ``own`` computed live from what reaches it (equal to the scales' form as
  ``own - own_ref`` lies in the span of ``V``); the integrand's ``c`` is the live coefficient at that step. Its sum
  over all directions tends to ``m(clean) - m(corrupt)`` as the steps grow (completeness along one path).
* ``layer``: one layer at a time: ``lambda = alpha`` for that layer's directions, 1 elsewhere; the layer's
  directions take the derivative of that run (``n_layers x steps`` backwards). Per node IG with the layer as node.
* ``inputs``: MIB's EAP-IG-inputs: the residual entering layer 0 interpolated,
  ``x_ref + alpha (x_clean - x_ref)``, everything downstream live; the derivative at that run times the fixed
  clean-minus-corrupted coefficient change.

**Units** (``unit_attributions``): a head's attribution is the sum over its ``ov`` directions, an MLP's over its
``mlp_out`` directions: ``sum_k (g V_k)(delta V_k) = g . delta`` because a head's (MLP's) output change lies in
the span of its ``V``, so this is exactly head-level attribution patching through the same path; head-level
EAP-IG interpolates only the writers (``kinds=("ov", "mlp_out")``: head and MLP outputs).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_svd.analysis.attribution import Attributions
from lit_svd.analysis.faithfulness import Universe, by_length, check_same_length
from lit_svd.analysis.faithfulness_options import IGPath
from lit_svd.choices import check_choice
from lit_svd.metrics import TaskScorer, forward_answer_logits, task_scorer
from lit_svd.models.hooks import Hook, first_input, hooks
from lit_svd.models.intervene import Component
from lit_svd.models.patching import CircuitPatch, Reference

WRITER_KINDS = ("ov", "mlp_out")  # head-level attribution: the head and MLP outputs


def alphas(steps: int) -> list[float]:
    """MIB's interpolation points ``k / steps``, ``k = 1 .. steps`` (``steps=1``: the clean run only, EAP)."""
    if steps < 1:
        raise ValueError(f"steps={steps}: give at least 1 (1 is plain EAP)")
    return [k / steps for k in range(1, steps + 1)]


def coefficient_gradient(c: Component, g: Tensor) -> Tensor:
    """``g V``: the gradient at the site output ``[..., d_out]`` as the gradient of each coefficient ``[..., G, K]``
    (``ov``: every head reads the same o-projection output)."""
    V = c.V
    g = g.to(V.dtype)
    if c.kind == "ov":
        return torch.einsum("...d,gdk->...gk", g, V)
    return torch.einsum("...gd,gdk->...gk", g.reshape(*g.shape[:-1], V.shape[0], -1), V)


@dataclass
class _Tap:
    """A hooked component for one backward: ``interpolate`` its output toward the reference by ``alpha``; keep its
    gradient and live source (``attribute``)."""

    component: Component
    interpolate: bool
    attribute: bool


def _step(
    patch: CircuitPatch,
    batch: dict,
    reference: Reference,
    taps: Sequence[_Tap],
    alpha: float,
    task: TaskScorer,
    embed_ref: Tensor | None = None,
) -> dict[str, tuple[Tensor, Tensor]]:
    """One forward + backward: ``{name: (g, src)}`` for the attributed taps, ``g`` the gradient of the summed metric
    at the site output, ``src`` the live coefficient source. ``embed_ref``: interpolate the residual entering
    layer 0 instead (the ``inputs`` path)."""
    view = patch.view
    store: dict[str, tuple[Tensor, Tensor]] = {}
    specs = []
    for tap in taps:
        c = tap.component
        key = (c.layer, c.site)
        module, read, write = patch.io[key]
        own_ref = reference.own[c.name]

        def hook(module, args, kwargs, out, tap=tap, c=c, read=read, write=write, own_ref=own_ref):
            own = read(out)
            new = torch.lerp(own_ref.to(own.dtype), own, alpha) if tap.interpolate else own
            if tap.attribute:
                if not new.requires_grad:  # nothing upstream is differentiated: the output is a leaf of its own
                    new = new.detach().requires_grad_()
                store[c.name] = (new, patch.source(c, args, kwargs, own).detach())
            return write(out, new)

        specs.append(Hook(module, hook, "post"))
    if embed_ref is not None:

        def pre(module, args, kwargs):
            x = first_input(args, kwargs)
            x = embed_ref.to(x.dtype) + alpha * (x - embed_ref.to(x.dtype))
            if args:
                return (x, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": x}

        specs.append(Hook(view.block(0), pre, "pre"))
    with torch.enable_grad(), hooks(*specs):
        logits = forward_answer_logits(view.model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])
        metric = task.metric(logits, batch).sum()
        names = list(store)
        grads = torch.autograd.grad(metric, [store[n][0] for n in names], allow_unused=True)
    return {n: (torch.zeros_like(store[n][0]) if g is None else g, store[n][1]) for n, g in zip(names, grads)}


@torch.no_grad()
def _record_embedding(patch: CircuitPatch, ids: Tensor, attention_mask: Tensor) -> Tensor:
    got: dict = {}

    def pre(module, args, kwargs):
        got["x"] = first_input(args, kwargs).detach()

    with hooks(Hook(patch.view.block(0), pre, "pre")):
        patch.view.model(input_ids=ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1)
    return got["x"]


def batch_integrands(
    patch: CircuitPatch,
    batch: dict,
    task: str | TaskScorer,
    points: Sequence[float],
    path: IGPath = "joint",
    names: Sequence[str] | None = None,
) -> list[dict[str, Tensor]]:
    """Per interpolation point ``alpha`` (``points``) and component (``names``: default every one of ``patch``) the
    derivative of the batch's summed metric with respect to each direction's scale along ``path`` ``[G, K]``,
    float64 (module docstring); at ``alpha = 1`` every path gives EAP."""
    check_choice("path", path, IGPath)
    check_same_length(batch)
    task = task_scorer(task)
    comps = [patch.components[n] for n in (names if names is not None else patch.components)]
    reference = patch.record(batch["corrupt_ids"], batch["attention_mask"])
    out = [{c.name: torch.zeros(c.shape, dtype=torch.float64) for c in comps} for _ in points]

    # positions after an example's answer cannot reach its metric (causal): their gradient is 0, so are their terms
    ids = batch["clean_ids"]
    read = torch.arange(ids.shape[1], device=ids.device) <= batch["answer_pos"].to(ids.device)[:, None]

    def accumulate(into: dict[str, Tensor], got: dict[str, tuple[Tensor, Tensor]], fixed: Reference | None) -> None:
        with torch.no_grad():
            for name, (g, src) in got.items():
                c = patch.components[name]
                clean = src if fixed is None else fixed.source(name)
                rows = read.to(g.device)
                dc = patch.delta_coefficients(c, clean[rows], reference.source(name)[rows])
                into[name] += (coefficient_gradient(c, g[rows]) * dc).sum(0).double().cpu()

    if path == "inputs":
        clean = patch.record(batch["clean_ids"], batch["attention_mask"])
        embed_ref = _record_embedding(patch, batch["corrupt_ids"], batch["attention_mask"])
        taps = [_Tap(c, interpolate=False, attribute=True) for c in comps]
        for i, a in enumerate(points):
            accumulate(out[i], _step(patch, batch, reference, taps, a, task, embed_ref=embed_ref), clean)
        return out
    groups = [comps] if path == "joint" else [[c for c in comps if c.layer == l] for l in _layers(comps)]
    for group in groups:
        taps = [_Tap(c, interpolate=True, attribute=True) for c in group]
        for i, a in enumerate(points):
            accumulate(out[i], _step(patch, batch, reference, taps, a, task), None)
    return out


def batch_direction_attributions(
    patch: CircuitPatch,
    batch: dict,
    task: str | TaskScorer,
    steps: int = 5,
    path: IGPath = "joint",
    names: Sequence[str] | None = None,
) -> dict[str, Tensor]:
    """Per component its directions' attributions ``[G, K]`` summed over the batch's prompts: the mean of
    ``batch_integrands`` over MIB's points ``alphas(steps)`` (``steps=1``: EAP)."""
    return mean_over_points(batch_integrands(patch, batch, task, alphas(steps), path, names))


def mean_over_points(per_point: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The mean over interpolation points of ``batch_integrands``' output (EAP-IG's Riemann sum over ``alphas``)."""
    return {name: torch.stack([p[name] for p in per_point]).mean(0) for name in per_point[0]}


def _layers(comps: Iterable[Component]) -> list[int]:
    return sorted({c.layer for c in comps})


@dataclass
class DirectionAttributions:
    """``scores: [N]`` float64 in the universe's flat order (NaN: a component that was not attributed), the
    attribution to the *mean* metric over ``prompts``; ``steps`` and ``path`` as computed."""

    scores: Tensor
    prompts: int
    steps: int
    path: str

    def add(self, other: DirectionAttributions) -> DirectionAttributions:
        total = self.prompts + other.prompts
        return DirectionAttributions(
            (self.scores * self.prompts + other.scores * other.prompts) / total, total, self.steps, self.path
        )


def direction_attributions(
    patch: CircuitPatch,
    universe: Universe,
    batches: Iterable[dict],
    task: str | TaskScorer,
    steps: int = 5,
    path: IGPath = "joint",
    kinds: Sequence[str] | None = None,
) -> DirectionAttributions:
    """``batch_direction_attributions`` over ``batches`` as the universe's flat ``[N]`` scores, prompt-weighted
    (the attribution to the mean metric). ``kinds``: only the components of these kinds are interpolated and
    attributed (default all; ``WRITER_KINDS`` for head-level EAP-IG); the others are NaN. The prompts are regrouped
    by length first (``faithfulness.by_length``: less padding)."""
    names = [c.name for c in universe.components if kinds is None or c.kind in kinds]
    if not names:
        raise ValueError(f"kinds={list(kinds or [])}: no component of the universe has these kinds")
    total: DirectionAttributions | None = None
    for batch in by_length(batches):
        sums = batch_direction_attributions(patch, batch, task, steps, path, names)
        n = len(batch["answer_pos"])
        got = DirectionAttributions(universe.flatten({k: v / n for k, v in sums.items()}), n, steps, path)
        total = got if total is None else total.add(got)
    if total is None:
        raise ValueError("direction attribution: no batches")
    return total


def unit_attributions(universe: Universe, scores: Tensor, n_layers: int, n_heads: int, prompts: int) -> Attributions:
    """Head and MLP attributions from direction attributions: a head's is the sum over its ``ov`` directions, an
    MLP layer's over its ``mlp_out`` directions (module docstring). Layers without those components get 0."""
    heads = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    mlps = torch.zeros(n_layers, dtype=torch.float64)
    per = universe.split(torch.nan_to_num(scores.double(), nan=0.0))
    for c in universe.components:
        if c.kind == "ov":
            heads[c.layer] = per[c.name].sum(1)
        elif c.kind == "mlp_out":
            mlps[c.layer] = per[c.name].sum()
    return Attributions(heads, mlps, prompts)
