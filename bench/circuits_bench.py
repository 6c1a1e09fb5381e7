"""Cost and size of a task's circuit graph with its edge checks, on SmolLM2 IOI test prompts.

    OMP_NUM_THREADS=1 python bench/circuits_bench.py                          # 32 IOI test prompts, defaults
    OMP_NUM_THREADS=1 python bench/circuits_bench.py --prompts 64 --depth 3 --n-check 24

One process, the analysis functions the module runs (``analysis.circuit_graph``, ``analysis.edge_check``): the
graph batch by batch (one cached forward per batch, then the splits), merged over the prompts; then the causal
check of the merged graph's ``--n-check`` strongest checkable edges (writer not a bias) on the same prompts.
Prints the time of each part, the graph's size (nodes, edges, by reader kind), and the fraction of checked edges
that pass z alone and z with the gap fraction (``MIN_GAP_FRACTION``), with the strongest edges' check rows.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from conditions import report_conditions  # bench/conditions.py


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="ioi")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threshold", type=float, default=None, help="default: the builder's")
    p.add_argument("--depth", type=int, default=None, help="default: the builder's")
    p.add_argument("--qk-top", type=int, default=None, help="default: the builder's")
    p.add_argument("--n-check", type=int, default=16)
    p.add_argument("--rows-per-forward", type=int, default=256)
    args = p.parse_args()

    from lit_svd.analysis.circuit_graph import (
        EdgeSums,
        GraphBuilder,
        GraphOptions,
        Units,
        metric_weights,
        to_networkx,
    )
    from lit_svd.analysis.decompose import Decomposer, logit_reads
    from lit_svd.analysis.edge_check import Edge, check_batch, check_context, judge_edge
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.models import load_causal_lm
    from lit_svd.models import view as make_view
    from lit_svd.modules.circuits import checkable

    report_conditions()
    given = {"threshold": args.threshold, "depth": args.depth, "qk_top": args.qk_top}
    options = GraphOptions(**{k: v for k, v in given.items() if v is not None})
    print(f"options: {options}")
    t0 = time.perf_counter()
    model, tok = load_causal_lm(args.model)
    view = make_view(model)
    dm = TaskDataModule(args.task, tok, n_train=0, n_val=0, n_test=args.prompts, batch_size=args.batch_size)
    batches = list(dm.test_dataloader())
    t_load = time.perf_counter() - t0
    with torch.no_grad():
        t0 = time.perf_counter()
        dec = Decomposer(view)
        t_dec = time.perf_counter() - t0
        # the metric's split on the first batch: how many writers each threshold would keep (level 1)
        b0 = batches[0]
        cache = view.run_with_cache(dec.points(mix=True), b0["clean_ids"], b0["attention_mask"])
        rows0 = torch.arange(len(b0["answer_pos"]))
        split = dec.split(
            cache, logit_reads(dec, cache, rows0, b0["answer_pos"], metric_weights(dec, cache, b0, args.task))
        )
        share = split.values.abs() / split.values.abs().sum(-1, keepdim=True)
        print(f"level 1 (metric split, {len(split.nodes)} writers): largest share per prompt"
              f" {share.max(-1).values.median():.4f} (median)", flush=True)  # fmt: skip
        for th in (0.05, 0.02, 0.01, 0.005, 0.002, 0.001):
            print(f"  threshold {th}: {float((share >= th).sum(-1).double().mean()):.1f} writers kept per prompt")
        del cache, split
        builder = GraphBuilder(dec, args.task, options)
        units = Units(dec, options.unit, options.rel_gap)
        sums, per = EdgeSums(), []
        t0 = time.perf_counter()
        for batch in batches:
            cache = view.run_with_cache(dec.points(mix=True), batch["clean_ids"], batch["attention_mask"])
            graphs = builder.batch(cache, batch)
            sums.add(graphs, units, len(batch["answer_pos"]))
            graphs.rows = []  # summed: the checks need only where each reader was read (entries)
            per.append(graphs)
            del cache
        t_graph = time.perf_counter() - t0
        edges = sums.edges()
        G = to_networkx(edges, options.unit, view.n_layers)
        to_check = [Edge.of(e) for e in edges if checkable(e)][: args.n_check]
        print(f"graph: {t_graph:.1f} s, {G.number_of_nodes()} nodes, {G.number_of_edges()} edges", flush=True)
        t0 = time.perf_counter()
        totals: dict = {}
        contexts = [check_context(dec, batch, args.task) for batch in batches]
        gaps = [ctx.m_clean - ctx.m_corrupt for ctx in contexts]
        for i, edge in enumerate(to_check):  # edge by edge, so that a long run shows its progress
            for ctx, graphs in zip(contexts, per):
                got = check_batch(dec, ctx, graphs, [edge], args.task, rows_per_forward=args.rows_per_forward)
                for e, t in got.items():
                    totals[e] = totals[e].add(t) if e in totals else t
            if edge in totals:
                r = judge_edge(edge, totals[edge])
                print(f"  checked {i + 1}/{len(to_check)} at {time.perf_counter() - t0:.0f} s: {edge}: z {r['z']:.1f},"
                      f" gap fraction {r['gap_fraction']:+.3f}", flush=True)  # fmt: skip
        t_check = time.perf_counter() - t0
    rows = [judge_edge(e, totals[e]) for e in to_check if e in totals]
    gap = float(torch.cat(gaps).mean())
    n = len(rows)
    print(f"model load + prompts: {t_load:.1f} s; Decomposer (SVDs, once per model): {t_dec:.1f} s")
    print(f"prompts: {sums.n_prompts}; metric gap (clean - corrupted): {gap:.3f}")
    print(f"graph building: {t_graph:.1f} s ({t_graph / max(sums.n_prompts, 1):.2f} s per prompt)")
    kinds = Counter(e["reader_kind"] for e in edges)
    print(
        f"graph: {G.number_of_nodes()} nodes, {G.number_of_edges()} edges "
        f"({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); readers expanded: {len(sums.readers)}"
    )
    print(
        f"edge checks: {n} edges in {t_check:.1f} s ({t_check / max(n, 1):.1f} s per edge, "
        f"{sum(r['reader_kind'] == 'logit' for r in rows)} of them logit edges: no forward)"
    )
    pz, pg = sum(r["passes_z"] for r in rows), sum(r["passes"] for r in rows)
    print(
        f"pass z alone: {pz} / {n} = {pz / max(n, 1):.2f};"
        f" pass z and gap fraction >= 0.01: {pg} / {n} = {pg / max(n, 1):.2f}"
    )
    print(f"total graph + checks: {(t_graph + t_check) / 60:.1f} min (+ {t_dec:.0f} s SVDs once per model)")
    print("checked edges (strongest first): writer -> reader (kind): weight, effect, gap fraction, z, pass")
    by = {(e["writer"], e["reader"], e["reader_kind"]): e for e in edges}
    for r in rows:
        w = by[(r["writer"], r["reader"], r["reader_kind"])]["weight"]
        print(
            f"  {r['writer']} -> {r['reader']} ({r['reader_kind']}): {w:+.3f}, {r['effect']:+.4f},"
            f" {r['gap_fraction']:+.3f}, z {r['z']:.1f},"
            f" {'PASS' if r['passes'] else 'pass-z' if r['passes_z'] else 'fail'}"
        )


if __name__ == "__main__":
    main()
