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
* control: the same decomposition in a Haar-random basis of the same span (``rotated_bases``: the law of ``U Q``
  with ``Q`` Haar-random ``[k, k]``), a rotation *within* the head's singular subspace, so the terms still sum
  exactly to ``l~``.

Heads with query / key norms (Gemma-3 ``q_norm`` / ``k_norm``): the model's score is
``l(d, s) = f_q(d) f_k(s) rope(x~_d A_q, d) . rope(x~_s A_k, s)`` with the norms' gains folded into
``A_q, A_k`` and the per-token positive factors ``f = 1 / rms(x~ B)`` of the raw query and key maps
``B_q, B_k`` (``QKHeads.head_norm``). Every term carries the factors of its own pair,
``t_k(d, s) = f_q(d) f_k(s) (x~_d . u_k)(u_k^T Omega(delta) x~_s)``, so ``sum_k t_k = l`` and
``sum_k c_k = l~`` stay exact; the basis ``U`` is that of the weights alone.

Pair selection (which ``(d, s)`` are analysed): ``d`` sees at least two sources, ``l~(d, s) > 0``, and
the head's attention weight ``a(d, s) >= threshold``; ``threshold=None`` means the uniform level
``1 / (number of visible sources of d)`` (the earlier code's rule).

Everything is batched over prompts, heads, destinations, directions and sources at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

from lit_svd.analysis.sad_options import (  # noqa: F401  (re-exported: the checks of SAD's options)
    check_null_draws,
    check_null_stride,
    check_threshold,
    check_tolerance,
)
from lit_svd.linalg import REL_GAP, SVD, direction_blocks, rolls_tovee_sparsity, svd_factored
from lit_svd.models.base import ModelView, augment_inputs, inverse_rms  # [1, x]; per-head norm factors
from lit_svd.models.hooks import capture
from lit_svd.models.svds import view_svd

DEFAULT_RECON_TOL = 1e-4

Rotate = Callable[[Tensor, Tensor], Tensor]


def null_prompts(n_rows: int, index: Tensor | None, stride: int, device: torch.device | None = None) -> Tensor | None:
    """Rows of a batch the matched null is scored on: the prompts whose index in their split (``index``, as
    the data modules give it) is a multiple of ``stride``, so the subset does not depend on batching or DDP
    sharding; without ``index``, every ``stride``-th row of the batch (on ``device``). None (all rows) for stride 1."""
    if stride == 1:
        return None
    if index is None:
        return torch.arange(0, n_rows, stride, device=device)
    return torch.nonzero(index.reshape(-1) % stride == 0).squeeze(1)


@dataclass
class QKHeads:
    """The query/key side of ``h`` heads: ``l(d, s) = rope(x~_d A_q, d) . rope(x~_s A_k, s)``.

    ``A_q, A_k: [h, D, d_head]`` act on augmented inputs ``[1, x]`` (``D = d_model + 1``), the score
    scale folded into ``A_q``. ``rotate(x [..., pos, d_head], positions [pos])`` is the model's rotary
    embedding (``None``: absolute positions). ``softcap``: Gemma-2's ``cap * tanh(l / cap)`` applied to
    the score before the softmax (the decomposition is of the uncapped score ``l``). ``head_norm``:
    ``(B_q, B_k, eps)`` for per-head query / key RMSNorms (Gemma-3): raw maps ``[h, D, d_head]`` whose
    per-token RMS divides every score (``factors``).
    """

    A_q: Float[Tensor, "h D d_head"]
    A_k: Float[Tensor, "h D d_head"]
    rotate: Rotate | None = None
    softcap: float | None = None
    head_norm: tuple[Tensor, Tensor, float] | None = None

    def __post_init__(self) -> None:
        if self.A_q.shape != self.A_k.shape or self.A_q.dim() != 3:
            raise ValueError(
                f"QKHeads needs A_q and A_k of one shape [heads, D, d_head]; got {tuple(self.A_q.shape)}"
                f" and {tuple(self.A_k.shape)}"
            )

    @property
    def n_heads(self) -> int:
        return self.A_q.shape[0]

    def select(self, heads: Tensor | list[int]) -> QKHeads:
        idx = torch.as_tensor(heads, dtype=torch.long, device=self.A_q.device)
        hn = None if self.head_norm is None else (self.head_norm[0][idx], self.head_norm[1][idx], self.head_norm[2])
        return QKHeads(self.A_q[idx], self.A_k[idx], self.rotate, self.softcap, hn)

    def to(self, dtype: torch.dtype) -> QKHeads:
        hn = (
            None
            if self.head_norm is None
            else (self.head_norm[0].to(dtype), self.head_norm[1].to(dtype), self.head_norm[2])
        )
        return QKHeads(self.A_q.to(dtype), self.A_k.to(dtype), self.rotate, self.softcap, hn)

    def token_factors(
        self, xq: Float[Tensor, "B T_d D"], xk: Float[Tensor, "B T_s D"]
    ) -> tuple[Float[Tensor, "B h T_d"], Float[Tensor, "B h T_s"]] | None:
        """``(f_q [B, h, T_d], f_k [B, h, T_s])``: 1 / RMS of each head's raw query and key (None without
        head norms)."""
        if self.head_norm is None:
            return None
        B_q, B_k, eps = self.head_norm
        return inverse_rms(xq, B_q, eps), inverse_rms(xk, B_k, eps)

    def pair_factors(
        self, xq: Float[Tensor, "B T_d D"], xk: Float[Tensor, "B T_s D"]
    ) -> Float[Tensor, "B h T_d T_s"] | None:
        """``f_q(d) f_k(s)`` as ``[B, h, T_d, T_s]`` (None without head norms)."""
        f = self.token_factors(xq, xk)
        return None if f is None else f[0].unsqueeze(-1) * f[1].unsqueeze(-2)

    def basis(self) -> Float[Tensor, "h D k"]:
        """``U: [h, D, k]``, left singular vectors of ``Omega(0) = A_q A_k^T`` (descending sigma)."""
        return svd_factored(self.A_q, self.A_k).U


def qk_heads_from_view(view: ModelView, layer: int) -> QKHeads:
    """All heads of ``layer`` of a ``ModelView``; inputs are ``augment_inputs(view.normalized("attn", ...))``."""
    w = view.attn(view.check_layer(layer))
    A_q = torch.cat([w.b_Q.unsqueeze(1), w.W_Q], dim=1) * w.scale
    A_k = torch.cat([w.b_K.unsqueeze(1), w.W_K], dim=1)
    rotate = partial(view.rotate, layer=layer) if view.rotary_dim else None
    return QKHeads(A_q, A_k, rotate, view.attn_softcap, view.head_norm_maps(layer))


@torch.no_grad()
def basis_blocks(qk: QKHeads, rel_gap: float = REL_GAP, top: int = 8, svd: SVD | None = None) -> list[dict]:
    """Per head of ``qk``: how identifiable the SAD basis directions are. The basis ``U`` is that of
    ``Omega(0) = A_q A_k^T`` for every offset (module docstring), so a term ``t_k`` is as well defined as
    ``u_k`` is, i.e. by ``Omega(0)``'s spectrum; the spectra of ``Omega(delta)`` at other rotary offsets do
    not enter (the decomposition never uses their singular vectors). Returns ``rank``, ``n_isolated`` and
    ``top_terms``: the ``top`` largest directions with ``sigma``, ``block`` (id, size, first, last), ``gap``
    and ``isolated`` (``lit_svd.analysis.blocks.direction_block``). ``svd``: the SVD of ``qk`` where it is known
    (the view's, ``models.svds.view_svd``), else computed here in float64."""
    from lit_svd.analysis.blocks import direction_block

    S = (svd or svd_factored(qk.A_q.double(), qk.A_k.double())).S.double().cpu()  # [h, k]
    b = direction_blocks(S, rel_gap, size=qk.A_q.shape[-2])
    return [
        {
            "rank": int(b.rank[h]),
            "n_isolated": int(b.isolated[h].sum()),
            "top_terms": [
                {"direction": k, "sigma": float(S[h, k]), **direction_block(b, h, k)}
                for k in range(min(top, S.shape[-1]))
            ],
        }
        for h in range(S.shape[0])
    ]


def attention_window(view: ModelView, layer: int) -> int | None:
    """The sliding window of ``layer`` (Gemma-2 / Gemma-3 sliding layers), None for full attention."""
    return view.window(layer)


def rotated_bases(
    U: Float[Tensor, "h D k"], seed: int = 0, head_ids: list[int] | None = None
) -> Float[Tensor, "h D k"]:
    """The control basis per head: a Haar-random orthonormal basis of the span of ``U`` (the orthonormalised
    projection ``U U^T G`` of a Gaussian ``G: [D, k]`` drawn from ``(seed, head id)`` alone: the same on every rank,
    whichever other heads are analysed). Its law is that of ``U Q`` with ``Q`` Haar ``[k, k]``, but it depends only
    on the span of ``U``, not on which orthonormal basis of it the SVD returned: a singular vector's sign, or a
    rotation inside a block of near-equal singular values, that another BLAS build picks differently leaves the
    control unchanged."""
    head_ids = list(range(U.shape[0])) if head_ids is None else list(head_ids)
    D, k = U.shape[-2:]
    G = torch.stack(
        [
            torch.randn(D, k, generator=torch.Generator().manual_seed(seed * 1_000_003 + h), dtype=torch.float64)
            for h in head_ids
        ]
    ).to(U.device)
    U64 = U.to(torch.float64)
    Q, R = torch.linalg.qr(U64 @ (U64.mT @ G))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
    return Q.to(U.dtype)


def causal_visibility(attention_mask: Shaped[Tensor, "B T"], window: int | None = None) -> Bool[Tensor, "B T T"]:
    """``[B, T] -> [B, T_d, T_s]``: source ``s`` visible from ``d`` when ``s <= d``, both are real tokens,
    and ``d - s < window`` (sliding-window layers)."""
    T = attention_mask.shape[-1]
    idx = torch.arange(T, device=attention_mask.device)
    causal = idx[None, :] <= idx[:, None]
    if window is not None:
        causal = causal & (idx[:, None] - idx[None, :] < window)
    m = attention_mask.bool()
    return causal[None] & m[:, :, None] & m[:, None, :]


def _positions(T: int, device: torch.device) -> Tensor:
    # rope scores depend only on s - d, and real tokens are contiguous, so index positions suffice
    return torch.arange(T, device=device)


def scores(xq: Float[Tensor, "B T_d D"], xk: Float[Tensor, "B T_s D"], qk: QKHeads) -> Float[Tensor, "B h T_d T_s"]:
    """Pre-softmax scores ``[B, h, T_d, T_s]`` computed as the model does (queries . keys)."""
    q = torch.einsum("bqD,hDc->bhqc", xq, qk.A_q)
    k = torch.einsum("bsD,hDc->bhsc", xk, qk.A_k)
    if qk.rotate is not None:
        q = qk.rotate(q, _positions(xq.shape[1], xq.device))
        k = qk.rotate(k, _positions(xk.shape[1], xk.device))
    f = qk.pair_factors(xq, xk)
    return q @ k.mT if f is None else (q @ k.mT) * f


def direction_terms(
    xq: Float[Tensor, "B T_d D"], xk: Float[Tensor, "B T_s D"], qk: QKHeads, U: Float[Tensor, "h D k"]
) -> Float[Tensor, "B h T_d k T_s"]:
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
    f = qk.pair_factors(xq, xk)
    terms = a.unsqueeze(-1) * b
    return terms if f is None else terms * f.unsqueeze(-2)


def relative(
    x: Float[Tensor, "B h T_d *mid T_s"], visible: Bool[Tensor, "B T_d T_s"]
) -> Float[Tensor, "B h T_d *mid T_s"]:
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


def attention_probs(
    score: Float[Tensor, "B h T_d T_s"], visible: Bool[Tensor, "B T_d T_s"], softcap: float | None = None
) -> Float[Tensor, "B h T_d T_s"]:
    """The head's attention weights ``[B, h, T_d, T_s]`` (zero rows for padding destinations)."""
    if softcap:
        score = softcap * torch.tanh(score / softcap)
    vis = visible[:, None]
    masked = score.masked_fill(~vis, float("-inf"))
    p = torch.softmax(masked, dim=-1)
    return torch.nan_to_num(p, nan=0.0)


def select_pairs(
    probs: Float[Tensor, "B h T_d T_s"],
    rel: Float[Tensor, "B h T_d T_s"],
    visible: Bool[Tensor, "B T_d T_s"],
    threshold: float | None = None,
) -> Bool[Tensor, "B h T_d T_s"]:
    """Analysed pairs ``[B, h, T_d, T_s]`` (bool): >= 2 visible sources, ``l~ > 0``, weight >= threshold
    (``None``: the uniform level ``1 / n_visible``)."""
    n = visible.sum(-1)[:, None, :, None]  # [B, 1, T_d, 1]
    level = 1.0 / n.clamp_min(1) if threshold is None else torch.full_like(probs, threshold)
    return visible[:, None] & (n >= 2) & (rel > 0) & (probs >= level)


def sort_descending(c: Float[Tensor, "*batch k"]) -> Float[Tensor, "*batch k"]:
    """Values of ``c`` sorted in decreasing order along the last axis (numpy's vectorised sort on CPU,
    ~15x faster than torch's for many short rows)."""
    if c.device.type != "cpu" or c.requires_grad:
        return c.sort(dim=-1, descending=True).values
    return torch.from_numpy(np.ascontiguousarray(np.sort(c.contiguous().numpy(), axis=-1)[..., ::-1]))


def n_recon(
    c: Float[Tensor, "*batch k"], rel: Float[Tensor, "*batch"], tol: float = DEFAULT_RECON_TOL
) -> Int[Tensor, "*batch"]:
    """Fewest directions, largest contribution first, whose running sum reaches ``rel - tol * sum|c|``.

    ``c: [..., k]``, ``rel: [...]`` -> integer ``[...]`` in ``1..k``.
    """
    cum = sort_descending(c).cumsum(-1)
    reach = cum >= (rel - tol * c.abs().sum(-1)).unsqueeze(-1)
    first = reach.to(torch.int8).argmax(-1) + 1
    return torch.where(reach.any(-1), first, torch.full_like(first, c.shape[-1]))


def contributions_at(
    xq: Float[Tensor, "B T_d D"],
    xk: Float[Tensor, "B T_s D"],
    visible: Bool[Tensor, "B T_d T_s"],
    qk: QKHeads,
    U: Float[Tensor, "h D k"],
    pairs: Bool[Tensor, "B h T_d T_s"],
) -> Float[Tensor, "P k"]:
    """Relative contributions ``c_k`` of the selected ``pairs [B, h, T_d, T_s]`` -> ``[P, k]``, from the full
    term tensor (the reference for ``pair_contributions``)."""
    c = relative(direction_terms(xq, xk, qk, U), visible)  # [B, h, T_d, k, T_s]
    return c.transpose(-1, -2)[pairs]


Pairs = tuple[Tensor, Tensor, Tensor, Tensor]  # (batch, head, dest, src) indices, each [P]


def _pairs_of(mask: Tensor) -> Pairs:
    """The ``(batch, head, dest, src)`` indices of a ``[B, h, T_d, T_s]`` mask's true entries."""
    b, h, d, s = mask.nonzero(as_tuple=True)
    return b, h, d, s


def pair_contributions(
    a: Tensor, P: Tensor, keys: Tensor, visible: Tensor, pairs: Pairs, rotate: Rotate | None = None
) -> Tensor:
    """Relative contributions ``c_k(d, s)`` of the listed pairs only -> ``[..., P, k]``.

    ``a: [..., B, h or 1, T_d, k]`` query coordinates ``x~_d . u_k``; ``P: [h, k, c]`` the directions as query
    vectors (``U^T A_q``); ``keys: [..., B, h, T_s, c]`` unrotated keys ``x~_s A_k``; leading ``...`` axes
    (null draws) broadcast. Uses ``c_k = a_k(d) n/(n-1) (p_k(d) . (kappa_s - mean_{s' visible} kappa_s'))``
    (``n`` visible sources, ``p_k(d)``, ``kappa`` rotated to their positions), so each pair costs one
    ``k x c`` product instead of a row over every source (pairs grouped by head and destination).
    """
    b, h, d, s = pairs
    Td, Ts = a.shape[-2], keys.shape[-2]
    Pd = P.unsqueeze(2)  # [h, k, 1, c]: the same query vectors at every destination
    if rotate is not None:
        keys = rotate(keys, _positions(Ts, keys.device))
        Pd = rotate(P.unsqueeze(2).expand(-1, -1, Td, -1), _positions(Td, P.device))  # [h, k, T_d, c]
    n = visible.sum(-1).to(keys.dtype)  # [B, T_d]
    keys = keys.masked_fill(~visible.any(1)[:, None, :, None], 0.0)  # padding may hold NaN: 0 * NaN is NaN
    mean_keys = torch.einsum("bqs,...bhsc->...bhqc", visible.to(keys.dtype), keys) / n.clamp_min(1)[:, None, :, None]
    diff = _rows(keys, b, h, s) - _rows(mean_keys, b, h, d)  # [..., P, c]
    # one [c, k] matrix per (head, destination): group the pairs, multiply, put back
    group = h * Pd.shape[2] + (d if Pd.shape[2] > 1 else torch.zeros_like(d))
    order = torch.argsort(group, stable=True)
    keys_g, counts = torch.unique_consecutive(group[order], return_counts=True)
    parts = diff[..., order, :].split(counts.tolist(), dim=-2)
    out = torch.cat([x @ Pd[g // Pd.shape[2], :, g % Pd.shape[2]].mT for x, g in zip(parts, keys_g.tolist())], dim=-2)
    out = out[..., torch.argsort(order), :]
    nd = n[b, d]
    return _rows(a, b, h, d) * out * (nd / (nd - 1)).unsqueeze(-1)


def _rows(t: Tensor, b: Tensor, h: Tensor, q: Tensor) -> Tensor:
    """``t[..., b, h, q, :]`` for ``t: [..., B, H, T, c]`` (``H = 1``: shared by every head) -> ``[..., P, c]``."""
    B, H, T, c = t.shape[-4:]
    flat = (b * H + (h if H > 1 else 0)) * T + q
    return t.reshape(*t.shape[:-4], B * H * T, c).index_select(-2, flat)


def haar_frames(
    D: int, k: int, n: int, generator: torch.Generator, dtype: torch.dtype = torch.float32
) -> Float[Tensor, "n D k"]:
    """``n`` Haar-random orthonormal frames ``[n, D, k]`` (reduced QR of a Gaussian, sign-fixed)."""
    Q, R = torch.linalg.qr(torch.randn(n, D, k, generator=generator, dtype=torch.float64))
    return (Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)).to(dtype)


@dataclass
class NullHeads:
    """Matched-spectrum null: per head ``i`` and draw ``j`` the random head ``A_q' = U'_ij C_q[i]``,
    ``A_k' = V'_ij C_k[i]`` with ``C_q = U^T A_q``, ``C_k = V^T A_k`` (``C_q C_k^T = diag(sigma)``).

    Its ``Omega'(delta) = U'_ij C_q R(delta) C_k^T V'_ij^T`` has the head's exact singular values at *every*
    offset (``U'``, ``V'`` are isometries; the head's own rotary map ``R``), its singular vectors at
    ``delta = 0`` are ``U'_ij``, ``V'_ij``: Haar-random frames, so they carry no feature. The frames are
    drawn per head from ``(seed, head id)`` alone (as the rotated control), independently across heads.
    """

    U: Tensor  # [h, n, D, k]
    V: Tensor  # [h, n, D, k]
    C_q: Tensor  # [h, k, c]
    C_k: Tensor  # [h, k, c]

    @property
    def n_draws(self) -> int:
        return self.U.shape[1]

    def head(self, draw: int, qk: QKHeads) -> QKHeads:
        """Draw ``draw`` as explicit factors (for tests and figures): ``A_q' = U'C_q``, ``A_k' = V'C_k``."""
        return QKHeads(self.U[:, draw] @ self.C_q, self.V[:, draw] @ self.C_k, qk.rotate, qk.softcap, qk.head_norm)


def null_heads(qk: QKHeads, svd: SVD, n_draws: int, seed: int, head_ids: list[int] | None = None) -> NullHeads:
    """``n_draws`` matched-spectrum null heads of every head in ``qk`` (``svd``: ``svd_factored(A_q, A_k)``);
    head ``i``'s frames come from ``(seed, head_ids[i])`` alone, the same on every rank and selection."""
    head_ids = list(range(qk.n_heads)) if head_ids is None else list(head_ids)
    D, k = svd.U.shape[-2:]
    F = torch.stack(
        [
            haar_frames(D, k, 2 * n_draws, torch.Generator().manual_seed(seed * 1_000_003 + h), qk.A_q.dtype)
            for h in head_ids
        ]
    ).to(qk.A_q.device)  # [h, 2n, D, k]
    return NullHeads(F[:, :n_draws], F[:, n_draws:], svd.U.mT @ qk.A_q, svd.V.mT @ qk.A_k)


def signed(
    c: Float[Tensor, "*batch k"], rel: Float[Tensor, "*batch"]
) -> tuple[Float[Tensor, "*batch k"], Float[Tensor, "*batch"]]:
    """Flip pairs with ``l~ < 0`` so that the total to rebuild is positive (N_recon of ``-c`` reaching ``-l~``:
    the directions that carry the *avoidance*); Rolls–Tovee sparsity is unchanged by the sign."""
    sgn = torch.where(rel < 0, -1.0, 1.0).to(c.dtype)
    return c * sgn.unsqueeze(-1), rel * sgn


@dataclass
class NullStats:
    """Matched-spectrum null: one entry per pair a null head attends to, flattened to ``[P']``."""

    draw: Tensor
    head: Tensor  # index into the heads given (0..h-1)
    sparsity: Tensor
    n_recon: Tensor


@dataclass
class UnattendedStats:
    """Pair null: the real head, in its singular basis, on the visible pairs it does *not* attend to
    (weight below the threshold, ``l~ != 0``; signs flipped by ``signed``), flattened to ``[Q]``."""

    head: Tensor
    rel: Tensor  # |l~|
    sparsity: Tensor
    n_recon: Tensor


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
    null: NullStats | None = None
    unattended: UnattendedStats | None = None

    def __len__(self) -> int:
        return self.head.numel()


def null_pairs(
    xq: Tensor,
    xk: Tensor,
    visible: Tensor,
    qk: QKHeads,
    null: NullHeads,
    threshold: float | None = None,
    tol: float = DEFAULT_RECON_TOL,
) -> NullStats:
    """Decompose the matched-spectrum null heads on the same inputs, each on the pairs *it* attends to by
    the same rule (``select_pairs`` on its own scores); draws are stacked along the batch axis."""
    n, B = null.n_draws, xq.shape[0]
    a = torch.einsum("bqD,hnDk->nbhqk", xq, null.U)
    keys = torch.einsum("nbhsk,hkc->nbhsc", torch.einsum("bsD,hnDk->nbhsk", xk, null.V), null.C_k)
    f = qk.token_factors(xq, xk)  # Gemma-3: the model's own per-token q_norm / k_norm factors, kept
    if f is not None:
        a, keys = a * f[0].unsqueeze(-1), keys * f[1].unsqueeze(-1)
    q = torch.einsum("nbhqk,hkc->nbhqc", a, null.C_q).flatten(0, 1)  # [n B, h, T_d, c]
    keys = keys.flatten(0, 1)
    kr = keys
    if qk.rotate is not None:
        q = qk.rotate(q, _positions(q.shape[-2], q.device))
        kr = qk.rotate(keys, _positions(keys.shape[-2], keys.device))
    vis = visible.repeat(n, 1, 1)
    l = q @ kr.mT
    rel = relative(l, vis)
    pairs = select_pairs(attention_probs(l, vis, qk.softcap), rel, vis, threshold)
    idx = _pairs_of(pairs)
    a = a.flatten(0, 1)
    c = pair_contributions(a, null.C_q, keys, vis, idx, qk.rotate)
    r = rel[pairs]
    return NullStats(idx[0] // B, idx[1], rolls_tovee_sparsity(c), n_recon(c, r, tol))


def sad_pairs(
    xq: Tensor,
    xk: Tensor,
    visible: Tensor,
    qk: QKHeads,
    U: Tensor,
    U_rot: Tensor,
    threshold: float | None = None,
    tol: float = DEFAULT_RECON_TOL,
    keep_contributions: bool = False,
    null: NullHeads | None = None,
    unattended: bool = False,
    null_rows: Tensor | None = None,
) -> PairStats:
    """Decompose every analysed pair of ``h`` heads over a batch of prompts.

    ``xq: [B, T_d, D]``, ``xk: [B, T_s, D]`` augmented inputs (``augment_inputs``; the same tensor for self-attention),
    ``visible: [B, T_d, T_s]``, ``U, U_rot: [h, D, k]`` (``qk.basis()`` and ``rotated_bases(U)``). ``null``: also
    decompose the matched-spectrum null heads (``null_pairs``) on the prompts ``null_rows`` (row indices; None:
    all; no rows: no null for this batch); ``unattended``: also the pair null.
    """
    if xq.shape[0] == 0:
        raise ValueError("sad_pairs got an empty batch (0 prompts); give at least one prompt")
    check_threshold(threshold)
    check_tolerance(tol)
    l = scores(xq, xk, qk)
    rel = relative(l, visible)
    probs = attention_probs(l, visible, qk.softcap)
    pairs = select_pairs(probs, rel, visible, threshold)
    idx = _pairs_of(pairs)
    r = rel[pairs]
    keys = torch.einsum("bsD,hDc->bhsc", xk, qk.A_k)

    def decompose(basis: Tensor, where: Pairs) -> Tensor:
        a = torch.einsum("bqD,hDk->bhqk", xq, basis)
        return pair_contributions(a, basis.mT @ qk.A_q, keys, visible, where, qk.rotate)

    c, c_rot = decompose(U, idx), decompose(U_rot, idx)
    stats = PairStats(
        *idx,
        r,
        rolls_tovee_sparsity(c),
        n_recon(c, r, tol),
        rolls_tovee_sparsity(c_rot),
        n_recon(c_rot, r, tol),
        c if keep_contributions else None,
    )
    if null is not None and (null_rows is None or len(null_rows)):
        rows = slice(None) if null_rows is None else null_rows
        stats.null = null_pairs(xq[rows], xk[rows], visible[rows], qk, null, threshold, tol)
    if unattended:
        n_vis = visible.sum(-1)[:, None, :, None]
        level = 1.0 / n_vis.clamp_min(1) if threshold is None else torch.full_like(probs, threshold)
        other = visible[:, None] & (n_vis >= 2) & (rel != 0) & (probs < level)
        oidx = _pairs_of(other)
        cu, ru = signed(decompose(U, oidx), rel[other])
        stats.unattended = UnattendedStats(oidx[1], ru, rolls_tovee_sparsity(cu), n_recon(cu, ru, tol))
    return stats


# --- on a model view -------------------------------------------------------------------------------
DEFAULT_NULL_DRAWS = 16


@dataclass
class LayerBases:
    """What the decomposition of one layer's heads needs, computed once per layer."""

    layer: int
    heads: Tensor  # [h] the model's head indices analysed
    qk: QKHeads
    U: Tensor  # [h, D, k]
    U_rot: Tensor  # [h, D, k]
    window: int | None
    null: NullHeads | None = None


def layer_bases(
    view: ModelView,
    layer: int,
    heads: list[int] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    null_draws: int = 0,
) -> LayerBases:
    """Bases of ``heads`` (default all) of ``layer``; the control rotation and the ``null_draws``
    matched-spectrum null heads are seeded by ``(seed, layer)`` (and the head, for the rotation)."""
    view.check_layer(layer)
    heads = list(range(view.n_heads)) if heads is None else [view.check_head(h) for h in heads]
    qk = qk_heads_from_view(view, layer).select(heads).to(dtype)
    whole = view_svd(view, layer, "qk")  # computed once per view (models.svds): the heads' Omega(0) = A_q A_k^T
    idx = torch.tensor(heads, device=whole.U.device)
    svd = SVD(whole.U[idx], whole.S[idx], whole.V[idx]).to(dtype)
    null = null_heads(qk, svd, null_draws, seed * 100_003 + layer + 7_919_000, heads) if null_draws else None
    return LayerBases(
        layer,
        torch.tensor(heads),
        qk,
        svd.U,
        rotated_bases(svd.U, seed * 100_003 + layer, heads),
        attention_window(view, layer),
        null,
    )


@torch.no_grad()
def attention_inputs(
    view: ModelView,
    input_ids: Tensor,
    attention_mask: Tensor,
    layers: list[int],
    run: Callable[[Callable[[], object]], object] | None = None,
) -> dict[int, Tensor]:
    """Run the model once; per layer the augmented input ``[B, T, d_model + 1]`` its attention reads
    (``[1, view.normalized("attn", layer, resid)]``). ``run(forward)`` calls the model's forward (default:
    ``forward()``; ``lit_svd.models.layer_passes.run_blocks`` runs only the blocks a pass needs)."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)

    def forward():  # the logits are not needed (262k-word vocabularies)
        view.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=1)

    with capture({l: view.block(view.check_layer(l)) for l in layers}, "pre") as got:
        forward() if run is None else run(forward)
    return {l: augment_inputs(view.normalized("attn", l, got[l])) for l in layers}


def decompose_layer(
    bases: LayerBases,
    x: Tensor,
    attention_mask: Tensor,
    threshold: float | None = None,
    tol: float = DEFAULT_RECON_TOL,
    keep_contributions: bool = False,
    unattended: bool = False,
    null_rows: Tensor | None = None,
) -> PairStats:
    """All analysed pairs of one layer's heads over a batch (with the nulls the bases carry, on the
    prompts ``null_rows`` (None: all), and the pair null when ``unattended``); ``PairStats.head`` and
    ``.unattended.head`` hold model head indices."""
    x = x.to(bases.U.dtype)
    visible = causal_visibility(attention_mask, bases.window)
    stats = sad_pairs(
        x,
        x,
        visible,
        bases.qk,
        bases.U,
        bases.U_rot,
        threshold,
        tol,
        keep_contributions,
        bases.null,
        unattended,
        null_rows,
    )
    heads = bases.heads.to(stats.head.device)
    stats.head = heads[stats.head]
    for extra in (stats.null, stats.unattended):
        if extra is not None:
            extra.head = heads[extra.head]
    return stats


def abs_term_sums(
    bases: LayerBases, x: Float[Tensor, "B T D"], attention_mask: Shaped[Tensor, "B T"], threshold: float | None = None
) -> tuple[Float[Tensor, "h k"], Float[Tensor, " h"]]:
    """Per head of ``bases`` (model order), the sum over every analysed pair of the batch (all destinations, SAD's
    pair rule) of each QK direction's ``|c_k|``, and the number of pairs (float64): a head's mean ``|c_k|`` on a
    task is their ratio over its prompts. ``x``: ``augment_inputs`` of the layer's normalised input."""
    stats = decompose_layer(bases, x, attention_mask, threshold, keep_contributions=True)
    assert stats.contributions is not None
    n_model_heads = int(bases.heads.max()) + 1
    head = stats.head.cpu()
    sums = torch.zeros(n_model_heads, bases.U.shape[-1], dtype=torch.float64)
    sums.index_add_(0, head, stats.contributions.abs().double().cpu())
    counts = torch.zeros(n_model_heads, dtype=torch.float64)
    counts.index_add_(0, head, torch.ones(len(head), dtype=torch.float64))
    return sums, counts


def head_means(
    head: Int[Tensor, " P"], values: Float[Tensor, "*batch P"], n_heads: int
) -> Float[Tensor, "*batch n_heads"]:
    """Mean of ``values [..., P]`` per head index ``head [P]`` -> ``[..., n_heads]`` (NaN for heads without pairs)."""
    v = values.double().cpu()
    total = torch.zeros(*v.shape[:-1], n_heads, dtype=torch.float64).index_add_(-1, head.cpu(), v)
    count = torch.zeros(n_heads, dtype=torch.float64).index_add_(
        0, head.cpu(), torch.ones(len(head), dtype=torch.float64)
    )
    return total / count


def null_head_means(null: NullStats, n_heads: int, n_draws: int | None = None) -> Tensor:
    """Mean sparsity of each null draw of each head -> ``[n_heads, n_draws]`` (NaN without pairs)."""
    n_draws = int(null.draw.max().item()) + 1 if n_draws is None else n_draws
    key = null.head.cpu() * n_draws + null.draw.cpu()
    return head_means(key, null.sparsity, n_heads * n_draws).reshape(n_heads, n_draws)


def null_quantile(null_means: Float[Tensor, "*batch n_draws"], q: float = 0.05) -> Float[Tensor, "*batch"]:
    """The ``q`` quantile of the null draws ``[..., n_draws]`` (linear interpolation, as ``numpy.quantile``)."""
    return torch.quantile(null_means.double(), q, dim=-1)


def head_rows(names: list[str], st: PairStats, n_heads: int) -> dict[str, list]:
    """Per head of one layer: mean sparsity, its rotated control, the matched null (mean, 5th percentile,
    whether the head is below it) and the pair count; ``names[h]`` names head ``h``."""
    sp, rot = head_means(st.head, st.sparsity, n_heads), head_means(st.head, st.sparsity_rotated, n_heads)
    n = torch.bincount(st.head.cpu(), minlength=n_heads)
    out = {"name": names, "sparsity": sp.tolist(), "sparsity_rotated": rot.tolist(), "n_pairs": n.tolist()}
    if st.null is not None:
        draws = null_head_means(st.null, n_heads)  # [h, n_draws]
        p05 = null_quantile(draws)
        out.update(
            sparsity_null=draws.mean(-1).tolist(),
            sparsity_null_p05=p05.tolist(),
            sparser_than_null=[bool(a < b) for a, b in zip(sp.tolist(), p05.tolist())],
        )
    return out


@torch.no_grad()
def lm_head_sparsity(
    view: ModelView,
    ids: Tensor,
    mask: Tensor,
    threshold: float | None,
    tol: float,
    seed: int,
    null_draws: int = DEFAULT_NULL_DRAWS,
) -> dict[str, list]:
    """Per head (every layer) on one probe batch: see ``head_rows``."""
    X = attention_inputs(view, ids, mask, list(range(view.n_layers)))
    out: dict[str, list] = {}
    for layer in range(view.n_layers):
        bases = layer_bases(view, layer, seed=seed, null_draws=null_draws)
        rows = head_rows(
            [f"L{layer}H{h}" for h in range(view.n_heads)],
            decompose_layer(bases, X[layer], mask, threshold, tol),
            view.n_heads,
        )
        for k, v in rows.items():
            out.setdefault(k, []).extend(v)
    return out


@torch.no_grad()
def toy_head_sparsity(
    W: Tensor,
    W_Q: Tensor,
    W_K: Tensor,
    d_heads: list[int],
    feats: Tensor,
    threshold: float | None,
    tol: float,
    seed: int,
    null_draws: int = DEFAULT_NULL_DRAWS,
) -> dict[str, list]:
    """Per toy instance (``W: [I, D, N]``, ``W_Q, W_K: [I, H, D]``, ``feats: [I, B, 1 + m, N]``): the query
    token (0) attending over the key tokens, in the instance's own features; see ``head_rows``."""
    out: dict[str, list] = {}
    for i, d_head in enumerate(d_heads):
        x = torch.einsum("btn,dn->btd", feats[i].float(), W[i].float())  # [B, 1 + m, D]
        qk = QKHeads(W_Q[i, :d_head].T[None].float(), W_K[i, :d_head].T[None].float())
        svd = svd_factored(qk.A_q, qk.A_k)
        xq, xk = x[:, :1], x[:, 1:]
        visible = torch.ones(x.shape[0], 1, xk.shape[1], dtype=torch.bool, device=x.device)
        null = null_heads(qk, svd, null_draws, seed + i + 7_919_000) if null_draws else None
        st = sad_pairs(xq, xk, visible, qk, svd.U, rotated_bases(svd.U, seed + i), threshold, tol, null=null)
        for k, v in head_rows([f"instance{i}"], st, 1).items():
            out.setdefault(k, []).extend(v)
    return out


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


Z_ONE_SIDED_5 = 1.6448536269514722  # standard normal 95th percentile


def _mean(total: float, n: int) -> float | None:
    return total / n if n else None


def _welch_z(m1: float, sq1: float, n1: int, m2: float, sq2: float, n2: int) -> float | None:
    """``(m2 - m1) / se`` from means and sums of squares (sample variances); None when undefined."""
    if n1 < 2 or n2 < 2:
        return None
    v1 = max(sq1 / n1 - m1 * m1, 0.0) * n1 / (n1 - 1)
    v2 = max(sq2 / n2 - m2 * m2, 0.0) * n2 / (n2 - 1)
    se = (v1 / n1 + v2 / n2) ** 0.5
    return (m2 - m1) / se if se > 0 else None


def _fraction_le(hist: Tensor, k: int = 4) -> float:
    return hist[:k].sum().item() / max(hist.sum().item(), 1.0)


def summarise_heads(
    layers: list[int], heads: list[list[int]], sums: dict[str, Tensor], min_pairs: int = 20
) -> tuple[list[dict], dict]:
    """Per-head rows and a summary over the heads with at least ``min_pairs`` pairs, from the sums of
    ``SADHeadStats`` (``[L, H]``; histograms ``[L, H, k]``; null pair counts and sparsity ``[L, H, n_draws]``).

    A head is *sparser than* the rotated control when its mean is lower; than the matched-spectrum null
    when its mean is below the 5th percentile of the null draws' means; than the pair null when the
    one-sided Welch z of (unattended mean - attended mean) exceeds 1.645 (pairs treated as independent).
    """
    has_null = "sparsity_null" in sums and sums["sparsity_null"].shape[-1] > 0
    has_un = "n_unattended" in sums
    rows = []
    for i, layer in enumerate(layers):
        for h in heads[i]:
            n = int(sums["n_pairs"][i, h].item())
            sp, rot = _mean(sums["sparsity"][i, h].item(), n), _mean(sums["sparsity_rotated"][i, h].item(), n)
            row: dict[str, Any] = {
                "layer": layer,
                "head": h,
                "n_pairs": n,
                "sparsity": sp,
                "sparsity_rotated": rot,
                "sparser_than_rotated": sp is not None and rot is not None and sp < rot,
                "n_recon_median": histogram_median(sums["recon_hist"][i, h]) if n else None,
                "n_recon_median_rotated": histogram_median(sums["recon_hist_rotated"][i, h]) if n else None,
                "n_recon_hist": [int(v) for v in sums["recon_hist"][i, h].tolist()],
            }
            if has_null:
                draws = sums["sparsity_null"][i, h] / sums["n_pairs_null"][i, h].clamp_min(1)
                p05 = null_quantile(draws).item()
                row.update(
                    sparsity_null=draws.mean().item() if n else None,
                    sparsity_null_p05=p05 if n else None,
                    sparsity_null_draws=draws.tolist() if n else None,
                    sparser_than_null=sp is not None and sp < p05,
                    null_fraction_below=(draws < sp).double().mean().item() if sp is not None else None,
                    n_recon_median_null=histogram_median(sums["recon_hist_null"][i, h]) if n else None,
                )
            if has_un:
                m = int(sums["n_unattended"][i, h].item())
                su = _mean(sums["sparsity_unattended"][i, h].item(), m)
                z = (
                    _welch_z(
                        sp, sums["sparsity_sq"][i, h].item(), n, su, sums["sparsity_unattended_sq"][i, h].item(), m
                    )
                    if sp is not None and su is not None
                    else None
                )
                row.update(
                    n_unattended=m,
                    sparsity_unattended=su,
                    z_unattended=z,
                    sparser_than_unattended=bool(z is not None and z > Z_ONE_SIDED_5),
                    n_recon_median_unattended=histogram_median(sums["recon_hist_unattended"][i, h]) if m else None,
                )
            rows.append(row)
    eligible = [r for r in rows if r["n_pairs"] >= min_pairs]
    mask = torch.zeros_like(sums["n_pairs"], dtype=torch.bool)
    for i, _ in enumerate(layers):
        for h in heads[i]:
            mask[i, h] = sums["n_pairs"][i, h] >= min_pairs
    summary: dict[str, Any] = {"min_pairs": min_pairs, "n_heads": len(rows), **_counts(eligible, has_null, has_un)}
    for suffix, key in (
        [("", "recon_hist"), ("_rotated", "recon_hist_rotated")]
        + ([("_null", "recon_hist_null")] if has_null else [])
        + ([("_unattended", "recon_hist_unattended")] if has_un else [])
    ):
        pooled = sums[key][mask].sum(0)
        if suffix == "":
            summary["n_pairs"] = int(pooled.sum().item())
        summary[f"n_recon_hist{suffix}"] = [int(v) for v in pooled.tolist()]
        summary[f"n_recon_median{suffix}"] = histogram_median(pooled)
        summary[f"n_recon_fraction_le_4{suffix}"] = _fraction_le(pooled)
    summary["per_layer"] = [
        {"layer": layer, **_counts([r for r in eligible if r["layer"] == layer], has_null, has_un)} for layer in layers
    ]
    return rows, summary


def _counts(eligible: list[dict], has_null: bool, has_un: bool) -> dict:
    """Head counts sparser than each control and mean sparsities over ``eligible`` rows."""
    n = len(eligible)
    out: dict[str, Any] = {"n_heads_eligible": n}
    kinds = (
        [("rotated", "sparsity_rotated")]
        + ([("null", "sparsity_null")] if has_null else [])
        + ([("unattended", "sparsity_unattended")] if has_un else [])
    )
    out["mean_sparsity"] = sum(r["sparsity"] for r in eligible) / n if n else None
    for kind, key in kinds:
        k = sum(r[f"sparser_than_{kind}"] for r in eligible)
        vals = [r[key] for r in eligible if r[key] is not None]
        out[f"n_heads_sparser_than_{kind}"] = k
        out[f"fraction_sparser_than_{kind}"] = k / n if n else None
        out[f"mean_{key}"] = sum(vals) / len(vals) if vals else None
    return out
