"""Head-level attribution patching (EAP at node granularity), written for grouped-query models.

The attribution of a head is the first-order estimate of what it contributes to the task metric against the
corrupted run: with ``m`` the mean task metric over the prompts (``metrics.task_scorer``),

    a(h) = sum over prompts, positions of  (d m / d head_out_h) . (head_out_h(clean) - head_out_h(corrupt))

and the same for each MLP layer with ``mlp_out``. ``head_out_h = z_h W_O[h]`` is what the query head writes
(``models.points``); it is taken after the key / value expansion, so it is one per *query* head whatever the
model's KV grouping (TransformerLens 4.3 refuses edge attribution on such models because its K / V inputs are
not per query head; node attribution needs no per-query-head K / V). Every head of a layer writes into the
same o-projection output, so ``d m / d head_out_h`` is the gradient at that output for every ``h``; the dot
product is computed as ``(grad W_O[h]^T) . (z_h(clean) - z_h(corrupt))``. ``a(h)`` estimates
``m(clean) - m(clean with h patched to its corrupted output)``: positive when the head supports the metric.

Cost: one forward on the corrupted prompts (no gradient), one forward on the clean prompts with a gradient
taken only at the o-projection and MLP-down outputs, one backward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_svd.metrics import TaskScorer, forward_answer_logits, task_scorer
from lit_svd.models.base import ModelView
from lit_svd.models.hooks import Hook, first_input, hooks
from lit_svd.models.points import ActivationCache, run_with_cache


@dataclass
class Attributions:
    """``heads: [n_layers, n_heads]`` and ``mlps: [n_layers]`` (float64, summed over prompts and divided by
    their number: the attribution to the *mean* metric), ``prompts``."""

    heads: Tensor
    mlps: Tensor
    prompts: int

    def add(self, other: Attributions) -> Attributions:
        total = self.prompts + other.prompts
        return Attributions(
            (self.heads * self.prompts + other.heads * other.prompts) / total,
            (self.mlps * self.prompts + other.mlps * other.prompts) / total,
            total,
        )


def _gradient_hook(view: ModelView, layer: int, site: str, store: dict) -> Hook:
    """A post hook on ``site``'s module (``o`` or ``down``) that keeps its input (``o``: ``z``) or output, and adds a
    zero tensor whose gradient is ``d metric / d site output``."""

    def hook(module, args, kwargs, out):
        own = view.site_output(layer, site, out)
        store[site, layer, "value"] = (first_input(args, kwargs) if site == "o" else own).detach()
        delta = torch.zeros_like(own, requires_grad=True)
        store[site, layer, "delta"] = delta
        return view.with_site_output(layer, site, out, own + delta)

    return Hook(view.site_module(layer, site), hook, "post")


def batch_attributions(view: ModelView, batch: dict, task: str | TaskScorer) -> Attributions:
    """The attributions of every head and MLP layer on one batch (module docstring)."""
    task = task_scorer(task)
    L, H = view.n_layers, view.n_heads
    if batch["clean_ids"].shape != batch["corrupt_ids"].shape:
        raise ValueError("attribution patching needs clean and corrupted prompts of the same token length")
    corrupt = run_with_cache(view, ["z", "mlp_out"], batch["corrupt_ids"], batch["attention_mask"])
    store: dict = {}
    specs = [_gradient_hook(view, l, site, store) for l in range(L) for site in ("o", "down")]
    with torch.enable_grad(), hooks(*specs):
        logits = forward_answer_logits(view.model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])
        metric = task.metric(logits, batch).sum()
        deltas = [store[site, l, "delta"] for l in range(L) for site in ("o", "down")]
        grads = torch.autograd.grad(metric, deltas)
    heads = torch.zeros(L, H, dtype=torch.float64)
    mlps = torch.zeros(L, dtype=torch.float64)
    with torch.no_grad():
        _reduce(view, grads, store, corrupt, heads, mlps)
    n = len(batch["answer_pos"])
    return Attributions(heads / n, mlps / n, n)


def _reduce(
    view: ModelView, grads: Sequence[Tensor], store: dict, corrupt: ActivationCache, heads: Tensor, mlps: Tensor
) -> None:
    """Fill ``heads [L, H]`` and ``mlps [L]`` with the sums over prompts and positions (module docstring)."""
    H, dh = view.n_heads, view.d_head
    for l in range(view.n_layers):
        g_o, g_down = grads[2 * l].double(), grads[2 * l + 1].double()
        z_clean = store["o", l, "value"].double().reshape(*g_o.shape[:-1], H, dh)
        diff = z_clean - corrupt["z", l].double()
        W_O = view.attn(l).W_O.to(device=g_o.device, dtype=torch.float64)  # [H, d_head, d_model]
        heads[l] = torch.einsum("btd,hcd,bthc->h", g_o, W_O, diff).cpu()
        mlps[l] = (g_down * (store["down", l, "value"].double() - corrupt["mlp_out", l].double())).sum().cpu()


def attributions(view: ModelView, batches: Iterable[dict], task: str | TaskScorer) -> Attributions:
    """``batch_attributions`` over ``batches``, weighted by their prompts (the attribution to the mean metric)."""
    total: Attributions | None = None
    for batch in batches:
        got = batch_attributions(view, batch, task)
        total = got if total is None else total.add(got)
    if total is None:
        raise ValueError("attribution patching: no batches")
    return total
