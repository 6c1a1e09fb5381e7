"""Sparse attention decomposition (SAD): a head's relative attention as a sum over singular directions.

For one head, a destination (query) token ``d`` and a visible source (key) token ``s``, with
augmented residual inputs ``x~ = [1, x]`` (bias row first, as in ``ModelView.qk``):

* score ``l(d, s) = rope(x~_d A_q, d) . rope(x~_s A_k, s)``, the model's own pre-softmax score
  (``A_q = [b_Q; W_Q] * scale``, ``A_k = [b_K; W_K]``; no rope for absolute-position models), i.e.
  ``x~_d^T Omega(delta) x~_s`` with ``Omega(delta) = A_q R(delta) A_k^T`` and ``delta = s - d``;
* basis: ``U`` = left singular vectors of ``Omega(0)``; they span ``A_q``'s column space, so
  ``x~_d^T Omega(delta) = x~_d^T U U^T Omega(delta)`` for *every* offset. The term of direction k
  is ``t_k(d, s) = (x~_d . u_k) (u_k^T Omega(delta) x~_s)`` and ``sum_k t_k = l`` exactly, with one
  basis for all offsets (for absolute-position models ``u_k^T Omega = sigma_k v_k^T``: the plain SVD);
* relative attention ``l~(d, s) = l(d, s) - mean_{s' != s visible} l(d, s')`` and contributions
  ``c_k(d, s) = t_k(d, s) - mean_{s' != s visible} t_k(d, s')``, so ``sum_k c_k = l~`` exactly;
* Rolls–Tovee sparsity ``S(c) = (mean_k |c_k|)^2 / mean_k c_k^2`` in ``[1/k, 1]``, lower is sparser;
* ``N_recon``: the fewest directions, in decreasing order of ``c_k``, whose running sum reaches
  ``l~ - tol * sum_k |c_k|``; the default ``tol = 1e-4`` only absorbs float rounding, so this is the
  earlier code's 100 % rule;
* control: the same decomposition in the rotated basis ``U Q`` with ``Q`` Haar-random ``[k, k]``
  (a rotation *within* the head's singular subspace, so the terms still sum exactly to ``l~``).

Pair selection (which ``(d, s)`` are analysed): ``d`` sees at least two sources, ``l~(d, s) > 0``, and
the head's attention weight ``a(d, s) >= threshold``; ``threshold=None`` means the uniform level
``1 / (number of visible sources of d)`` (the earlier code's rule).

Everything is batched over prompts, heads, destinations, directions and sources at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from lit_svd.linalg import haar_orthogonal, rolls_tovee_sparsity, svd_factored

DEFAULT_RECON_TOL = 1e-4

Rotate = Callable[[Tensor, Tensor], Tensor]


def check_threshold(threshold: float | None, key: str = "threshold") -> float | None:
    """``None`` (uniform 1/n rule) or a number in [0, 1]; anything else fails with one line."""
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 1.0):
        raise ValueError(f"{key}={threshold!r} is outside [0, 1]: give an attention weight in [0, 1], or null for"
                         " the uniform level 1/(visible sources)")
    return threshold


def check_tolerance(tol: float, key: str = "recon_tol") -> float:
    if not (isinstance(tol, (int, float)) and 0.0 <= tol < 1.0):
        raise ValueError(f"{key}={tol!r} is outside [0, 1): give a fraction of sum_k |c_k|, e.g. 1e-4")
    return float(tol)


@dataclass
class QKHeads:
    """The query/key side of ``h`` heads: ``l(d, s) = rope(x~_d A_q, d) . rope(x~_s A_k, s)``.

    ``A_q, A_k: [h, D, d_head]`` act on augmented inputs ``[1, x]`` (``D = d_model + 1``), the score
    scale folded into ``A_q``. ``rotate(x [..., pos, d_head], positions [pos])`` is the model's rotary
    embedding (``None``: absolute positions). ``softcap``: Gemma-2's ``cap * tanh(l / cap)`` applied to
    the score before the softmax (the decomposition is of the uncapped score ``l``).
    """

    A_q: Tensor
    A_k: Tensor
    rotate: Rotate | None = None
    softcap: float | None = None

    def __post_init__(self) -> None:
        if self.A_q.shape != self.A_k.shape or self.A_q.dim() != 3:
            raise ValueError(f"QKHeads needs A_q and A_k of one shape [heads, D, d_head]; got {tuple(self.A_q.shape)}"
                             f" and {tuple(self.A_k.shape)}")

    @property
    def n_heads(self) -> int:
        return self.A_q.shape[0]

    def select(self, heads: Tensor | list[int]) -> "QKHeads":
        idx = torch.as_tensor(heads, dtype=torch.long, device=self.A_q.device)
        return QKHeads(self.A_q[idx], self.A_k[idx], self.rotate, self.softcap)

    def to(self, dtype: torch.dtype) -> "QKHeads":
        return QKHeads(self.A_q.to(dtype), self.A_k.to(dtype), self.rotate, self.softcap)

    def basis(self) -> Tensor:
        """``U: [h, D, k]``, left singular vectors of ``Omega(0) = A_q A_k^T`` (descending sigma)."""
        return svd_factored(self.A_q, self.A_k).U


def qk_heads_from_view(view, layer: int) -> QKHeads:
    """All heads of ``layer`` of a ``ModelView``; inputs are ``augment_inputs(view.normalized("attn", ...))``."""
    w = view.attn(view.check_layer(layer))
    A_q = torch.cat([w.b_Q.unsqueeze(1), w.W_Q], dim=1) * w.scale
    A_k = torch.cat([w.b_K.unsqueeze(1), w.W_K], dim=1)
    return QKHeads(A_q, A_k, view.rotate if view.rotary_dim else None, view.attn_softcap)


def attention_window(view, layer: int) -> int | None:
    """The sliding window of ``layer`` (Gemma-2 / Gemma-3 sliding layers), None for full attention."""
    return view.window(layer)


def augment_inputs(x: Tensor) -> Tensor:
    """``[..., d] -> [..., 1 + d]`` with a leading constant 1 (the bias coordinate)."""
    return torch.cat([torch.ones_like(x[..., :1]), x], dim=-1)


def rotated_bases(U: Tensor, seed: int = 0, head_ids: list[int] | None = None) -> Tensor:
    """The control basis ``U Q`` per head, ``Q`` Haar-random ``[k, k]``, drawn for each head from
    ``(seed, head id)`` alone: the same on every rank, whichever other heads are analysed."""
    head_ids = list(range(U.shape[0])) if head_ids is None else list(head_ids)
    Q = torch.stack([haar_orthogonal(U.shape[-1], generator=torch.Generator().manual_seed(seed * 1_000_003 + h),
                                     dtype=U.dtype) for h in head_ids]).to(U.device)
    return U @ Q


def causal_visibility(attention_mask: Tensor, window: int | None = None) -> Tensor:
    """``[B, T] -> [B, T_d, T_s]``: source ``s`` visible from ``d`` when ``s <= d``, both are real tokens,
    and ``d - s < window`` (sliding-window layers)."""
    T = attention_mask.shape[-1]
    idx = torch.arange(T, device=attention_mask.device)
    causal = idx[None, :] <= idx[:, None]
    if window is not None:
        causal = causal & (idx[:, None] - idx[None, :] < window)
    m = attention_mask.bool()
    return causal[None] & m[:, :, None] & m[:, None, :]


def _positions(T: int, device) -> Tensor:
    # rope scores depend only on s - d, and real tokens are contiguous, so index positions suffice
    return torch.arange(T, device=device)


def scores(xq: Tensor, xk: Tensor, qk: QKHeads) -> Tensor:
    """Pre-softmax scores ``[B, h, T_d, T_s]`` computed as the model does (queries . keys)."""
    q = torch.einsum("bqD,hDc->bhqc", xq, qk.A_q)
    k = torch.einsum("bsD,hDc->bhsc", xk, qk.A_k)
    if qk.rotate is not None:
        q = qk.rotate(q, _positions(xq.shape[1], xq.device))
        k = qk.rotate(k, _positions(xk.shape[1], xk.device))
    return q @ k.mT


def direction_terms(xq: Tensor, xk: Tensor, qk: QKHeads, U: Tensor) -> Tensor:
    """``t_k(d, s) = (x~_d . u_k)(u_k^T Omega(s - d) x~_s)`` as ``[B, h, T_d, k, T_s]``; sums over k to the scores."""
    a = torch.einsum("bqD,hDk->bhqk", xq, U)  # query coordinates
    P = torch.einsum("hDk,hDc->hkc", U, qk.A_q)  # U^T A_q: each direction seen as a query vector
    kap = torch.einsum("bsD,hDc->bhsc", xk, qk.A_k)  # keys
    if qk.rotate is None:
        b = torch.einsum("hkc,bhsc->bhks", P, kap).unsqueeze(2)  # same for every destination
    else:
        Tq = xq.shape[1]
        Pq = qk.rotate(P.unsqueeze(2).expand(-1, -1, Tq, -1), _positions(Tq, xq.device))  # [h, k, T_d, c]
        kr = qk.rotate(kap, _positions(xk.shape[1], xk.device))
        b = torch.einsum("hkqc,bhsc->bhqks", Pq, kr)
    return a.unsqueeze(-1) * b


def relative(x: Tensor, visible: Tensor) -> Tensor:
    """``x(s) - mean_{s' != s visible} x(s')`` along the last (source) axis; zero where undefined.

    ``x: [B, h, T_d, ..., T_s]`` (scores or terms), ``visible: [B, T_d, T_s]``; destinations with fewer
    than two visible sources get zeros.
    """
    extra = x.dim() - 4  # axes between T_d and T_s (the direction axis of terms)
    B, Td, Ts = visible.shape
    vis = visible.reshape(B, 1, Td, *([1] * extra), Ts)
    n = vis.sum(-1, keepdim=True).to(x.dtype)
    xv = torch.where(vis, x, torch.zeros((), dtype=x.dtype, device=x.device))
    total = xv.sum(-1, keepdim=True)
    rel = (n * xv - total) / (n - 1).clamp_min(1)
    return torch.where(vis & (n >= 2), rel, torch.zeros((), dtype=x.dtype, device=x.device))


def attention_probs(score: Tensor, visible: Tensor, softcap: float | None = None) -> Tensor:
    """The head's attention weights ``[B, h, T_d, T_s]`` (zero rows for padding destinations)."""
    if softcap:
        score = softcap * torch.tanh(score / softcap)
    vis = visible[:, None]
    masked = score.masked_fill(~vis, float("-inf"))
    p = torch.softmax(masked, dim=-1)
    return torch.nan_to_num(p, nan=0.0)


def select_pairs(probs: Tensor, rel: Tensor, visible: Tensor, threshold: float | None = None) -> Tensor:
    """Analysed pairs ``[B, h, T_d, T_s]`` (bool): >= 2 visible sources, ``l~ > 0``, weight >= threshold
    (``None``: the uniform level ``1 / n_visible``)."""
    n = visible.sum(-1)[:, None, :, None]  # [B, 1, T_d, 1]
    level = 1.0 / n.clamp_min(1) if threshold is None else torch.full_like(probs, threshold)
    return visible[:, None] & (n >= 2) & (rel > 0) & (probs >= level)


def n_recon(c: Tensor, rel: Tensor, tol: float = DEFAULT_RECON_TOL) -> Tensor:
    """Fewest directions, largest contribution first, whose running sum reaches ``rel - tol * sum|c|``.

    ``c: [..., k]``, ``rel: [...]`` -> integer ``[...]`` in ``1..k``.
    """
    cum = c.sort(dim=-1, descending=True).values.cumsum(-1)
    reach = cum >= (rel - tol * c.abs().sum(-1)).unsqueeze(-1)
    first = reach.to(torch.int8).argmax(-1) + 1
    return torch.where(reach.any(-1), first, torch.full_like(first, c.shape[-1]))


@dataclass
class PairStats:
    """One entry per analysed (prompt, head, destination, source) pair, flattened to ``[P]``."""

    batch: Tensor
    head: Tensor  # index into the heads given (0..h-1)
    dest: Tensor
    src: Tensor
    rel: Tensor  # relative attention l~
    sparsity: Tensor
    n_recon: Tensor
    sparsity_rotated: Tensor
    n_recon_rotated: Tensor
    contributions: Tensor | None = None  # [P, k] when asked for

    def __len__(self) -> int:
        return self.head.numel()


def contributions_at(xq: Tensor, xk: Tensor, visible: Tensor, qk: QKHeads, U: Tensor, pairs: Tensor) -> Tensor:
    """Relative contributions ``c_k`` of the selected ``pairs [B, h, T_d, T_s]`` -> ``[P, k]``."""
    c = relative(direction_terms(xq, xk, qk, U), visible)  # [B, h, T_d, k, T_s]
    return c.transpose(-1, -2)[pairs]


def sad_pairs(xq: Tensor, xk: Tensor, visible: Tensor, qk: QKHeads, U: Tensor, U_rot: Tensor,
              threshold: float | None = None, tol: float = DEFAULT_RECON_TOL,
              keep_contributions: bool = False) -> PairStats:
    """Decompose every analysed pair of ``h`` heads over a batch of prompts.

    ``xq: [B, T_d, D]``, ``xk: [B, T_s, D]`` augmented inputs (``augment_inputs``; the same tensor for self-attention),
    ``visible: [B, T_d, T_s]``, ``U, U_rot: [h, D, k]`` (``qk.basis()`` and ``rotated_bases(U)``).
    """
    if xq.shape[0] == 0:
        raise ValueError("sad_pairs got an empty batch (0 prompts); give at least one prompt")
    check_threshold(threshold)
    check_tolerance(tol)
    l = scores(xq, xk, qk)
    rel = relative(l, visible)
    pairs = select_pairs(attention_probs(l, visible, qk.softcap), rel, visible, threshold)
    b, h, d, s = pairs.nonzero(as_tuple=True)
    r = rel[pairs]
    c = contributions_at(xq, xk, visible, qk, U, pairs)
    c_rot = contributions_at(xq, xk, visible, qk, U_rot, pairs)
    return PairStats(b, h, d, s, r, rolls_tovee_sparsity(c), n_recon(c, r, tol),
                     rolls_tovee_sparsity(c_rot), n_recon(c_rot, r, tol), c if keep_contributions else None)


# --- on a model view -------------------------------------------------------------------------------
@dataclass
class LayerBases:
    """What the decomposition of one layer's heads needs, computed once per layer."""

    layer: int
    heads: Tensor  # [h] the model's head indices analysed
    qk: QKHeads
    U: Tensor  # [h, D, k]
    U_rot: Tensor  # [h, D, k]
    window: int | None


def layer_bases(view, layer: int, heads: list[int] | None = None, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> LayerBases:
    """Bases of ``heads`` (default all) of ``layer``; the control rotation is seeded by ``(seed, layer)``."""
    view.check_layer(layer)
    heads = list(range(view.n_heads)) if heads is None else [view.check_head(h) for h in heads]
    qk = qk_heads_from_view(view, layer).select(heads).to(dtype)
    U = qk.basis()
    return LayerBases(layer, torch.tensor(heads), qk, U, rotated_bases(U, seed * 100_003 + layer, heads),
                      attention_window(view, layer))


@torch.no_grad()
def attention_inputs(view, input_ids: Tensor, attention_mask: Tensor, layers: list[int]) -> dict[int, Tensor]:
    """Run the model once; per layer the augmented input ``[B, T, d_model + 1]`` its attention reads
    (``[1, view.normalized("attn", layer, resid)]``)."""
    captured: dict[int, Tensor] = {}

    def capture(layer: int):
        def hook(module, args, kwargs):
            captured[layer] = (args[0] if args else kwargs["hidden_states"]).detach()
        return hook

    handles = [view.block(view.check_layer(l)).register_forward_pre_hook(capture(l), with_kwargs=True)
               for l in layers]
    try:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        view.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    finally:
        for h in handles:
            h.remove()
    return {l: augment_inputs(view.normalized("attn", l, captured[l])) for l in layers}


def decompose_layer(bases: LayerBases, x: Tensor, attention_mask: Tensor, threshold: float | None = None,
                    tol: float = DEFAULT_RECON_TOL, keep_contributions: bool = False) -> PairStats:
    """All analysed pairs of one layer's heads over a batch; ``PairStats.head`` holds model head indices."""
    x = x.to(bases.U.dtype)
    visible = causal_visibility(attention_mask, bases.window)
    stats = sad_pairs(x, x, visible, bases.qk, bases.U, bases.U_rot, threshold, tol, keep_contributions)
    stats.head = bases.heads.to(stats.head.device)[stats.head]
    return stats


# --- per-head summaries from accumulated sums --------------------------------------------------------
def histogram_median(counts: Tensor) -> float:
    """Median of a distribution given as counts of the values ``1..len(counts)`` (NaN when empty);
    the mean of the two middle values for an even total, as ``numpy.median``."""
    n = int(counts.sum().item())
    if n == 0:
        return float("nan")
    cum = counts.cumsum(0)
    lo = int(torch.searchsorted(cum, torch.tensor((n + 1) // 2, dtype=cum.dtype)).item()) + 1
    hi = int(torch.searchsorted(cum, torch.tensor(n // 2 + 1, dtype=cum.dtype)).item()) + 1
    return (lo + hi) / 2


def summarise_heads(layers: list[int], heads: list[list[int]], n_pairs: Tensor, sparsity_sum: Tensor,
                    sparsity_rotated_sum: Tensor, recon_hist: Tensor, recon_hist_rotated: Tensor,
                    min_pairs: int = 20) -> tuple[list[dict], dict]:
    """Rows ``{"layer", "head", "n_pairs", "sparsity", "sparsity_rotated", "n_recon_median", ...}`` for the
    analysed heads (``heads[i]`` lists the heads of ``layers[i]``; sums are ``[L, H]``, histograms
    ``[L, H, k]``), and a summary over the heads with at least ``min_pairs`` pairs."""
    rows = []
    for i, layer in enumerate(layers):
        for h in heads[i]:
            n = int(n_pairs[i, h].item())
            rows.append({
                "layer": layer, "head": h, "n_pairs": n,
                "sparsity": sparsity_sum[i, h].item() / n if n else None,
                "sparsity_rotated": sparsity_rotated_sum[i, h].item() / n if n else None,
                "n_recon_median": histogram_median(recon_hist[i, h]) if n else None,
                "n_recon_median_rotated": histogram_median(recon_hist_rotated[i, h]) if n else None,
                "n_recon_hist": [int(v) for v in recon_hist[i, h].tolist()],
            })
    eligible = [r for r in rows if r["n_pairs"] >= min_pairs]
    mask = torch.zeros_like(n_pairs, dtype=torch.bool)
    for i, layer in enumerate(layers):
        for h in heads[i]:
            mask[i, h] = n_pairs[i, h] >= min_pairs
    pooled = recon_hist[mask].sum(0)
    pooled_rot = recon_hist_rotated[mask].sum(0)
    total = max(int(pooled.sum().item()), 1)
    summary = {
        "min_pairs": min_pairs,
        "n_heads": len(rows),
        "n_heads_eligible": len(eligible),
        "n_heads_sparser_than_rotated": sum(r["sparsity"] < r["sparsity_rotated"] for r in eligible),
        "fraction_sparser_than_rotated": (sum(r["sparsity"] < r["sparsity_rotated"] for r in eligible) / len(eligible)
                                          if eligible else None),
        "mean_sparsity": sum(r["sparsity"] for r in eligible) / len(eligible) if eligible else None,
        "mean_sparsity_rotated": sum(r["sparsity_rotated"] for r in eligible) / len(eligible) if eligible else None,
        "n_pairs": int(pooled.sum().item()),
        "n_recon_hist": [int(v) for v in pooled.tolist()],
        "n_recon_hist_rotated": [int(v) for v in pooled_rot.tolist()],
        "n_recon_median": histogram_median(pooled),
        "n_recon_median_rotated": histogram_median(pooled_rot),
        "n_recon_fraction_le_4": pooled[:4].sum().item() / total,
        "n_recon_fraction_le_4_rotated": pooled_rot[:4].sum().item() / total,
    }
    return rows, summary
