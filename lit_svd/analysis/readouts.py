"""Readouts a person can look at: the tokens a singular direction writes or reads.

* Write side (``ov``, ``mlp_out``): the direction ``v_k`` read through what follows the write, the final norm
  and the unembedding (``analysis.masks.write_readings``); the top tokens of ``+v_k`` and of ``-v_k``. For OV
  this is ``analysis.masks.logit_receptors``.
* Read side (``q``, ``k``, ``qk``, ``mlp_in``, ``mlp_gate``): the input direction ``u_k`` (the norm's gain
  folded in; the bias row dropped) against every token's embedding as the site reads it (the embedding
  through the layer's norm): the tokens whose embedding most drives the coefficient up (``+``) and down
  (``-``). For ``qk`` both sides read: the query side (``U``) is reported, the key side under ``key_``.

The sign of a singular direction is arbitrary (``linalg.sign_fixed`` picks one); ``+`` and ``-`` swap with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lit_svd.addresses import Address
from lit_svd.analysis.masks import logit_receptors, write_readings
from lit_svd.models.base import ModelView, NormPoint
from lit_svd.models.intervene import Component

WRITE_KINDS = ("ov", "mlp_out")
NORM_OF: dict[str, NormPoint] = {"q": "attn", "k": "attn", "qk": "attn", "mlp_in": "mlp", "mlp_gate": "mlp"}


def _top(scores: Tensor, tokenizer: PreTrainedTokenizerBase, top_k: int) -> tuple[list[str], list[str]]:
    pos, neg = scores.topk(top_k).indices.tolist(), (-scores).topk(top_k).indices.tolist()
    return [_decode(tokenizer, t) for t in pos], [_decode(tokenizer, t) for t in neg]


def _decode(tokenizer: PreTrainedTokenizerBase, token: int) -> str:
    text = tokenizer.decode([token])
    assert isinstance(text, str)  # one sequence of ids decodes to one string
    return text


@torch.no_grad()
def read_scores(
    emb: Float[Tensor, "vocab d_model"], component: Component, group: int, direction: int, key_side: bool = False
) -> Float[Tensor, " vocab"]:
    """``[vocab]``: each token's embedding as the site reads it (``emb``: ``W_E`` through the site's norm),
    projected on ``u_k`` (``key_side``: the ``qk`` key side ``v_k``)."""
    basis = component.V if key_side else component.U
    u = basis[group, 1:, direction]  # the bias row (index 0) reads the constant 1
    return emb @ u.to(emb.dtype)


@torch.no_grad()
def readouts(
    view: ModelView, component: Component, claims: Sequence[Address], tokenizer: PreTrainedTokenizerBase, top_k: int = 8
) -> list[dict]:
    """For each claimed direction of ``component``: ``side`` ("write" or "read"), ``plus`` and ``minus``
    (top tokens of ``+`` and ``-`` the direction), in the order of ``claims``."""
    if not claims:
        return []
    pairs = [(a.group, a.index) for a in claims]
    out: dict[tuple[int, int], dict] = {}
    if component.kind == "ov":
        keep = torch.zeros(component.shape, dtype=torch.bool)
        for g, k in pairs:
            keep[g, k] = True
        for row in logit_receptors(view, component, keep, tokenizer, top_k):
            out[(row["head"], row["direction"])] = {
                "side": "write",
                "plus": row["promotes"],
                "minus": row["promotes_negative"],
            }
    elif component.kind == "mlp_out":
        V = torch.stack([component.V[g, :, k] for g, k in pairs])
        logits = write_readings(view, "mlp", component.layer, V)
        for (g, k), row in zip(pairs, logits):
            plus, minus = _top(row, tokenizer, top_k)
            out[(g, k)] = {"side": "write", "plus": plus, "minus": minus}
    elif component.kind in NORM_OF:
        emb = view.normalized(NORM_OF[component.kind], component.layer, view.W_E.float())  # once per component
        for g, k in pairs:
            plus, minus = _top(read_scores(emb, component, g, k), tokenizer, top_k)
            out[(g, k)] = {"side": "read", "plus": plus, "minus": minus}
            if component.kind == "qk":
                kp, km = _top(read_scores(emb, component, g, k, key_side=True), tokenizer, top_k)
                out[(g, k)].update(key_plus=kp, key_minus=km)
    else:
        raise ValueError(f"component {component.name}: no readout for kind {component.kind!r}")
    return [out[p] for p in pairs]
