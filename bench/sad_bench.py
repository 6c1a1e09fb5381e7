"""SAD throughput on SmolLM2: the batched decomposition (all heads of a layer, all pairs at once) against a
straightforward per-pair loop, on the same IOI prompts and the same analysed pairs, in one run; and the cost
of the nulls (16 matched-spectrum null draws, the pair null) as a ratio of the main decomposition.

    .venv/bin/python bench/sad_bench.py [--prompts 16] [--layers 3 14 25] [--loop-pairs 300]

Both sides compute, per analysed pair, the contributions in the singular basis and in the rotated
control, their Rolls–Tovee sparsity and N_recon (the model forward that captures the inputs is shared
and not timed). The loop gets every per-offset factored Omega(delta), already projected on both bases,
precomputed (untimed), and works one pair at a time with vector ops, as a direct transcription of the
definition would. Prints pairs/s of each side and the speed-up; checks that both agree. Then, per layer,
the time of the main decomposition (singular basis + rotated control), of the matched-spectrum null
(``null_pairs``, ``--null-draws`` heads per head, on every ``--null-stride``-th prompt as the shipped configs)
and of the pair null, and their ratios.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from conditions import report_conditions  # noqa: E402  (bench/conditions.py)

from lit_svd.analysis.sad import (
    DEFAULT_RECON_TOL,
    attention_inputs,
    causal_visibility,
    decompose_layer,  # noqa: E402
    layer_bases,
    n_recon,
    null_pairs,
)
from lit_svd.linalg import rolls_tovee_sparsity  # noqa: E402


def loop_pairs(view, layer, bases, X, mask, pairs, tol=DEFAULT_RECON_TOL):
    """Per pair: terms over every visible source from the view's own per-offset factored QK matrices."""
    T = X.shape[1]
    # per offset, precomputed before timing: u_k^T Omega(delta) = (U^T A(delta)) B(delta)^T, with the
    # view's own factored Omega(delta) = A(delta) B(delta)^T, for both bases of every analysed head
    omegas = {}
    for delta in range(-(T - 1), 1):
        f = view.qk(layer, delta if view.rotary_dim else None)
        A, B = f.A[bases.heads], f.B[bases.heads]
        omegas[delta] = (bases.U.mT @ A, bases.U_rot.mT @ A, B)
    vis = causal_visibility(mask, bases.window)
    pos = mask.long().cumsum(-1) - 1
    head_row = {int(h): i for i, h in enumerate(bases.heads)}

    def run():
        out = []
        for b, h, d, s in pairs:
            i = head_row[h]
            results = []
            for which, U in enumerate((bases.U[i], bases.U_rot[i])):
                a = X[b, d] @ U  # [k]
                srcs = vis[b, d].nonzero().flatten().tolist()
                terms = {}
                for j in srcs:
                    om = omegas[int(pos[b, j] - pos[b, d])]
                    terms[j] = a * (om[which][i] @ (om[2][i].T @ X[b, j]))
                others = [terms[j] for j in srcs if j != s]
                c = terms[s] - torch.stack(others).mean(0)
                results.append((rolls_tovee_sparsity(c).item(), int(n_recon(c[None], c.sum()[None], tol))))
            out.append(results)
        return out

    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--layers", type=int, nargs="+", default=[3, 14, 25])
    p.add_argument("--loop-pairs", type=int, default=300, help="pairs timed in the loop (it is slow)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for both sides (1: robust on a shared box)")
    p.add_argument("--null-draws", type=int, default=16, help="matched-spectrum null draws per head")
    p.add_argument(
        "--null-stride",
        type=int,
        default=4,
        help="the matched null sees every k-th prompt (the shipped configs' null_stride; 1: every prompt)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timings per layer for the null costs (median kept)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    report_conditions()

    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.models import load_causal_lm
    from lit_svd.models import view as make_view

    model, tok = load_causal_lm("smollm2-135m")
    view = make_view(model)
    dm = TaskDataModule(task="ioi", tokenizer=tok, n_train=0, n_val=0, n_test=args.prompts, batch_size=args.prompts)
    batch = next(iter(dm.test_dataloader()))
    ids, mask = batch["clean_ids"], batch["attention_mask"]
    print(
        f"SmolLM2-135M, {args.prompts} IOI prompts ({int(mask.sum())} tokens), layers {args.layers},"
        f" torch threads {args.threads}"
    )
    print(f"{'layer':>5} {'pairs':>7} {'batched pairs/s':>16} {'loop pairs/s':>13} {'speed-up':>9} {'max |dS|':>9}")
    ratios = []
    with torch.no_grad():
        X = attention_inputs(view, ids, mask, args.layers)
        for layer in args.layers:
            bases = layer_bases(view, layer)
            decompose_layer(bases, X[layer], mask)  # warm-up
            t0 = time.perf_counter()
            stats = decompose_layer(bases, X[layer], mask)
            t_batched = time.perf_counter() - t0
            n = len(stats)
            sel = torch.randperm(n, generator=torch.Generator().manual_seed(0))[: args.loop_pairs]
            pairs = [(int(stats.batch[i]), int(stats.head[i]), int(stats.dest[i]), int(stats.src[i])) for i in sel]
            run = loop_pairs(view, layer, bases, X[layer], mask, pairs)
            t0 = time.perf_counter()
            looped = run()
            t_loop = time.perf_counter() - t0
            dS = max(
                max(
                    abs(looped[j][0][0] - stats.sparsity[i].item()),
                    abs(looped[j][1][0] - stats.sparsity_rotated[i].item()),
                )
                for j, i in enumerate(sel.tolist())
            )
            same_recon = sum(looped[j][0][1] == int(stats.n_recon[i]) for j, i in enumerate(sel.tolist())) / len(sel)
            rb, rl = n / t_batched, len(pairs) / t_loop
            ratios.append(rb / rl)
            print(
                f"{layer:>5} {n:>7} {rb:>16.0f} {rl:>13.0f} {rb / rl:>8.0f}x {dS:>9.1e}  "
                f"(N_recon equal: {100 * same_recon:.1f}%)"
            )
    print(f"geometric-mean speed-up: {torch.tensor(ratios).log().mean().exp().item():.0f}x (target >= 20x)")
    null_costs(view, X, mask, args)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def null_costs(view, X, mask, args) -> None:
    """Per layer: main decomposition, matched null and pair null, timed on the same batch."""
    print(
        f"\nnull cost ({args.null_draws} matched-null draws per head on every {args.null_stride} prompt(s);"
        f" median of {args.repeats})"
    )
    print(f"{'layer':>5} {'main s':>8} {'null s':>8} {'pair s':>8} {'null/main':>10} {'pair/main':>10} {'all/main':>9}")
    totals = [0.0, 0.0, 0.0]
    with torch.no_grad():
        for layer in args.layers:
            bases = layer_bases(view, layer, null_draws=args.null_draws)
            x = X[layer].to(bases.U.dtype)
            vis = causal_visibility(mask, bases.window)
            plain = type(bases)(bases.layer, bases.heads, bases.qk, bases.U, bases.U_rot, bases.window, None)
            t_main = median_time(lambda: decompose_layer(plain, x, mask), args.repeats)
            t_pair = median_time(lambda: decompose_layer(plain, x, mask, unattended=True), args.repeats) - t_main
            k = args.null_stride
            t_null = median_time(lambda: null_pairs(x[::k], x[::k], vis[::k], bases.qk, bases.null), args.repeats)
            for i, t in enumerate((t_main, t_null, t_pair)):
                totals[i] += t
            print(
                f"{layer:>5} {t_main:>8.3f} {t_null:>8.3f} {t_pair:>8.3f} {t_null / t_main:>9.1f}x"
                f" {t_pair / t_main:>9.1f}x {(t_main + t_null + t_pair) / t_main:>8.1f}x"
            )
    m, n, p = totals
    print(
        f"total: matched null {n / m:.1f}x, pair null {p / m:.1f}x, main + both nulls {(m + n + p) / m:.1f}x the main"
        " decomposition (model forward not included)"
    )


if __name__ == "__main__":
    main()
