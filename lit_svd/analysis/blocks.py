"""Which mask directions are identifiable: blocks of near-equal singular values per component, and
kept directions read as block-level claims. Pure functions (no Lightning, no files).

A component's singular values (``Component.S``, the values the masks scale) are grouped per group (head,
KV head, layer) by ``lit_svd.linalg.direction_blocks``: neighbours whose relative gap is below ``rel_gap``
share a block. Inside a block of ``m > 1`` directions the single vectors are arbitrary (any rotation of the
block is an equally valid SVD), so "direction 2 of head 26.2 is kept" only means "k of the m directions of
that block are kept": a claim about the block's subspace. Directions past the numerical rank form one
block of their own (``past_rank``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lit_svd.analysis.mask_options import MaskUnit, check_mask_unit
from lit_svd.linalg import REL_GAP, DirectionBlocks, direction_blocks
from lit_svd.models.intervene import Component


def component_blocks(component: Component, rel_gap: float = REL_GAP) -> DirectionBlocks:
    """Blocks of one component's spectrum ``S: [G, K]`` (per group); the rank tolerance uses the map's
    larger side (``U``'s input side including the bias row, ``V``'s output side)."""
    size = max(component.U.shape[-2], component.V.shape[-2])
    return direction_blocks(component.S.detach().cpu(), rel_gap, size=size)


def direction_block(blocks: DirectionBlocks, group: int, direction: int) -> dict:
    """The block fields of one direction: ``block`` (``id``, ``size``, ``first``, ``last`` direction),
    ``gap`` (relative gap from its block to the nearest outside singular value), ``isolated`` (a block of
    one within the rank) and ``past_rank``."""
    first = int(blocks.first[group, direction])
    size = int(blocks.size[group, direction])
    return {
        "block": {"id": int(blocks.block[group, direction]), "size": size, "first": first, "last": first + size - 1},
        "gap": float(blocks.gap[group, direction]),
        "isolated": bool(blocks.isolated[group, direction]),
        "past_rank": direction >= int(blocks.rank[group]),
    }


def block_report(components: Sequence[Component], rel_gap: float = REL_GAP) -> dict:
    """Per component (``components``): its groups' numerical ranks, blocks (``[first, last, size, gap]``
    per group) and each direction's isolation gap; ``per_kind``: directions, isolated, in blocks of
    more than one (within the rank), past the rank, number of blocks and the largest block."""
    records: list[dict] = []
    per_kind: dict[str, dict] = {}
    for c in components:
        b = component_blocks(c, rel_gap)
        first = b.first
        groups = []
        for g in range(c.shape[0]):
            starts = (first[g] == torch.arange(c.shape[1])).nonzero().squeeze(1).tolist()
            groups.append(
                [[s, s + int(b.size[g, s]) - 1, int(b.size[g, s]), round(float(b.gap[g, s]), 6)] for s in starts]
            )
        past = torch.arange(c.shape[1]) >= b.rank.unsqueeze(-1)
        counts = {
            "n_directions": c.n_directions,
            "isolated": int(b.isolated.sum()),
            "in_blocks": int((~b.isolated & ~past).sum()),
            "past_rank": int(past.sum()),
            "n_blocks": int((b.block.amax(-1) + 1).sum()),
            "largest_block": int(b.size[~past].max()) if (~past).any() else 0,
        }
        records.append(
            {
                "name": c.name,
                "kind": c.kind,
                "layer": c.layer,
                "group": c.group,
                "rank": b.rank.tolist(),
                **counts,
                "blocks": groups,
                "gap": [[round(v, 6) for v in row] for row in b.gap.tolist()],
            }
        )
        slot = per_kind.setdefault(c.kind, {k: 0 for k in counts})
        for k, v in counts.items():
            slot[k] = max(slot[k], v) if k == "largest_block" else slot[k] + v
    for slot in per_kind.values():
        slot["isolated_fraction"] = slot["isolated"] / max(slot["n_directions"], 1)
    return {"rel_gap": rel_gap, "per_kind": per_kind, "components": records}


def kept_blocks(components: Sequence[Component], keep: dict[str, Tensor], rel_gap: float = REL_GAP) -> dict:
    """Kept directions (``keep[name]``: ``[G, K]`` bool) read against their blocks.

    ``directions``: one row per kept direction with its block fields (``direction_block``), ``sigma`` and
    ``kept_in_block`` (k of the block's m directions kept) and ``claim``: ``"direction"`` (isolated: the
    vector itself is identifiable), ``"block"`` (``statement`` "k of m kept in block b": only the block's
    subspace is) or ``"null"`` (past the numerical rank). ``blocks``: one row per block of more than one
    direction with a kept direction. ``per_kind``: kept, kept isolated / in blocks / past the rank, blocks
    touched and blocks kept whole. Indices are 0-based, as ``direction`` everywhere in the mask reports."""
    rows: list[dict] = []
    block_rows: list[dict] = []
    per_kind: dict[str, dict] = {}
    for c in components:
        b = component_blocks(c, rel_gap)
        kept = keep[c.name].detach().cpu().bool()
        # kept per block: count the kept directions of each (group, block) pair
        n_blocks = int(b.block.max()) + 1
        flat = (b.block + n_blocks * torch.arange(c.shape[0]).unsqueeze(-1)).flatten()
        per_block = torch.zeros(c.shape[0] * n_blocks, dtype=torch.long).index_add_(0, flat, kept.flatten().long())
        k_in_block = per_block[flat].view(c.shape)
        slot = per_kind.setdefault(
            c.kind, {"kept": 0, "isolated": 0, "in_blocks": 0, "past_rank": 0, "blocks_touched": 0, "blocks_whole": 0}
        )
        seen = set()
        for g, k in zip(*torch.nonzero(kept, as_tuple=True)):
            g, k = int(g), int(k)
            info = direction_block(b, g, k)
            m, kk, bid = info["block"]["size"], int(k_in_block[g, k]), info["block"]["id"]
            kind = "direction" if info["isolated"] else "null" if info["past_rank"] else "block"
            claim = {
                "direction": "direction",
                "null": f"{kk} of {m} kept past the numerical rank",
                "block": f"{kk} of {m} kept in block {bid} (directions {info['block']['first']}-"
                f"{info['block']['last']})",
            }[kind]
            rows.append(
                {
                    **c.address(g, k).row(group_key="group"),
                    "sigma": float(c.S[g, k]),
                    **info,
                    "kept_in_block": kk,
                    "claim": kind,
                    "statement": claim,
                }
            )
            slot["kept"] += 1
            slot["past_rank" if info["past_rank"] else "isolated" if info["isolated"] else "in_blocks"] += 1
            if (g, bid) not in seen:
                seen.add((g, bid))
                slot["blocks_touched"] += 1
                slot["blocks_whole"] += kk == m
                if m > 1:
                    block_rows.append(
                        {
                            "component": c.name,
                            "kind": c.kind,
                            "layer": c.layer,
                            "group": g,
                            "block": bid,
                            "first": info["block"]["first"],
                            "last": info["block"]["last"],
                            "size": m,
                            "kept": kk,
                            "gap": info["gap"],
                            "past_rank": info["past_rank"],
                            "statement": claim,
                        }
                    )
    for slot in per_kind.values():
        slot["isolated_fraction"] = slot["isolated"] / slot["kept"] if slot["kept"] else None
    total = sum(s["kept"] for s in per_kind.values())
    isolated = sum(s["isolated"] for s in per_kind.values())
    return {
        "rel_gap": rel_gap,
        "kept": total,
        "isolated": isolated,
        "isolated_fraction": isolated / total if total else None,
        "per_kind": per_kind,
        "directions": rows,
        "blocks": block_rows,
    }


def mask_units(
    components: Sequence[Component], mask_unit: MaskUnit, rel_gap: float = REL_GAP
) -> dict[str, Tensor] | None:
    """``mask_unit="block"``: per component the index ``[G, K]`` of each direction's mask value (one per
    (group, block), numbered 0..n_units-1), so that ``theta[index]`` gives every direction of a block the
    same lambda; ``"direction"``: None (one value per direction)."""
    if check_mask_unit(mask_unit) == "direction":
        return None
    out = {}
    for c in components:
        block = component_blocks(c, rel_gap).block  # [G, K], 0-based per group
        offsets = torch.cumsum(block.amax(-1) + 1, 0) - (block.amax(-1) + 1)
        out[c.name] = block + offsets.unsqueeze(-1)
    return out
