"""Why the signed direction-edge ranking fails (issue 33; docs/circuits.md, "Edge circuits"): cheap experiments that
tell a bug in the ranking (sign, key order, weights) from cancelling writers. Prints one JSON object (and writes it
to ``--out``):

* ``totals``: the sums of the positive and of the negative direction-edge scores over every edge, and of the
  head-level (block) scores, against the gap ``m(full) - m(empty)`` of the scored prompts;
* ``single``: the strongest positive and negative direction edges, each dropped alone from the full model: its
  effect against ``-score`` (EAP-IG's first-order prediction), so that a sign error would show edge by edge;
* ``rankings``: f of the signed, the reversed (lowest score first) and the absolute direction ranking on the fair
  axis at ``--sizes``;
* ``blocks``: for the top ``k`` head-level blocks by signed head-level EAP-IG (``--blocks``: fractions of the
  blocks), f of every edge of those blocks (``whole``), of their positive direction edges only (``positive``), of
  their strongest direction edges by |score| (``core``: ``--core`` of each block's edges,
  ``edge_curves.BlockRanking``'s first tier) and the weighted edge count of each.

    /work/bin/heavy python bench/edge_rank_diagnose.py --n-train 16 --n-diag 16 --out DIR

Prompts: ``TaskDataModule(task, n_train=1000, n_val=64, n_test=64, test_last=True, seed=0)`` as ``edge_bench.py``;
scores from the first ``--n-train`` training prompts, circuits on the first ``--n-diag`` validation prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from edge_bench import write  # bench/edge_bench.py
from torch import Tensor


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class PositiveEdges:
    """The positive direction edges of the blocks ``kept [n_blocks]``."""

    def __init__(self, universe, scores, kept: Tensor):
        self.u, self.scores, self.kept = universe, scores, kept

    def keep(self, r) -> Tensor:
        o = self.u.block_offsets
        cols = self.kept[int(o[r.index]) : int(o[r.index + 1])][self.u.col_unit[: r.n_cols].cpu()]
        return (cols[None] & (self.scores.directions(r) > 0)).to(self.u.device)


def weighted_count(u, circuit) -> float:
    total = 0.0
    for r in u.readers:
        w = u.block_weights(r)[u.col_unit[: r.n_cols].cpu()]
        blocks = getattr(circuit, "block_keep", lambda r: None)(r)
        if blocks is not None:
            total += float(blocks.double().sum())
            continue
        total += float((circuit.keep(r).cpu().double() * w).sum())
    return total / u.n_blocks


def strongest(scores, n: int, sign: float) -> list[tuple[float, int, int]]:
    """The ``n`` direction edges of largest ``sign * score``: ``(score, reader unit, flat index)``."""
    cand = []
    for r in scores.universe.readers:
        S = (sign * scores.directions(r)).reshape(-1)
        top = S.topk(min(n, S.numel()))
        cand += [(sign * float(v), r.index, int(i)) for v, i in zip(top.values, top.indices)]
    return sorted(cand, key=lambda c: -sign * c[0])[:n]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="ioi")
    p.add_argument("--n-train", type=int, default=16)
    p.add_argument("--n-diag", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--sizes", type=float, nargs="+", default=[0.01, 0.1, 0.5])
    p.add_argument("--blocks", type=float, nargs="+", default=[0.001, 0.01, 0.1])
    p.add_argument("--core", type=float, default=0.1)
    p.add_argument("--n-single", type=int, default=4)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)

    from lit_svd.analysis.edge_ablation import AllEdges, EdgeAblation, NoEdges
    from lit_svd.analysis.edge_attribution import attribute
    from lit_svd.analysis.edge_curves import (
        BlockRanking,
        EdgeRanking,
        ScoreFile,
        absolute,
        exit_on_sigterm,
        ranked_spec,
    )
    from lit_svd.analysis.edge_graph import _drop_one
    from lit_svd.analysis.edges import EdgeUniverse
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.models import load_causal_lm
    from lit_svd.models import view as make_view

    model, tok = load_causal_lm(args.model)
    for param in model.parameters():
        param.requires_grad_(False)
    dm = TaskDataModule(args.task, tok, n_train=1000, n_val=64, n_test=64, test_last=True, seed=0,
                        batch_size=args.batch_size)  # fmt: skip
    train = dm.splits["train"].examples[: args.n_train]
    diag = dm.splits["val"].examples[: args.n_diag]
    batch = lambda ex: [dm.collate(ex[i : i + args.batch_size]) for i in range(0, len(ex), args.batch_size)]  # noqa: E731
    train_b, diag_b = batch(train), batch(diag)
    u = EdgeUniverse(make_view(model))
    out: dict = {"args": vars(args)}
    with exit_on_sigterm():
        store, gains = ScoreFile(u), ScoreFile(u, name="gains")
        try:
            t = time.monotonic()
            scores = attribute(u, train_b, args.task, store=store, gains=gains)
            say(f"attribution {time.monotonic() - t:.0f} s")
            ab = EdgeAblation(u, args.task, gains=gains)
            refs = [ab.reference(b) for b in diag_b]
            n = sum(len(b["answer_pos"]) for b in diag_b)

            def metric(c) -> float:
                return sum(float(ab.metric(b, c, ref).sum()) for b, ref in zip(diag_b, refs)) / n

            full, empty = metric(AllEdges()), metric(NoEdges(u))
            gap = full - empty
            f = lambda c: (metric(c) - empty) / gap  # noqa: E731
            out["m_full"], out["m_empty"] = full, empty

            pos = neg = 0.0
            for r in u.readers:
                S = scores.directions(r).double()
                pos, neg = pos + float(S.clamp(min=0).sum()), neg + float(S.clamp(max=0).sum())
            units = scores.units
            out["totals"] = {
                "directions_positive": pos,
                "directions_negative": neg,
                "blocks_positive": float(units.clamp(min=0).sum()),
                "blocks_negative": float(units.clamp(max=0).sum()),
                "gap": gap,
            }
            say(json.dumps(out["totals"]))
            write(out, args.out, "edge_rank_diagnose.json")

            out["single"] = []
            for sign in (1.0, -1.0):
                for s, unit, flat in strongest(scores, args.n_single, sign):
                    r = u.readers[unit]
                    k, col = divmod(flat, r.n_cols)
                    effect = metric(_drop_one(r, flat, u.device)) - full
                    row = {"reader": str(u.reader_address(r, k)) if r.kind != "logits" else "logits",
                           "writer": str(u.writer_address(col)), "score": s, "effect": effect}  # fmt: skip
                    out["single"].append(row)
                    say(json.dumps(row))
            write(out, args.out, "edge_rank_diagnose.json")

            signed = EdgeRanking(u, "directions", scores.directions)
            rankings = {
                "signed": signed,
                "reversed": EdgeRanking(u, "directions", lambda r: -scores.directions(r)),
                "absolute": absolute(signed),
            }
            out["rankings"] = {}
            for name, ranking in rankings.items():
                rows = []
                for size, (circuit, kept, weight) in zip(args.sizes, ranked_spec(ranking, "fair").circuits(args.sizes)):
                    rows.append({"size": size, "f": f(circuit), "weighted": weight / u.n_blocks, "edges": kept})
                    say(f"{name} {rows[-1]}")
                out["rankings"][name] = rows
                write(out, args.out, "edge_rank_diagnose.json")

            signed_blocks = BlockRanking(signed, units)  # the top blocks by head-level EAP-IG, whole
            cores = BlockRanking(absolute(signed), units, (args.core, 1.0))  # their top edges by |score|
            out["blocks"] = []
            for frac in args.blocks:
                k = max(1, round(frac * u.n_blocks))
                whole = signed_blocks.cuts([float(k)], weighted=True)[0]
                circuits = {
                    "whole": whole,
                    "positive": PositiveEdges(u, scores, whole.n > 0),
                    "core": cores.cuts([k * args.core], weighted=True)[0],
                }
                for mode, c in circuits.items():
                    row = {"blocks": frac, "mode": mode, "f": f(c), "weighted": weighted_count(u, c)}
                    out["blocks"].append(row)
                    say(json.dumps(row))
                    write(out, args.out, "edge_rank_diagnose.json")
        finally:
            store.close()
            gains.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
