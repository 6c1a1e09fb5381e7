"""The one place where lit_svd adds hooks to torch modules.

Every hook is added inside a context manager and removed when it exits, also on error:

    with hooks(Hook(view.site_module(3, "o"), fn, "post")):
        model(**batch)

    with capture({("attn_in", 3): view.norm_module("attn", 3)}, "pre") as got:
        model(**batch)
    got[("attn_in", 3)]        # the module's first input (hidden states), detached

`fn` follows torch's signatures: ``pre`` hooks get ``(module, args, kwargs)`` and may return
``(args, kwargs)``; ``post`` hooks get ``(module, args, kwargs, output)`` and may return a new output.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

HookKind = Literal["pre", "post"]


@dataclass(frozen=True)
class Hook:
    """A function to run before (``pre``) or after (``post``) ``module``'s forward."""

    module: nn.Module
    fn: Callable[..., Any]
    kind: HookKind = "post"


def first_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a block or linear layer was called with, positionally or by keyword."""
    if args:
        return args[0]
    if "hidden_states" in kwargs:
        return kwargs["hidden_states"]
    return next(iter(kwargs.values()))


def output_tensor(output: Any, index: int = 0) -> torch.Tensor:
    """The hidden states a module returned (HF decoder layers may return a tuple; ``index``: which part,
    e.g. 1 for the attention pattern an eager HF attention module returns beside its output)."""
    return output[index] if isinstance(output, (tuple, list)) else output


@contextmanager
def hooks(*specs: Hook) -> Iterator[None]:
    """Add every hook in ``specs`` for the duration of the block; always remove them."""
    handles = []
    try:
        for s in specs:
            if s.kind == "pre":
                handles.append(s.module.register_forward_pre_hook(s.fn, with_kwargs=True))
            elif s.kind == "post":
                handles.append(s.module.register_forward_hook(s.fn, with_kwargs=True))
            else:
                raise ValueError(f"hook kind={s.kind!r}: expected 'pre' or 'post'")
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def capture(
    modules: Mapping[Hashable, nn.Module], kind: HookKind = "pre", *, detach: bool = True, index: int = 0
) -> Iterator[dict]:
    """Record each module's first input (``pre``) or output (``post``; part ``index`` of a tuple output)
    under its key.

    Yields the dict that is filled while the block runs; a module called twice keeps the last call.
    """
    got: dict = {}

    def recorder(key):
        def keep(t: torch.Tensor) -> None:
            got[key] = t.detach() if detach else t

        if kind == "pre":
            return lambda mod, args, kwargs: keep(first_input(args, kwargs))
        return lambda mod, args, kwargs, out: keep(output_tensor(out, index))

    with hooks(*(Hook(m, recorder(k), kind) for k, m in modules.items())):
        yield got
