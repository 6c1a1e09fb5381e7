"""Tiled-SVD mounts of a linear site and their scores on real activations (pure functions).

A *site* is one linear map ``dh = W x + b`` of a transformer layer (q, k, v, o, gate, up, down),
``W: [d_out, d_in]``. A *mount* is a triple (trigger ``v`` in input space, write ``u`` in output
space, strength ``sigma``). Tiled SVD splits the input columns into tiles ``B_t = W[:, s:e]`` and
keeps the top ``k`` singular triples of each tile, so ``B_t x_t = sum_j sigma_j u_j (v_j . x_t)``
up to the dropped modes (the *SVD identity*). Three baselines get the same number of mounts: the
whole-matrix SVD, norm-weighted column sampling, and random unit directions.

Every data statistic is a *sum over tokens* (``site_sums``: a dict of named sums), so it streams
over batches and DDP ranks and is turned into figures only at the end (``summarize``). Two controls
bound what the figures can mean: the *data ceiling* (the span figure of the top-``n`` principal
directions of the outputs themselves, ``span_ceiling``) and the *structureless null* (``haar_null``:
the same singular values with Haar-random singular vectors, scored by the same rules).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lit_svd import linalg
from lit_svd.choices import choices
from lit_svd.linalg import SVD, haar_orthogonal, svd_dense
from lit_svd.models.base import SITES

Strategy = Literal["tiled", "whole", "columns", "random"]
STRATEGIES: tuple[Strategy, ...] = choices(Strategy)
EPS = 1e-12
ResidualSite = Literal["o", "down"]  # the sites that write to the residual stream
RESIDUAL_SITES: tuple[ResidualSite, ...] = choices(ResidualSite)
REF_SEED, REF_STRIDE = 10007, 997  # per-mount random reference direction j uses seed 10007 + 997 j


@dataclass
class Mounts:
    """``n`` mounts: writes ``U: [d_out, n]`` (unit), triggers ``V: [d_in, n]`` (unit, zero outside
    the mount's tile), strengths ``S: [n]``, tile index ``tile: [n]`` (-1 when not tiled)."""

    U: Float[Tensor, "d_out n"]
    V: Float[Tensor, "d_in n"]
    S: Float[Tensor, " n"]
    tile: Int[Tensor, " n"]

    def __len__(self) -> int:
        return self.U.shape[1]


# --- building mounts ------------------------------------------------------------------------------
def tile_bounds(d_in: int, tile_width: int, key: str = "tile_width") -> list[tuple[int, int]]:
    """Column ranges ``[(s, e), ...]`` of the tiles (the last one may be narrower)."""
    if not isinstance(tile_width, int) or tile_width <= 0 or tile_width > d_in:
        raise ValueError(
            f"{key}={tile_width!r} is not allowed: a tile width must be an integer in 1..{d_in} (the site's input size)"
        )
    return [(s, min(s + tile_width, d_in)) for s in range(0, d_in, tile_width)]


def check_modes(modes: int, tile_width: int, d_out: int, key: str = "modes_per_tile") -> int:
    if not isinstance(modes, int) or modes <= 0 or modes > min(tile_width, d_out):
        raise ValueError(
            f"{key}={modes!r} is not allowed: modes per tile must be an integer in "
            f"1..{min(tile_width, d_out)} (at most the tile width {tile_width} and output size {d_out})"
        )
    return modes


def top_svd(B: Float[Tensor, "m n"], k: int) -> SVD:
    """The top ``k`` singular triples (``U [m, k]``, ``S [k]``, ``V [n, k]``) of ``B`` (float64), from the
    eigen-decomposition of the Gram matrix of its smaller side: exact for the leading triples and far
    cheaper than a full SVD (``k`` is at most ``min(B.shape)``)."""
    B = B.double()
    k = min(k, *B.shape)
    left = B.shape[0] <= B.shape[1]
    evals, evecs = torch.linalg.eigh(B @ B.mT if left else B.mT @ B)
    evecs = evecs[:, -k:].flip(1)
    S = evals[-k:].flip(0).clamp_min(0).sqrt()
    other = (B.mT @ evecs if left else B @ evecs) / S.clamp_min(EPS)
    U, V = (evecs, other) if left else (other, evecs)
    return SVD(U, S, V)


def tile_svds(W: Float[Tensor, "d_out d_in"], bounds: list[tuple[int, int]], k: int) -> list[SVD]:
    """Top ``k`` singular triples of each column tile ``W[:, s:e]`` (float64)."""
    return [top_svd(W[:, s:e], k) for s, e in bounds]


def mounts_from_tiles(svds: list[SVD], bounds: list[tuple[int, int]], d_in: int, modes: int) -> Mounts:
    """The top ``modes`` triples of each tile (a ragged last tile keeps at most its rank)."""
    Us, Vs, Ss, tiles = [], [], [], []
    for t, (svd, (s, e)) in enumerate(zip(svds, bounds)):
        k = min(modes, svd.S.numel())
        V = torch.zeros(d_in, k, dtype=torch.float64, device=svd.V.device)
        V[s:e] = svd.V[:, :k]
        Us.append(svd.U[:, :k])
        Vs.append(V)
        Ss.append(svd.S[:k])
        tiles.append(torch.full((k,), t, device=svd.V.device))
    return Mounts(torch.cat(Us, 1), torch.cat(Vs, 1), torch.cat(Ss), torch.cat(tiles))


def tiled_svd_mounts(W: Float[Tensor, "d_out d_in"], tile_width: int, modes: int) -> Mounts:
    """Top ``modes`` singular triples of each column tile of ``W: [d_out, d_in]``."""
    d_out, d_in = W.shape
    bounds = tile_bounds(d_in, tile_width)
    check_modes(modes, tile_width, d_out)
    return mounts_from_tiles(tile_svds(W, bounds, modes), bounds, d_in, modes)


def whole_svd_mounts(W: Float[Tensor, "d_out d_in"], n: int) -> Mounts:
    """The top ``n`` singular triples of the whole matrix."""
    if n > min(W.shape):
        raise ValueError(
            f"mount budget {n} exceeds the rank bound {min(W.shape)} of the {tuple(W.shape)} site;"
            " lower modes_per_tile or widen the tiles"
        )
    svd = top_svd(W, n)
    return Mounts(svd.U, svd.V, svd.S, torch.full((n,), -1, device=W.device))


def column_sample_mounts(W: Float[Tensor, "d_out d_in"], n: int, seed: int = 0) -> Mounts:
    """Draw ``min(4n, d_in)`` columns without replacement with probability proportional to their
    norm, keep the ``n`` of highest norm; write = the normalised column, trigger = that input axis.
    The draw is made on the CPU (the same columns on every device)."""
    W = W.double()
    norms = W.norm(dim=0)
    g = torch.Generator().manual_seed(seed)
    drawn = torch.multinomial(norms.cpu().clamp_min(EPS), min(4 * n, W.shape[1]), replacement=False, generator=g)
    drawn = drawn.to(W.device)
    cols = drawn[norms[drawn].argsort(descending=True)[:n]]
    V = torch.zeros(W.shape[1], n, dtype=torch.float64, device=W.device)
    V[cols, torch.arange(n, device=W.device)] = 1.0
    return Mounts(W[:, cols] / norms[cols].clamp_min(EPS), V, norms[cols], torch.full((n,), -1, device=W.device))


def random_units(d: int, n: int, seed: int) -> Float[Tensor, "d n"]:
    """``n`` Gaussian unit vectors ``[d, n]`` from one seeded generator."""
    X = torch.randn(d, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return X / X.norm(dim=0, keepdim=True)


def random_mounts(d_out: int, d_in: int, n: int, seed: int = 0) -> Mounts:
    """Random unit writes (``seed``) and triggers (``seed + 1``), strength 1."""
    U, V = random_units(d_out, n, seed), random_units(d_in, n, seed + 1)  # seeded draws: on the CPU
    return Mounts(U, V, torch.ones(n, dtype=torch.float64, device=U.device), torch.full((n,), -1, device=U.device))


def reference_directions(d_out: int, n: int) -> Float[Tensor, "d_out n"]:
    """The per-mount random references ``[d_out, n]``: column j from its own seed ``10007 + 997 j``, so
    mount j of every strategy is compared with the same random direction."""
    return torch.cat([random_units(d_out, 1, REF_SEED + REF_STRIDE * j) for j in range(n)], dim=1)


def strategy_mounts(
    W: Float[Tensor, "d_out d_in"], tile_width: int, modes: int, seed: int = 0, tiled: Mounts | None = None
) -> dict[str, Mounts]:
    """The four strategies at the tiled budget ``n`` (the number of tiled mounts)."""
    tiled = tiled if tiled is not None else tiled_svd_mounts(W, tile_width, modes)
    n = len(tiled)
    return {
        "tiled": tiled,
        "whole": whole_svd_mounts(W, n),
        "columns": column_sample_mounts(W, n, seed),
        "random": random_mounts(W.shape[0], W.shape[1], n, seed),
    }


# --- effective paths ------------------------------------------------------------------------------
def gate_weighted(W_up: Float[Tensor, "d_mlp d_in"], mean_gate: Float[Tensor, " d_mlp"]) -> Float[Tensor, "d_mlp d_in"]:
    """``W* = diag(mean gate activation) W_up``: the up map as seen through the average gate."""
    return mean_gate.to(W_up.dtype).unsqueeze(1) * W_up


def ridge_map(XtX: Float[Tensor, "d_x d_x"], XtZ: Float[Tensor, "d_x d_z"], ridge: float) -> Float[Tensor, "d_z d_x"]:
    """``W: [d_z, d_x]`` minimising ``sum_t ||z_t - W x_t||^2 + lam ||W||^2`` from the sufficient
    statistics ``X^T X`` and ``X^T Z``; ``lam = ridge * trace(X^T X) / d_x`` (scale-free)."""
    if ridge < 0:
        raise ValueError(f"v_ridge={ridge!r} is not allowed: the ridge strength must be >= 0")
    d = XtX.shape[0]
    lam = ridge * torch.trace(XtX) / d
    A = XtX.double() + lam * torch.eye(d, dtype=torch.float64, device=XtX.device)
    return torch.linalg.solve(A, XtZ.double()).mT


# --- streaming statistics -------------------------------------------------------------------------
def orthonormal_span(U: Float[Tensor, "d n"], rtol: float = 1e-8) -> Float[Tensor, "d r"]:
    """Orthonormal basis of the column span of ``U`` (numerical rank kept)."""
    svd = svd_dense(U)
    return svd.U[:, svd.S > rtol * svd.S.max()]


@dataclass
class CoverageDict:
    """A dictionary ``D: [d_out, n]`` (unit columns) and its Gram matrix, for sparse coverage."""

    D: Float[Tensor, "d_out n"]
    G: Float[Tensor, "n n"]

    @classmethod
    def of(cls, D: Tensor) -> CoverageDict:
        D = D / D.norm(dim=0, keepdim=True).clamp_min(EPS)
        return cls(D, D.mT @ D)


def sparse_explained(c: Float[Tensor, "T n"], G: Float[Tensor, "n n"], k_active: int) -> Float[Tensor, ""]:
    """``sum_t ||P_t dh_t||^2``: energy of each ``dh_t`` explained by the least-squares fit on its
    ``k_active`` dictionary atoms of largest ``|<dh_t, d>|``, from the projections ``c = dh D: [T, n]``
    and the dictionary's Gram matrix ``G = D^T D``. The fit is solved on the atoms' Gram block
    (explained energy ``c_k^T G_k^{-1} c_k``), so nothing of size ``d_out`` is gathered per token."""
    return sparse_explained_many([(c, G)], k_active)[0]


def sparse_explained_many(pairs: list[tuple[Tensor, Tensor]], k_active: int) -> Tensor:
    """``sparse_explained`` of several dictionaries ``[(c, G), ...]`` at once ``[len(pairs)]``: the
    Gram blocks of every dictionary and token go through one batched Cholesky solve."""
    cks, Gks, owner = [], [], []
    for i, (c, G) in enumerate(pairs):
        c = c.double()
        k = min(k_active, c.shape[1])
        idx = c.abs().topk(k, dim=1).indices  # [T, k]
        cks.append(c.gather(1, idx).unsqueeze(2))
        Gks.append(G[idx.unsqueeze(2), idx.unsqueeze(1)])  # [T, k, k]
        owner.append(torch.full((c.shape[0],), i, device=c.device))
    if len({ck.shape[1] for ck in cks}) > 1:  # a dictionary smaller than k_active: solve separately
        return torch.cat([sparse_explained_many([p], k_active) for p in pairs])
    ck, Gk, owners = torch.cat(cks), torch.cat(Gks), torch.cat(owner)
    L, info = torch.linalg.cholesky_ex(Gk)
    ok = info == 0
    per_token = torch.zeros(len(ck), dtype=torch.float64, device=ck.device)
    per_token[ok] = (torch.linalg.solve_triangular(L[ok], ck[ok], upper=False) ** 2).sum((1, 2))
    if not ok.all():  # (near-)dependent atoms: pseudo-inverse through the eigenbasis
        evals, evecs = torch.linalg.eigh(Gk[~ok])
        proj = (evecs.mT @ ck[~ok]).squeeze(2)
        keep = evals > 1e-10 * evals[:, -1:].clamp_min(EPS)
        per_token[~ok] = (proj**2 / torch.where(keep, evals, torch.ones_like(evals)) * keep).sum(1)
    return torch.zeros(len(pairs), dtype=torch.float64, device=ck.device).index_add_(0, owners, per_token)


@dataclass(frozen=True)
class SitePlan:
    """Everything fixed by the weights that scoring one site-layer needs, complete at construction
    (``plan_site`` builds it)."""

    W: Tensor  # [d_out, d_in] float32: the mount matrix (effective map on effective paths)
    strategies: dict[str, Mounts]
    ref: Tensor  # [d_out, n]
    spans: dict[str, Tensor]
    coverage: list[tuple[int, CoverageDict, CoverageDict]]  # (modes, tiled, random same size)
    tiles: list[tuple[int, int]]
    k_active: int
    proj: Tensor  # [d_out, N] float32: every direction dh is projected on, side by side
    blocks: dict[str, slice]  # where each group of directions sits in proj
    V32: Tensor  # [d_in, n] float32: sigma_j v_j of the tiled mounts
    affine: Tensor | None = None  # [d_out, d_in + 1] float64 [W | b]: the ceiling is summed on the input side

    @property
    def n(self) -> int:
        return len(self.strategies["tiled"])

    def to(self, device: torch.device | str) -> SitePlan:
        """The same plan with its tensors on ``device`` (where the activations are scored); the coverage
        atoms stay views of ``proj``. Plans are built on the CPU in float64 (``plan_site``), so every
        device scores the same mounts."""
        proj = self.proj.to(device)
        mv = lambda t: t.to(device)  # noqa: E731
        coverage = [
            (
                m,
                CoverageDict(proj[:, self.blocks[f"cov_t{i}"]], mv(t.G)),
                CoverageDict(proj[:, self.blocks[f"cov_r{i}"]], mv(r.G)),
            )
            for i, (m, t, r) in enumerate(self.coverage)
        ]
        strategies = {s: Mounts(mv(m.U), mv(m.V), mv(m.S), mv(m.tile)) for s, m in self.strategies.items()}
        spans = {s: mv(Q) for s, Q in self.spans.items()}
        affine = None if self.affine is None else mv(self.affine)
        return SitePlan(
            mv(self.W),
            strategies,
            mv(self.ref),
            spans,
            coverage,
            self.tiles,
            self.k_active,
            proj,
            self.blocks,
            mv(self.V32),
            affine,
        )

    @property
    def d_out(self) -> int:
        return self.W.shape[0]

    @property
    def gram_dim(self) -> int:
        """Side of the ceiling's Gram statistic (``d_out``, or ``d_in + 1`` on the input side)."""
        return self.d_out if self.affine is None else self.affine.shape[1]

    @property
    def n_stat(self) -> int:
        """Columns of ``proj`` whose energy ratios are summed (lifts, references, spans; coverage follows)."""
        return self.blocks[f"span_{STRATEGIES[-1]}"].stop


def ceiling_dim(d_in: int, d_out: int, linear: bool) -> int:
    """Side of a site's ceiling Gram: ``d_in + 1`` when the scored write is exactly ``W x + b``
    (``linear``) and that side is smaller (e.g. gate / up: 577 against 1536), else ``d_out``."""
    return d_in + 1 if linear and d_in + 1 < d_out else d_out


def plan_site(
    W: Tensor,
    tile_width: int,
    modes: int,
    modes_sweep: list[int] | tuple[int, ...],
    k_active: int,
    seed: int = 0,
    key: str = "tile_width",
    linear: bool = False,
    bias: Tensor | None = None,
) -> SitePlan:
    """Build the mounts of all strategies, references, span bases and coverage dictionaries of ``W``, on the
    CPU in float64 whatever device ``W`` is on (seeded draws and eigen-decompositions then give the same
    plan everywhere; ``SitePlan.to`` moves it to where the activations are).

    ``linear``: the scored writes are exactly ``dh = W x + bias`` (a module site), so the ceiling's
    Gram may be summed on the input side when that is smaller (``ceiling_dim``)."""
    W = W.detach().double().cpu()
    d_out, d_in = W.shape
    affine = None
    if ceiling_dim(d_in, d_out, linear) != d_out:
        b = torch.zeros(d_out, dtype=torch.float64) if bias is None else bias.detach().double().cpu()
        affine = torch.cat([W, b.reshape(d_out, 1)], dim=1)
    tiles = tile_bounds(d_in, tile_width, key)
    if not isinstance(k_active, int) or k_active <= 0:
        raise ValueError(f"k_active={k_active!r} is not allowed: it must be a positive integer")
    check_modes(modes, tile_width, d_out)
    for m in modes_sweep:
        check_modes(m, tile_width, d_out, "modes_sweep")
    svds = tile_svds(W, tiles, max(modes, *modes_sweep))  # once, shared by the strategy and the sweep
    strategies = strategy_mounts(W, tile_width, modes, seed, mounts_from_tiles(svds, tiles, d_in, modes))
    n = len(strategies["tiled"])
    coverage = []
    for m in modes_sweep:
        D = mounts_from_tiles(svds, tiles, d_in, m).U
        coverage.append((m, CoverageDict.of(D), CoverageDict.of(random_units(d_out, D.shape[1], seed + 2))))
    ref = reference_directions(d_out, n)
    spans = {s: orthonormal_span(mt.U) for s, mt in strategies.items()}
    groups = {
        **{f"lift_{s}": m.U for s, m in strategies.items()},
        "ref": ref,
        **{f"span_{s}": Q for s, Q in spans.items()},
        **{f"cov_t{i}": t.D for i, (_, t, _) in enumerate(coverage)},
        **{f"cov_r{i}": r.D for i, (_, _, r) in enumerate(coverage)},
    }
    blocks, start = {}, 0
    for name, D in groups.items():
        blocks[name] = slice(start, start + D.shape[1])
        start += D.shape[1]
    proj = torch.cat(list(groups.values()), dim=1).float()
    # the dictionaries keep their float64 Gram matrices; their atoms become views of proj (no second copy)
    coverage = [
        (m, CoverageDict(proj[:, blocks[f"cov_t{i}"]], t.G), CoverageDict(proj[:, blocks[f"cov_r{i}"]], r.G))
        for i, (m, t, r) in enumerate(coverage)
    ]
    return SitePlan(
        W.float(),
        strategies,
        ref,
        spans,
        coverage,
        tiles,
        k_active,
        proj,
        blocks,
        (strategies["tiled"].V * strategies["tiled"].S).float(),
        affine,
    )


# --- tile widths ---------------------------------------------------------------------------------
# The paper's (Gemma-2-2B) absolute tile widths and the input size of each site in Gemma-2-2B
# (d_model 2304; o reads 8 heads x 256 = 2048; down reads d_mlp 9216).
PAPER_TILE_WIDTHS = {"q": 128, "k": 256, "v": 256, "o": 512, "gate": 512, "up": 512, "down": 512}
PAPER_D_IN = {"q": 2304, "k": 2304, "v": 2304, "o": 2048, "gate": 2304, "up": 2304, "down": 9216}


def paper_tiles(site: str) -> int:
    """Tiles per site in the paper's setting: ``ceil(d_in / width)`` on Gemma-2-2B (q 18, k / v 9,
    o 4, gate / up 5 (4.5: the last one half wide), down 18)."""
    return -(-PAPER_D_IN[site] // PAPER_TILE_WIDTHS[site])


def scaled_tile_width(site: str, d_in: int) -> int:
    """The paper's width as the same fraction of the site's input: ``ceil(d_in * w_paper / d_in_paper)``.
    It is the paper's width on Gemma-2-2B itself and gives the paper's number of tiles
    (``paper_tiles``) on a smaller model (SmolLM2: q 32, k / v 64, o 144, gate / up 128, down 86)."""
    return max(1, -(-d_in * PAPER_TILE_WIDTHS[site] // PAPER_D_IN[site]))


def tile_widths_for(tile_widths: str | dict[str, int], d_in: dict[str, int]) -> dict[str, int]:
    """Tile width per site of ``d_in`` (``{site: input size}``): ``"scaled"`` (``scaled_tile_width``: the paper's
    number of tiles), ``"fixed"`` (the paper's absolute widths) or a dict (sites it does not give: fixed)."""
    if tile_widths == "scaled":
        return {s: scaled_tile_width(s, n) for s, n in d_in.items()}
    if tile_widths == "fixed":
        return {s: PAPER_TILE_WIDTHS[s] for s in d_in}
    if not isinstance(tile_widths, dict):
        raise ValueError(
            f"tile_widths={tile_widths!r} is not allowed: give 'scaled', 'fixed' or a dict of widths per site"
        )
    unknown = sorted(set(tile_widths) - set(PAPER_TILE_WIDTHS))
    if unknown:
        raise ValueError(f"tile_widths key {unknown[0]!r} is unknown; allowed: {', '.join(PAPER_TILE_WIDTHS)}")
    return {s: int(tile_widths.get(s, PAPER_TILE_WIDTHS[s])) for s in d_in}


def mount_count(d_in: int, d_out: int, tile_width: int, modes: int) -> int:
    """How many tiled mounts ``tiled_svd_mounts`` makes: ``min(modes, tile rank bound)`` per tile."""
    return sum(min(modes, e - s, d_out) for s, e in tile_bounds(d_in, tile_width))


# --- the structureless null ---------------------------------------------------------------------
NULL_SEED, NULL_LAYER_STRIDE = 20011, 101


def null_seed(layer: int, site: str) -> int:
    """The seed of (layer, site)'s structureless null: ``20011 + 101 layer + site index``."""
    return NULL_SEED + NULL_LAYER_STRIDE * layer + SITES.index(site)


def haar_null(W: Float[Tensor, "d_out d_in"], seed: int) -> Float[Tensor, "d_out d_in"]:
    """A matrix with ``W``'s singular values and Haar-random singular vectors (float64):
    ``U0 diag(S) V0^T`` with ``U0``, ``V0`` the first ``r`` columns of Haar-random orthogonal matrices."""
    W = W.detach().double().cpu()
    d_out, d_in = W.shape
    S = torch.linalg.svdvals(W)
    g = torch.Generator().manual_seed(seed)
    U0 = haar_orthogonal(d_out, columns=len(S), generator=g, dtype=torch.float64)
    V0 = haar_orthogonal(d_in, columns=len(S), generator=g, dtype=torch.float64)
    return (U0 * S) @ V0.mT


# --- streaming statistics: named token sums ------------------------------------------------------
def sum_shapes(n: int, n_sweep: int, d_gram: int, ceiling: bool = True) -> dict[str, tuple[int, ...]]:
    """Name and shape of every token sum ``site_sums`` returns for a plan with ``n`` mounts, a
    coverage sweep of ``n_sweep`` points and a ceiling Gram of side ``d_gram`` (``plan.gram_dim``:
    ``d_out``, or ``d_in + 1`` on the input side; ``gram``: the ceiling's statistic)."""
    shapes = {
        "tokens": (),
        "energy": (),
        "lift": (len(STRATEGIES), n),
        "ref": (n,),
        "span": (len(STRATEGIES),),
        "cover_tiled": (n_sweep,),
        "cover_random": (n_sweep,),
        "tile_mode": (n,),
        "tile_ref": (n,),
        "ident_err": (n,),
        "ident_norm": (n,),
    }
    if ceiling:
        shapes["gram"] = (d_gram, d_gram)
    return shapes


def site_sums(plan: SitePlan, x: Tensor, dh: Tensor | None, ceiling: bool = True) -> dict[str, Tensor]:
    """All token sums of one batch, by name (float64; see ``sum_shapes``).

    ``x: [T, d_in]`` is the site input (what ``W`` reads), ``dh: [T, d_out]`` the write scored
    (the site output, or the gated product / mixed value on effective paths); ``dh=None`` scores the
    plan's own outputs ``x W^T`` (the structureless null), summed from the tile writes computed anyway.
    ``gram`` (with ``ceiling``) is ``sum_t dh_t dh_t^T / (||dh_t||^2 + eps)``, whose top ``n``
    eigenvalues are the data ceiling of the span figure (on the input side when ``plan.affine``)."""
    x = x.float().contiguous()  # a strided token subset (the null's) is gathered once, not once per tile
    # tile-local statistics of the tiled mounts: tile write tw = B_t x_t, its energy along u_j
    # (tile_mode), along the reference (tile_ref), and the SVD identity tw . u_j = sigma_j (v_j . x)
    tiled, b = plan.strategies["tiled"], plan.blocks
    trig = (x @ plan.V32).double()  # [T, n]: sigma_j (v_j . x_t)
    U32, ref32 = plan.proj[:, b["lift_tiled"]], plan.proj[:, b["ref"]]
    tm, tr, ie, inn = (torch.zeros(plan.n, dtype=torch.float64, device=x.device) for _ in range(4))
    own = dh is None
    for t, (s, e) in enumerate(plan.tiles):
        j = (tiled.tile == t).nonzero().squeeze(1)
        tw = x[:, s:e] @ plan.W[:, s:e].mT
        if own:  # the tiles' writes add up to x W^T
            dh = tw if dh is None else dh.add_(tw)
        tn2 = (tw * tw).sum(1).double().unsqueeze(1) + EPS
        proj, rp = (tw @ U32[:, j]).double(), (tw @ ref32[:, j]).double()
        tm[j] = (proj**2 / tn2).sum(0)
        tr[j] = (rp**2 / tn2).sum(0)
        ie[j] = ((proj - trig[:, j]) ** 2).sum(0)
        inn[j] = (proj**2).sum(0)
    assert dh is not None  # a plan has at least one tile
    dh = dh.float()
    P = dh @ plan.proj  # [T, N]: every projection at once
    norm2 = (dh.double() ** 2).sum(1)
    ratio = (P[:, : plan.n_stat].double() ** 2 / (norm2 + EPS).unsqueeze(1)).sum(0)  # lifts, refs, spans
    cover = sparse_explained_many(
        [
            (P[:, b[f"cov_{kind}{i}"]], d.G)
            for kind in "tr"
            for i, d in enumerate(c[1] if kind == "t" else c[2] for c in plan.coverage)
        ],
        plan.k_active,
    )
    n_sweep = len(plan.coverage)
    out = {
        "tokens": torch.tensor(float(dh.shape[0]), dtype=torch.float64, device=dh.device),
        "energy": norm2.sum(),
        "lift": torch.stack([ratio[b[f"lift_{s}"]] for s in STRATEGIES]),
        "ref": ratio[b["ref"]],
        "span": torch.stack([ratio[b[f"span_{s}"]].sum() for s in STRATEGIES]),
        "cover_tiled": cover[:n_sweep],
        "cover_random": cover[n_sweep:],
        "tile_mode": tm,
        "tile_ref": tr,
        "ident_err": ie,
        "ident_norm": inn,
    }
    if ceiling:
        out["gram"] = ceiling_sum(dh, x if plan.affine is not None else None)
    return out


def ceiling_sum(dh: Float[Tensor, "T d_out"], x: Float[Tensor, "T d_in"] | None = None) -> Float[Tensor, "d d"]:
    """The ceiling's statistic (float64): ``sum_t dh_t dh_t^T / (||dh_t||^2 + eps)`` ``[d_out, d_out]``,
    or, with the inputs ``x`` of a linear site ``dh = W x + b``, the same sum on the input side,
    ``sum_t x~_t x~_t^T / (||dh_t||^2 + eps)`` with ``x~ = [x, 1]`` (``[W | b]`` maps it back: ``summarize``)."""
    dh = dh.float()
    scale = ((dh * dh).sum(1) + EPS).rsqrt().unsqueeze(1)  # float32 norms: y feeds a float32 product anyway
    y = dh * scale if x is None else torch.cat([x.float(), torch.ones_like(scale)], dim=1) * scale
    return (y.mT @ y).double()


def add_sums(a: dict[str, Tensor], b: dict[str, Tensor]) -> dict[str, Tensor]:
    """Two batches' sums added name by name."""
    return {k: a[k] + b[k] for k in a}


def span_ceiling(gram: Tensor, n: int, tokens: float) -> float:
    """The largest span figure any ``n``-dimensional subspace reaches on these tokens: the top ``n``
    eigenvalues of ``gram`` over the token count (Ky Fan), reached by the top ``n`` principal directions
    of the normalised outputs."""
    evals = torch.linalg.eigvalsh(gram.double())
    return (evals[-n:].clamp_min(0).sum() / tokens).item()


def summarize(plan: SitePlan, sums: dict[str, Tensor]) -> dict:
    """Turn accumulated sums into the site-layer's figures (plain floats and lists, computed on the CPU)."""
    p = {k: v.double().cpu() for k, v in sums.items()}
    T = p["tokens"].item()
    if T <= 0:
        raise ValueError("no tokens were scored for this site; the token budget or fit_fraction leaves none")
    n = plan.n
    ref = p["ref"] / T
    per_mount = p["lift"] / T - ref  # [strategy, mount]: full-write lift of each mount
    span = p["span"] / T
    cov_t = p["cover_tiled"] / p["energy"]
    cov_r = p["cover_random"] / p["energy"]
    tile_lift = (p["tile_mode"] - p["tile_ref"]) / T
    row: dict[str, Any] = {"n_tokens": int(T), "n_mounts": n}
    for i, s in enumerate(STRATEGIES):
        row[f"lift_{s}"] = per_mount[i].mean().item()
    for i, s in enumerate(STRATEGIES):
        row[f"span_{s}"] = span[i].item()
        row[f"span_lift_{s}"] = (span[i] - span[STRATEGIES.index("random")]).item()
    if "gram" in p:
        affine = None if plan.affine is None else plan.affine.cpu()
        gram = p["gram"] if affine is None else affine @ p["gram"] @ affine.mT
        row["span_ceiling"] = span_ceiling(gram, n, T)
        row["span_lift_ceiling"] = row["span_ceiling"] - row["span_random"]
        for s in STRATEGIES[:-1]:
            row[f"ceiling_fraction_{s}"] = row[f"span_lift_{s}"] / max(row["span_lift_ceiling"], EPS)
    row["coverage_modes"] = [m for m, _, _ in plan.coverage]
    row["coverage_tiled"] = cov_t.tolist()
    row["coverage_random"] = cov_r.tolist()
    row["coverage_lift"] = (cov_t - cov_r).tolist()
    row["tile_lift"] = tile_lift.tolist()
    row["identity_rel_err"] = (p["ident_err"].sum() / p["ident_norm"].sum().clamp_min(EPS)).sqrt().item()
    return row


# --- steering and the unembedding reading -------------------------------------------------------
def spearman(a: Float[Tensor, "*a"], b: Float[Tensor, "*b"]) -> float:
    """``linalg.spearman`` for the steering rule C1: a constant side (a steer that moves no logit) has no
    rank correlation and counts as rho = 0, which fails C1 as it should, and keeps results.json NaN-free."""
    rho = linalg.spearman(a, b)
    return 0.0 if math.isnan(rho) else rho


def topk_jaccard(a: Tensor, b: Tensor, k: int = 20) -> float:
    """Jaccard overlap of the indices of the ``k`` largest entries of ``a`` and of ``b``."""
    k = min(k, a.numel())
    ia, ib = set(a.flatten().topk(k).indices.tolist()), set(b.flatten().topk(k).indices.tolist())
    return len(ia & ib) / len(ia | ib)


# --- pass rules -----------------------------------------------------------------------------------
@dataclass
class MountRules:
    """Every threshold of the per-site-layer pass rule (defaults: the paper's)."""

    a1_margin: float = 0.005  # A1: tiled lift > random lift + margin
    a1_margin_effective: float = 0.002
    a2_slack: float = 0.002  # A2: tiled >= column sampling - slack
    a3_max_rel_err: float = 1e-4  # A3: the SVD identity holds on the data (relative error)
    a4_slack_residual: float = 0.002  # A4: tiled + slack >= whole, or tiled / whole >= floor
    a4_floor_residual: float = 0.80
    a4_slack: float = 0.005
    a4_floor: float = 0.70
    b1_peak_residual: float = 0.25  # B1: peak coverage lift >= floor
    b1_peak: float = 0.15
    b1_peak_effective: float = 0.08
    b1_early_points_residual: int = 2  # best of the first points >= peak - early margin
    b1_early_points: int = 3
    b1_early_margin: float = 0.08
    b1_last_margin: float = 0.10  # last point >= peak - last margin
    c1_min_layer: int = 6  # C1 required on residual writes at layer >= this
    c1_min_rho: float = 0.05  # pass if mean rho >= this or mean Jaccard >= c1_min_jaccard
    c1_min_jaccard: float = 0.05

    @classmethod
    def from_dict(cls, d: dict | None) -> MountRules:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"rules key {bad[0]!r} is unknown; allowed keys: {', '.join(sorted(known))}")
        return cls(**d)


def judge(row: dict, rules: MountRules, *, residual: bool, effective: bool) -> dict[str, bool | None]:
    """The checks A1-A4, B1, C1 of one site-layer (C1 is None where it is not required) and ``pass``."""
    t, w, c, r = (row[f"lift_{s}"] for s in STRATEGIES)
    checks: dict[str, bool | None] = {}
    checks["A1"] = t > r + (rules.a1_margin_effective if effective else rules.a1_margin)
    checks["A2"] = t >= c - rules.a2_slack
    checks["A3"] = row["identity_rel_err"] <= rules.a3_max_rel_err
    slack, floor = (rules.a4_slack_residual, rules.a4_floor_residual) if residual else (rules.a4_slack, rules.a4_floor)
    checks["A4"] = t + slack >= w or (w > 0 and t / w >= floor)
    lifts = row["coverage_lift"]
    peak = max(lifts)
    floor_b = rules.b1_peak_residual if residual else (rules.b1_peak_effective if effective else rules.b1_peak)
    early = max(lifts[: rules.b1_early_points_residual if residual else rules.b1_early_points])
    checks["B1"] = (
        peak >= floor_b and early >= peak - rules.b1_early_margin and lifts[-1] >= peak - rules.b1_last_margin
    )
    if residual and row["layer"] >= rules.c1_min_layer:
        rho, jac = row.get("steer_rho"), row.get("steer_jaccard")
        checks["C1"] = rho is not None and (
            rho >= rules.c1_min_rho or (jac is not None and jac >= rules.c1_min_jaccard)
        )
    else:
        checks["C1"] = None
    checks["pass"] = all(v for v in checks.values() if v is not None)
    return {k: (None if v is None else bool(v)) for k, v in checks.items()}
