"""Pure tensor math. Knows nothing of models.

Shapes follow the convention ``[..., rows, cols]`` with any leading batch dimensions (heads,
instances). The factored SVD never forms the dense product: ``M = A @ B.mT`` with ``A: [..., m, r]``
and ``B: [..., n, r]`` is decomposed through QR of the thin factors, cost O((m + n) r^2).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class SVD:
    """Thin SVD ``M = U diag(S) V^T``; ``U: [..., m, k]``, ``S: [..., k]`` (descending), ``V: [..., n, k]``."""

    U: Tensor
    S: Tensor
    V: Tensor

    def dense(self) -> Tensor:
        return (self.U * self.S.unsqueeze(-2)) @ self.V.mT

    def truncate(self, k: int) -> "SVD":
        return SVD(self.U[..., :k], self.S[..., :k], self.V[..., :k])

    def to(self, dtype: torch.dtype) -> "SVD":
        return SVD(self.U.to(dtype), self.S.to(dtype), self.V.to(dtype))


@dataclass
class FactoredMatrix:
    """A matrix held as ``M = A @ B^T`` (``A: [..., m, r]``, ``B: [..., n, r]``), batched over leading dims."""

    A: Tensor
    B: Tensor

    def __post_init__(self) -> None:
        if self.A.shape[-1] != self.B.shape[-1] or self.A.shape[:-2] != self.B.shape[:-2]:
            raise ValueError(
                f"FactoredMatrix factors do not match: A {tuple(self.A.shape)} and B {tuple(self.B.shape)}"
                " need the same batch dims and inner size"
            )

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.A.shape[:-1], self.B.shape[-2]))

    @property
    def rank_bound(self) -> int:
        return min(self.A.shape[-1], self.A.shape[-2], self.B.shape[-2])

    def dense(self) -> Tensor:
        return self.A @ self.B.mT

    def __getitem__(self, idx) -> "FactoredMatrix":
        """Index the batch dimensions (e.g. one head)."""
        return FactoredMatrix(self.A[idx], self.B[idx])

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(self.B, self.A)

    def svd(self) -> SVD:
        return svd_factored(self.A, self.B)


def svd_factored(A: Tensor, B: Tensor) -> SVD:
    """Exact thin SVD of ``A @ B^T`` via QR of the factors; keeps ``min(m, n, r)`` directions."""
    Qa, Ra = torch.linalg.qr(A)  # [.., m, r'], [.., r', r]
    Qb, Rb = torch.linalg.qr(B)
    Uc, S, Vch = torch.linalg.svd(Ra @ Rb.mT)
    k = min(A.shape[-2], B.shape[-2], A.shape[-1])
    return SVD((Qa @ Uc)[..., :k], S[..., :k], (Qb @ Vch.mT)[..., :k])


def svd_dense(M: Tensor) -> SVD:
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    return SVD(U, S, Vh.mT)


def average_ranks(x: Tensor) -> Tensor:
    """Ranks ``0..n-1`` of the entries of ``x`` (flattened, float64); tied entries share their mean rank."""
    x = x.flatten()
    values, order = torch.sort(x, stable=True)
    _, group, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
    first = (torch.cumsum(counts, 0) - counts).double()
    ranks = torch.empty(x.numel(), dtype=torch.float64, device=x.device)
    ranks[order] = (first + (counts.double() - 1) / 2)[group]
    return ranks


def spearman(x: Tensor, y: Tensor) -> float:
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


def abs_cosine(X: Tensor, Y: Tensor, eps: float = 1e-12) -> Tensor:
    """``|cos|`` between the columns of ``X: [..., d, a]`` and ``Y: [..., d, b]`` -> ``[..., a, b]``."""
    Xn = X / X.norm(dim=-2, keepdim=True).clamp_min(eps)
    Yn = Y / Y.norm(dim=-2, keepdim=True).clamp_min(eps)
    return (Xn.mT @ Yn).abs()


def rolls_tovee_sparsity(c: Tensor, dim: int = -1, eps: float = 1e-30) -> Tensor:
    """Rolls–Tovee sparsity ``(mean |c|)^2 / mean c^2`` along ``dim``: in ``[1/n, 1]``, lower is sparser."""
    return c.abs().mean(dim) ** 2 / (c.pow(2).mean(dim) + eps)


def haar_orthogonal(n: int, *batch: int, generator: torch.Generator | None = None,
                    dtype: torch.dtype = torch.float32, device=None, columns: int | None = None) -> Tensor:
    """Haar-distributed random orthogonal matrices ``[*batch, n, n]`` (QR of a Gaussian, sign-fixed);
    ``columns=r`` gives only the first ``r`` columns ``[*batch, n, r]`` (Haar on the Stiefel manifold)."""
    G = torch.randn(*batch, n, n if columns is None else columns, generator=generator, dtype=torch.float64,
                    device=device)
    Q, R = torch.linalg.qr(G)
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
    return Q.to(dtype)


def orthogonality_to_others(W: Tensor, chosen: Tensor, eps: float = 1e-12) -> Tensor:
    """Max ``|cos|`` between each chosen column of ``W: [d, N]`` and every non-chosen column -> ``[len(chosen)]``."""
    cos = abs_cosine(W[:, chosen], W)
    mask = torch.ones(W.shape[-1], dtype=torch.bool, device=W.device)
    mask[chosen] = False
    return cos[:, mask].max(dim=-1).values if mask.any() else torch.zeros(len(chosen))
