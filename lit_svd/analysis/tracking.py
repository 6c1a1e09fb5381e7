"""Following singular directions over training steps (pure; no Lightning, no files).

A direction's position in the sorted spectrum is not its identity: two singular values that cross change
places, LAPACK picks each vector's sign at random, and inside a block of near-equal values the vectors
themselves are arbitrary (``lit_svd.linalg.direction_blocks``). ``DirectionTrack`` names the directions of
the first logged SVD ``d1, d2, ...`` (``d1``: the largest singular value then; numbered from 1) and follows
each through the logged steps by matching every new SVD to the previous logged one
(``lit_svd.linalg.match_directions``: block-aware, Hungarian on |cos| between isolated directions), a chain.

Per tracked direction and step it reports where the direction now sits in the sorted spectrum, its singular
value, its sign relative to the first step, and whether its identity held since the previous step:

* ``"kept"``: it was isolated at the previous step and its joint vector ``[u; v] / sqrt 2`` has
  ``|cos| >= min_cos`` with its partner;
* ``"block"``: it lay in a block of near-equal values at the previous step; the block as a subspace carried
  over (``block_cos``, the cosine of the largest principal angle, ``>= min_cos``), the vector inside it is
  not identifiable, so only block-level quantities (the block's singular-value range) mean anything;
* ``"lost"``: below ``min_cos``: the partner is a new direction, not the old one moved. The name then
  restarts on the largest direction that no other tracked name holds (``since`` says from which step), so
  ``d1..dn`` stay on the top of the spectrum instead of following a lost chain into its bottom.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lit_svd.choices import choices
from lit_svd.linalg import REL_GAP, SVD, DirectionBlocks, direction_blocks, match_directions

MIN_COS = 0.9  # below this |cos| to its predecessor a direction counts as a new one
State = Literal["kept", "block", "lost"]
STATES: tuple[State, ...] = choices(State)


@dataclass
class TrackStep:
    """One logged step of a ``DirectionTrack``, per tracked direction ``d1..dn`` (lists of length n):
    ``position`` (0-based index in this step's sorted SVD), ``sigma``, ``sign`` (+1/-1 that turns this step's
    vectors into the first step's orientation), ``cos`` (|cos| to its predecessor; 1 at the first step),
    ``block_cos`` (principal-angle cosine of its previous block), ``state`` (``kept`` / ``block`` / ``lost``;
    ``kept`` at the first step; ``lost``: the name restarted on another direction, whose values ``position``,
    ``sigma`` and ``block_*`` are), ``block_size``, ``block_sigma_min`` / ``block_sigma_max`` (its block at
    this step), ``since`` (first step of its unbroken chain) and the counts ``n_kept``, ``n_block``, ``n_lost``."""

    position: list[int]
    sigma: list[float]
    sign: list[float]
    cos: list[float]
    block_cos: list[float]
    state: list[str]
    block_size: list[int]
    block_sigma_min: list[float]
    block_sigma_max: list[float]
    since: list[int]

    @property
    def counts(self) -> dict[str, int]:
        return {f"n_{s}": self.state.count(s) for s in STATES}

    def as_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, **self.counts}


class DirectionTrack:
    """Follows the directions of one (unbatched) matrix over logged steps; ``update(step, svd)`` per step.

    Args:
        n_track: how many directions to report (the first step's top ``n_track``; null: all). Every direction
            is matched, so a tracked one that falls below an untracked one is still followed.
        rel_gap: relative gap below which neighbouring singular values share a block (``linalg.REL_GAP``).
        min_cos: |cos| to the predecessor below which a direction is a new one.
    """

    def __init__(self, n_track: int | None = None, rel_gap: float = REL_GAP, min_cos: float = MIN_COS):
        if n_track is not None and (not isinstance(n_track, int) or n_track < 1):
            raise ValueError(f"n_track={n_track!r}: must be a positive integer or null (all directions)")
        if not 0 < min_cos <= 1:
            raise ValueError(f"min_cos={min_cos!r}: must be in (0, 1]")
        self.n_track, self.rel_gap, self.min_cos = n_track, rel_gap, min_cos
        self.prev: SVD | None = None
        self.prev_blocks: DirectionBlocks | None = None  # the previous step's blocks
        # per slot (empty before the first step): index in prev (sorted), sign, step it was last (re)started
        self.position: Tensor = torch.zeros(0, dtype=torch.long)
        self.sign: Tensor = torch.zeros(0, dtype=torch.float64)
        self.since: Tensor = torch.zeros(0, dtype=torch.long)

    def update(self, step: int, svd: SVD) -> TrackStep:
        """Match ``svd`` (descending, unbatched) to the previous logged one and advance every direction."""
        svd = SVD(svd.U.detach().double().cpu(), svd.S.detach().double().cpu(), svd.V.detach().double().cpu())
        k = svd.S.shape[-1]
        n = k if self.n_track is None else min(self.n_track, k)
        if self.prev is None or self.prev_blocks is None:
            self.position = torch.arange(k)
            self.sign = torch.ones(k, dtype=torch.float64)
            self.since = torch.full((k,), step)
            cos = block_cos = torch.ones(k, dtype=torch.float64)
            state = ["kept"] * k
        else:
            if self.prev.S.shape != svd.S.shape:
                raise ValueError(
                    f"the tracked matrix changed shape: {tuple(self.prev.S.shape)} -> {tuple(svd.S.shape)}"
                )
            match = match_directions(self.prev, svd, self.rel_gap)
            old = self.position
            cos, block_cos = match.cos.abs()[old], match.block_cos[old]
            isolated = self.prev_blocks.isolated[old]
            state = [
                "kept" if iso and c >= self.min_cos else "block" if not iso and b >= self.min_cos else "lost"
                for iso, c, b in zip(isolated.tolist(), cos.tolist(), block_cos.tolist())
            ]
            self.position = match.index[old]
            self.sign = self.sign * match.sign.double()[old]
            self.since = torch.where(torch.tensor([s == "lost" for s in state]), step, self.since)
            self._restart([i for i in range(n) if state[i] == "lost"], n)
        blocks = direction_blocks(svd.S, self.rel_gap, size=max(svd.U.shape[-2], svd.V.shape[-2]))
        self.prev, self.prev_blocks = svd, blocks
        pos = self.position[:n]
        b = blocks.block
        lo = torch.stack([svd.S[b == b[p]].min() for p in pos.tolist()]) if n else svd.S[:0]
        hi = torch.stack([svd.S[b == b[p]].max() for p in pos.tolist()]) if n else svd.S[:0]
        return TrackStep(
            pos.tolist(),
            svd.S[pos].tolist(),
            self.sign[:n].tolist(),
            cos[:n].tolist(),
            block_cos[:n].tolist(),
            state[:n],
            blocks.size[pos].tolist(),
            lo.tolist(),
            hi.tolist(),
            self.since[:n].tolist(),
        )

    def _restart(self, lost: list[int], n: int) -> None:
        """A reported direction that lost its identity restarts on the largest direction no other reported one
        holds (its partner may have fallen to the bottom of the spectrum; the name ``d<i>`` stays on the top
        directions), in the SVD's own sign; the direction there swaps places with it."""
        held = {int(self.position[i]) for i in range(n) if i not in lost}
        for i in lost:
            p = next(q for q in range(len(self.position)) if q not in held)
            j = int(self.position.eq(p).nonzero()[0, 0])
            self.position[i], self.position[j] = p, self.position[i].clone()
            self.sign[i], self.sign[j] = 1.0, self.sign[i].clone()
            held.add(p)

    def aligned(self, svd: SVD | None = None) -> SVD:
        """The last SVD (or ``svd``, of the same step) with its columns in tracked order and the first step's
        signs (tracked direction ``d<i+1>`` in column ``i``)."""
        svd = self.prev if svd is None else svd
        if svd is None:
            raise ValueError("aligned(): no step tracked yet (call update first)")
        p, s = self.position.to(svd.U.device), self.sign.to(svd.U.device, svd.U.dtype)
        return SVD(svd.U[..., p] * s, svd.S[..., p], svd.V[..., p] * s)


def track_scalars(prefix: str, step: TrackStep) -> dict[str, float]:
    """TensorBoard scalars of one tracked matrix: ``<prefix>/d<i>/{sigma,match_cos}`` per tracked direction,
    ``<prefix>/d<i>/{block_sigma_min,block_sigma_max}`` where it lies in a block (its vector is not
    identifiable there; the block's range is what is), and ``<prefix>/directions_{kept,block,lost}``."""
    out: dict[str, float] = {}
    for i in range(len(step.sigma)):
        tag = f"{prefix}/d{i + 1}"
        out[f"{tag}/sigma"] = step.sigma[i]
        out[f"{tag}/match_cos"] = step.cos[i] if step.state[i] != "block" else step.block_cos[i]
        if step.block_size[i] > 1:
            out[f"{tag}/block_sigma_min"] = step.block_sigma_min[i]
            out[f"{tag}/block_sigma_max"] = step.block_sigma_max[i]
    for key, value in step.counts.items():
        out[f"{prefix}/directions_{key[2:]}"] = float(value)
    return out


def compare_svds(
    ref: SVD, new: SVD, n_track: int | None = None, rel_gap: float = REL_GAP, min_cos: float = MIN_COS
) -> TrackStep:
    """The top ``n_track`` directions of ``ref`` (unbatched) followed into ``new`` of the same shape, as
    ``DirectionTrack`` follows them from one logged step to the next: per direction where its partner
    sits in ``new``, its singular value there, |cos| / block cosine, and ``kept`` / ``block`` / ``lost``.
    For two models (a base and a fine-tune, two checkpoints) of one architecture."""
    track = DirectionTrack(n_track, rel_gap, min_cos)
    track.update(0, ref)
    return track.update(1, new)
