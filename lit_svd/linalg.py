"""Pure tensor math. Knows nothing of models.

Shapes follow the convention ``[..., rows, cols]`` with any leading batch dimensions (heads,
instances). The factored SVD never forms the dense product: ``M = A @ B.mT`` with ``A: [..., m, r]``
and ``B: [..., n, r]`` is decomposed through QR of the thin factors, cost O((m + n) r^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lit_svd.option_checks import REL_GAP

NULL_RTOL = 1e-10
"""Relative tolerance of a null direction: a singular value at or below ``NULL_RTOL`` times its group's largest
(``SVD.without_null``). A bias-free augmented map has an exactly zero bias row (and a folded norm gain of 0 gives
zero rows or columns), so some of its singular values are 0; float64's SVD returns them at about ``n * 2.2e-16``
relative at most (n <= 2,048 here: 5e-13; measured <= 1.3e-15 on SmolLM2-135M and Gemma-3-270M) with a singular
vector that the routine picks freely. The smallest genuine singular values of those models sit at >= 2e-6 relative,
and a direction below ``1e-10`` of its map's largest contributes three orders of magnitude below float32's rounding
(6e-8 relative) to a float32 forward."""


@dataclass
class SVD:
    """Thin SVD ``M = U diag(S) V^T``; ``U: [..., m, k]``, ``S: [..., k]`` (descending), ``V: [..., n, k]``."""

    U: Float[Tensor, "*batch m k"]
    S: Float[Tensor, "*batch k"]
    V: Float[Tensor, "*batch n k"]

    def dense(self) -> Float[Tensor, "*batch m n"]:
        return (self.U * self.S.unsqueeze(-2)) @ self.V.mT

    def truncate(self, k: int) -> SVD:
        return SVD(self.U[..., :k], self.S[..., :k], self.V[..., :k])

    def to(self, dtype: torch.dtype) -> SVD:
        return SVD(self.U.to(dtype), self.S.to(dtype), self.V.to(dtype))

    def without_null(self, rtol: float = NULL_RTOL) -> SVD:
        """This SVD without its null directions (singular values ``<= rtol`` times their group's largest; groups:
        the leading batch dims): the trailing indices null in every group are dropped; where one group has lower
        rank than another, its remaining null directions are zeroed (``U``, ``S``, ``V`` columns), so no vector the
        SVD routine picked freely is left. ``dense()`` changes by the dropped values only."""
        live = self.S > rtol * self.S[..., :1]
        k = int(live.reshape(-1, live.shape[-1]).sum(-1).max()) if live.numel() else 0
        live = live[..., :k]
        keep = live.to(self.S.dtype)
        return SVD(self.U[..., :k] * keep.unsqueeze(-2), self.S[..., :k] * keep, self.V[..., :k] * keep.unsqueeze(-2))


@dataclass
class FactoredABt:
    """A matrix held as ``M = A @ B^T`` (``A: [..., m, r]``, ``B: [..., n, r]``), batched over leading dims.

    Named for its product: TransformerLens' ``FactoredMatrix(A, B)`` means ``A @ B`` (its ``B`` is this
    class's ``B^T``), so the two cannot be mistaken for one another.
    """

    A: Float[Tensor, "*batch m r"]
    B: Float[Tensor, "*batch n r"]

    def __post_init__(self) -> None:
        if self.A.shape[-1] != self.B.shape[-1] or self.A.shape[:-2] != self.B.shape[:-2]:
            raise ValueError(
                f"FactoredABt factors do not match: A {tuple(self.A.shape)} and B {tuple(self.B.shape)}"
                " need the same batch dims and inner size"
            )

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.A.shape[:-1], self.B.shape[-2]))

    def dense(self) -> Float[Tensor, "*batch m n"]:
        return self.A @ self.B.mT

    def __getitem__(self, idx: int | slice | Tensor | tuple) -> FactoredABt:
        """Index the batch dimensions (e.g. one head)."""
        return FactoredABt(self.A[idx], self.B[idx])

    @property
    def T(self) -> FactoredABt:
        return FactoredABt(self.B, self.A)

    def svd(self) -> SVD:
        return svd_factored(self.A, self.B)


def svd_factored(A: Float[Tensor, "*batch m r"], B: Float[Tensor, "*batch n r"]) -> SVD:
    """Exact thin SVD of ``A @ B^T`` via QR of the factors; keeps ``min(m, n, r)`` directions."""
    Qa, Ra = torch.linalg.qr(A)  # [.., m, r'], [.., r', r]
    Qb, Rb = torch.linalg.qr(B)
    Uc, S, Vch = torch.linalg.svd(Ra @ Rb.mT)
    k = min(A.shape[-2], B.shape[-2], A.shape[-1])
    return SVD((Qa @ Uc)[..., :k], S[..., :k], (Qb @ Vch.mT)[..., :k])


def svd_dense(M: Float[Tensor, "*batch m n"]) -> SVD:
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    return SVD(U, S, Vh.mT)


def average_ranks(x: Float[Tensor, "*shape"]) -> Float[Tensor, " n"]:
    """Ranks ``0..n-1`` of the entries of ``x`` (flattened, float64); tied entries share their mean rank."""
    x = x.flatten()
    values, order = torch.sort(x, stable=True)
    _, group, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
    first = (torch.cumsum(counts, 0) - counts).double()
    ranks = torch.empty(x.numel(), dtype=torch.float64, device=x.device)
    ranks[order] = (first + (counts.double() - 1) / 2)[group]
    return ranks


def spearman(x: Float[Tensor, "*xs"], y: Float[Tensor, "*ys"]) -> float:
    """Spearman's rank correlation of ``x`` and ``y`` (same number of entries): the Pearson correlation of
    their average ranks (ties share a rank, as ``scipy.stats.spearmanr``). NaN where it is undefined: a
    constant side, or a NaN entry."""
    if x.numel() != y.numel():
        raise ValueError(f"spearman needs two tensors of one size; got {x.numel()} and {y.numel()} entries")
    if x.isnan().any() or y.isnan().any():
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = rx.norm() * ry.norm()
    return float((rx @ ry) / denom) if denom > 0 else float("nan")


def abs_cosine(
    X: Float[Tensor, "*batch d a"], Y: Float[Tensor, "*batch d b"], eps: float = 1e-12
) -> Float[Tensor, "*batch a b"]:
    """``|cos|`` between the columns of ``X: [..., d, a]`` and ``Y: [..., d, b]`` -> ``[..., a, b]``."""
    Xn = X / X.norm(dim=-2, keepdim=True).clamp_min(eps)
    Yn = Y / Y.norm(dim=-2, keepdim=True).clamp_min(eps)
    return (Xn.mT @ Yn).abs()


def rolls_tovee_sparsity(c: Float[Tensor, "*shape"], dim: int = -1, eps: float = 1e-30) -> Float[Tensor, "*rest"]:
    """Rolls–Tovee sparsity ``(mean |c|)^2 / mean c^2`` along ``dim``: in ``[1/n, 1]``, lower is sparser."""
    return c.abs().mean(dim) ** 2 / (c.pow(2).mean(dim) + eps)


def haar_orthogonal(
    n: int,
    *batch: int,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    columns: int | None = None,
) -> Float[Tensor, "*batch n r"]:
    """Haar-distributed random orthogonal matrices ``[*batch, n, n]`` (QR of a Gaussian, sign-fixed);
    ``columns=r`` gives only the first ``r`` columns ``[*batch, n, r]`` (Haar on the Stiefel manifold)."""
    G = torch.randn(
        *batch, n, n if columns is None else columns, generator=generator, dtype=torch.float64, device=device
    )
    Q, R = torch.linalg.qr(G)
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
    return Q.to(dtype)


def orthogonality_to_others(
    W: Float[Tensor, "d N"], chosen: Int[Tensor, " c"], eps: float = 1e-12
) -> Float[Tensor, " c"]:
    """Max ``|cos|`` between each chosen column of ``W: [d, N]`` and every non-chosen column -> ``[len(chosen)]``."""
    cos = abs_cosine(W[:, chosen], W)
    mask = torch.ones(W.shape[-1], dtype=torch.bool, device=W.device)
    mask[chosen] = False
    return cos[:, mask].max(dim=-1).values if mask.any() else torch.zeros(len(chosen))


# --- identifiability: numerical rank, near-degenerate blocks, matching ------------------------------------
#
# Inside a block of (nearly) equal singular values the individual singular vectors are arbitrary: any rotation
# of the block is an equally valid SVD. By Wedin's theorem a perturbation E turns a singular subspace by at most
# ``sin(theta) <= ||E|| / gap``, so a direction is only as stable as its gap to its neighbours. REL_GAP = 0.05:
# with a relative gap of 5 % of sigma_i, a perturbation of 1 % of sigma_i (e.g. a few hundred fine-tuning steps,
# a different seed, float16 rounding of a checkpoint) moves the vector by at most asin(0.2) ~ 0.2 rad
# (|cos| >= 0.98); below that gap a claim about one vector of the pair is not reproducible. The value lives in
# ``option_checks`` (torch-free: the option checks default to it too).


@dataclass
class DirectionBlocks:
    """Per direction of a descending spectrum ``S: [..., k]``: ``block`` (0-based id, in order of sigma),
    ``size`` (directions in its block), ``first`` (its block's first direction), ``gap`` (relative gap from its
    block to the nearest singular value outside it, in [0, 1]; 1 where there is no neighbour), ``isolated`` (a
    block of one, within the rank) and ``rank`` (numerical rank ``[...]``). Directions past the rank form one block of
    their own."""

    block: Int[Tensor, "*batch k"]
    size: Int[Tensor, "*batch k"]
    first: Int[Tensor, "*batch k"]
    gap: Float[Tensor, "*batch k"]
    isolated: Bool[Tensor, "*batch k"]
    rank: Int[Tensor, "*batch"]


def relative_gaps(S: Float[Tensor, "*batch k"]) -> Float[Tensor, "*batch k-1"]:
    """``(S_i - S_{i+1}) / S_i`` between neighbours of a descending spectrum -> ``[..., k-1]`` (0 where S_i = 0)."""
    S = S.double()
    return torch.where(S[..., :-1] > 0, (S[..., :-1] - S[..., 1:]) / S[..., :-1].clamp_min(1e-300), 0.0)


def numerical_rank(S: Float[Tensor, "*batch k"], size: int, rtol: float | None = None) -> Int[Tensor, "*batch"]:
    """Number of singular values above ``rtol * S_max`` (default ``rtol = size * eps(dtype)``, the usual
    ``matrix_rank`` rule; ``size = max(m, n)``) -> ``[...]``."""
    rtol = size * torch.finfo(S.dtype).eps if rtol is None else rtol
    return (S > rtol * S[..., :1]).sum(-1)


def direction_blocks(
    S: Float[Tensor, "*batch k"], rel_gap: float = REL_GAP, size: int | None = None, rtol: float | None = None
) -> DirectionBlocks:
    """Group a descending spectrum ``S: [..., k]`` into blocks: neighbours whose relative gap is below ``rel_gap``
    share a block (chains join: a slowly decaying spectrum is one block). ``size`` is ``max(m, n)`` of the
    matrix, for the rank tolerance (default ``k``)."""
    if not 0 <= rel_gap < 1:
        raise ValueError(f"rel_gap={rel_gap!r}: must be in [0, 1)")
    k = S.shape[-1]
    rank = numerical_rank(S, size or k, rtol)
    idx = torch.arange(k, device=S.device)
    gaps = relative_gaps(S)  # [..., k-1]
    past = idx[1:] >= rank.unsqueeze(-1)  # the boundary before direction i+1 lies in or at the null block
    starts_null = idx[1:] == rank.unsqueeze(-1)
    split = torch.where(past, starts_null, gaps >= rel_gap)  # a new block starts at i+1
    first = torch.zeros_like(S[..., :1], dtype=torch.bool)
    new = torch.cat([first | True, split], -1)
    block = new.long().cumsum(-1) - 1
    start = torch.where(new, idx, 0).cummax(-1).values
    new_rev = torch.cat([split, first | True], -1).flip(-1)  # block ends, read from the right
    end = (k - 1 - torch.where(new_rev, idx, 0).cummax(-1).values).flip(-1)
    one = torch.ones_like(S[..., :1], dtype=torch.float64)
    padded = torch.cat([one, gaps, one], -1)  # padded[i] = gap above direction i, padded[i+1] = gap below
    gap = torch.minimum(padded.gather(-1, start), padded.gather(-1, end + 1))
    size_ = end - start + 1
    return DirectionBlocks(block, size_, start, gap, (size_ == 1) & (idx < rank.unsqueeze(-1)), rank)


def sign_fixed(svd: SVD) -> SVD:
    """The SVD with each direction's sign chosen so that the largest-|entry| of its left vector is positive
    (``U`` and ``V`` flip together; the product is unchanged)."""
    pick = svd.U.abs().argmax(-2, keepdim=True)
    sign = torch.where(svd.U.gather(-2, pick) < 0, -1.0, 1.0).to(svd.U.dtype)
    return SVD(svd.U * sign, svd.S, svd.V * sign)


@dataclass
class DirectionMatch:
    """Where each direction ``i`` of a reference SVD went in another SVD of (nearly) the same matrix:
    ``index[i]`` (its partner), ``sign[i]`` (+1/-1 to apply to the partner's U and V), ``cos[i]`` (signed
    cosine of the joint vectors ``[u; v] / sqrt 2`` after the sign, in [-1, 1]; for isolated directions this is
    the identity check) and ``block_cos[i]`` (cosine of the largest principal angle between the reference block
    containing ``i`` and the span of its partners; 1 = the same subspace)."""

    index: Int[Tensor, " k"]
    sign: Float[Tensor, " k"]
    cos: Float[Tensor, " k"]
    block_cos: Float[Tensor, " k"]


def _joint(svd: SVD) -> Float[Tensor, "m+n k"]:
    return torch.cat([svd.U, svd.V], -2).double() / 2**0.5  # orthonormal columns [m + n, k]


def match_directions(ref: SVD, new: SVD, rel_gap: float = REL_GAP) -> DirectionMatch:
    """Block-aware matching of the directions of ``new`` to those of ``ref`` (unbatched, same shape): each
    reference block of m directions receives the m directions of ``new`` that put the most energy into its
    span (one Hungarian assignment over all blocks at once); isolated directions are thereby matched on their
    squared cosine, and sign-fixed by the sign of the cosine."""
    from scipy.optimize import linear_sum_assignment

    if ref.U.shape != new.U.shape or ref.V.shape != new.V.shape:
        raise ValueError(
            f"match_directions needs SVDs of one shape; got U {tuple(ref.U.shape)} and "
            f"{tuple(new.U.shape)}, V {tuple(ref.V.shape)} and {tuple(new.V.shape)}"
        )
    if ref.U.dim() != 2:
        raise ValueError(f"match_directions is unbatched; got U of shape {tuple(ref.U.shape)} (index the batch first)")
    blocks = direction_blocks(ref.S, rel_gap, size=max(ref.U.shape[-2], ref.V.shape[-2]))
    Wr, Wn = _joint(ref), _joint(new)
    C = Wr.mT @ Wn  # [k, k] signed cosines
    n_blocks = int(blocks.block.max()) + 1
    energy = torch.zeros(n_blocks, C.shape[1], dtype=C.dtype).index_add_(0, blocks.block, C.pow(2))
    rows, cols = linear_sum_assignment(energy[blocks.block].numpy(), maximize=True)
    index = torch.as_tensor(cols)[torch.as_tensor(rows).argsort()]
    signed = C.gather(1, index[:, None]).squeeze(1)
    sign = torch.where(signed < 0, -1.0, 1.0)
    block_cos = torch.empty(len(index), dtype=torch.float64)
    for b in range(n_blocks):
        members = (blocks.block == b).nonzero().squeeze(1)
        block_cos[members] = torch.linalg.svdvals(Wr[:, members].mT @ Wn[:, index[members]]).min()
    return DirectionMatch(index, sign.to(ref.S.dtype), (signed * sign).to(ref.S.dtype), block_cos.to(ref.S.dtype))


def align_directions(ref: SVD, new: SVD, rel_gap: float = REL_GAP) -> tuple[SVD, DirectionMatch]:
    """``new`` reordered and sign-flipped so that its direction ``i`` is reference direction ``i``'s partner."""
    m = match_directions(ref, new, rel_gap)
    return SVD(new.U[:, m.index] * m.sign, new.S[m.index], new.V[:, m.index] * m.sign), m
