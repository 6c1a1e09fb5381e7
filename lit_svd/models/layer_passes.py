"""Run a frozen model over a range of its blocks only: several passes over the same tokens, one group of
layers each, that together cost one forward pass.

A method whose per-layer state grows with ``d^2`` (tiled-mount sums, SAD null frames) measures a group of
layers per pass so that memory holds only that group's state. ``run_blocks`` makes such a pass cheap:
blocks before the group are not run (each returns the recorded output of the block just before the group,
so the group's first block sees exactly the input the full model gives it), and the forward stops after the
last block the pass needs (no later blocks, no final norm or unembedding). The recorded boundary is one
``[batch, pos, d_model]`` tensor per batch.

    out = run_blocks(view, lambda: lm(input_ids=ids), start=10, resume=boundary, stop=19, record=19)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from torch import nn

from lit_svd.models.hooks import Hook, hooks

if TYPE_CHECKING:
    from lit_svd.models.base import ModelView


class _StopForward(Exception):
    """Raised after the last block a pass needs; caught by ``run_blocks``."""


@contextmanager
def replaying(blocks: list[nn.Module], output: Any) -> Iterator[None]:
    """Skip ``blocks``: each returns ``output`` (a block output recorded earlier) instead of computing.

    Hooks on these blocks still run; the model's own code passes ``output`` on to the next block, so the
    first block after them receives it as its hidden states."""

    def skip(*args, **kwargs):
        return output

    try:
        for b in blocks:
            b.forward = skip  # an instance attribute shadows the class's forward; removed below
        yield
    finally:
        for b in blocks:
            b.__dict__.pop("forward", None)


def run_blocks(
    view: ModelView,
    forward: Callable[[], Any],
    start: int = 0,
    resume: Any = None,
    stop: int | None = None,
    record: int | None = None,
) -> Any:
    """Call ``forward()`` (a full-model call, with any hooks already in place) running only blocks
    ``start..stop``; return the output of block ``record`` (None when ``record`` is None).

    ``start > 0`` needs ``resume``: the output of block ``start - 1`` on the same tokens, recorded by an
    earlier ``run_blocks(..., record=start - 1)``. ``stop``: the last block to run (None: run the model to
    the end). Hooks registered before this call run before the stop, so a hook on block ``stop`` still sees
    its output."""
    if start > 0 and resume is None:
        raise ValueError(f"start={start} needs the recorded output of block {start - 1} (resume)")
    if record is not None and stop is not None and record > stop:
        raise ValueError(f"record={record} lies after stop={stop}: that block would not run")
    recorded: dict[str, Any] = {}
    specs = []
    if record is not None:
        specs.append(Hook(view.block(record), lambda mod, args, kwargs, out: recorded.setdefault("out", out)))
    if stop is not None:

        def halt(mod, args, kwargs, out):
            raise _StopForward

        specs.append(Hook(view.block(stop), halt))
    with hooks(*specs), replaying([view.block(l) for l in range(start)], resume):
        try:
            forward()
        except _StopForward:
            pass
    return recorded.get("out")


def layer_groups(layers: list[int], per_pass: int | None) -> list[list[int]]:
    """``layers`` (sorted, without repeats) in consecutive groups of ``per_pass`` (None: one group)."""
    layers = sorted(set(layers))
    if per_pass is None:
        return [layers]
    if not isinstance(per_pass, int) or isinstance(per_pass, bool) or per_pass <= 0:
        raise ValueError(f"layers_per_pass={per_pass!r} is not allowed: give a positive integer or null (all at once)")
    return [layers[i : i + per_pass] for i in range(0, len(layers), per_pass)]


def pass_bounds(groups: list[list[int]], p: int) -> tuple[int, int, int | None]:
    """``(start, stop, record)`` of pass ``p`` over ``groups``: the blocks it runs and the block whose output
    the next pass resumes from (None for the last pass). The first pass runs from block 0."""
    start = groups[p][0] if p > 0 else 0
    record = groups[p + 1][0] - 1 if p + 1 < len(groups) else None
    stop = groups[p][-1] if record is None else max(groups[p][-1], record)
    return start, stop, record
