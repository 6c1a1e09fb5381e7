"""Many variants of the last token of a batch of prompts, fanned out from one layer on a shared prefix.

A change made only at the last position of a prompt at layer ``L`` (e.g. one direction patched at the
answer position) leaves every earlier position and every layer below ``L`` as they were. So the prefix
(all but the last token) runs once with a KV cache, the last token runs once through layers ``< L``, and a
pre-hook on block ``L`` repeats its hidden state ``copies`` times along the batch: only the layers from ``L``
on run per variant, one token each. Rows come out prompt-major (prompt ``i``, copy ``j`` at ``i * copies + j``).

The prompts of one call must have the same length (no padding): group them by ``answer_pos`` first.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lit_svd.models.base import HFModule, ModelView
from lit_svd.models.hooks import Hook, capture, first_input, hooks


@torch.no_grad()
def prefix_cache(
    view: ModelView, ids: Int[Tensor, "n T"]
) -> list[tuple[Float[Tensor, "n kv_heads T-1 d_head"], Float[Tensor, "n kv_heads T-1 d_head"]]]:
    """Per layer the ``(keys, values)`` of the prompts ``ids: [n, T]`` without their last token."""
    out = view.model(input_ids=ids[:, :-1], use_cache=True)
    return [(layer.keys, layer.values) for layer in returned_cache(out).layers]


def _cache(view: ModelView, prefix: list[tuple[Tensor, Tensor]], layer: int, copies: int) -> Any:  # a DynamicCache
    """A fresh cache holding ``prefix``, repeated ``copies`` times along the batch from ``layer`` on."""
    from transformers import DynamicCache

    cache = DynamicCache(config=view.model.config)
    for i, (k, v) in enumerate(prefix):
        if i >= layer:
            k, v = k.repeat_interleave(copies, 0), v.repeat_interleave(copies, 0)
        cache.update(k, v, i)
    return cache


def cache_kwarg(model: HFModule) -> str:
    """The forward's name for the KV cache (``cache`` in newer transformers, ``past_key_values`` before: passing the
    old name to a newer model raises a FutureWarning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The KV cache a forward with ``use_cache=True`` returned, under either name."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


@contextmanager
def fanned_out(view: ModelView, layer: int, copies: int) -> Iterator[None]:
    """Within the block, block ``layer`` receives its input repeated ``copies`` times along the batch; blocks
    from ``layer`` on receive every per-example tensor argument (e.g. the attention mask) repeated alike."""

    def pre(module, args, kwargs, first):
        x = first_input(args, kwargs)
        n = x.shape[0] if first else x.shape[0] // copies

        def grow(t):
            return t.repeat_interleave(copies, 0) if isinstance(t, Tensor) and t.dim() and t.shape[0] == n > 1 else t

        x = x.repeat_interleave(copies, 0) if first else x
        if args:
            return (x, *map(grow, args[1:])), {k: grow(v) for k, v in kwargs.items()}
        return args, {k: (x if k == "hidden_states" else grow(v)) for k, v in kwargs.items()}

    specs = [
        Hook(view.block(i), lambda m, a, k, first=(i == layer): pre(m, a, k, first), "pre")
        for i in range(view.check_layer(layer), view.n_layers)
    ]
    with hooks(*specs):
        yield


@torch.no_grad()
def last_token_copies(
    view: ModelView,
    ids: Int[Tensor, "n T"],
    prefix: list[tuple[Tensor, Tensor]],
    layer: int,
    copies: int,
    columns: Int[Tensor, "rows c"] | None = None,
    unembed: tuple[Tensor, Tensor] | None = None,
) -> Float[Tensor, "rows out"]:  # out: the vocabulary, or c with columns
    """Logits ``[n * copies, V]`` of the last token of ``ids: [n, T]`` (unpadded) run on its ``prefix`` cache and
    fanned out into ``copies`` rows per prompt at block ``layer``. ``columns: [n * copies, c]``: only these
    logits per row (the unembedding is then applied to them alone). Hooks that make the copies differ are the
    caller's, on modules of layers ``>= layer``. ``unembed``: ``view.unembed()``, if already at hand."""
    n, T = ids.shape
    model = view.model
    cache = _cache(view, prefix, layer, copies)
    position_ids = torch.full((1, 1), T - 1, dtype=torch.long, device=ids.device)
    keep = {} if columns is None else {"logits_to_keep": torch.zeros(0, dtype=torch.long, device=ids.device)}
    with fanned_out(view, layer, copies), capture({"final": view.norm_module("final", None)}, "pre") as got:
        logits = model(
            input_ids=ids[:, -1:], position_ids=position_ids, use_cache=True, **{cache_kwarg(model): cache}, **keep
        ).logits
    if columns is None:
        return logits[:, -1]
    return unembed_columns(view, got["final"][:, -1], columns, unembed)


def unembed_columns(
    view: ModelView, resid: Tensor, columns: Tensor, unembed: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """``logits[r, columns[r]]`` from the residual stream ``resid: [R, d_model]`` before the final norm: the
    model's logits at those tokens only (Gemma-2's soft-cap applied)."""
    W_U, b_U = unembed or view.unembed()
    x = view.normalized("final", None, resid).to(W_U.dtype)
    out = torch.einsum("rd,drc->rc", x, W_U[:, columns]) + b_U[columns]
    cap = view.final_softcap
    return out if cap is None else cap * torch.tanh(out / cap)
