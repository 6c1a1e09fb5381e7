"""Full A/B scoring of one SmolLM2 site-layer: lit_svd's streaming sums against a straightforward reference.

Both sides score the same WikiText tokens with the same mounts (tiled, whole-matrix, column, random;
full-write lifts, span energies, the coverage sweep over modes {1, 2, 4, 8, 16}, tile-local lifts):

* lit_svd: forward in batches, the site's input/output reduced to token sums as each batch passes
  (``lit_svd.analysis.mounts.site_sums``: one projection matmul, Gram-Cholesky 8 x 8 fits);
* reference: store every token's activations, then loop over mounts (one pass over all tokens per
  mount) and over tokens for the sparse least-squares coverage (``numpy.linalg.lstsq`` per token).

Each side runs in its own child process; its peak memory is the kernel's peak RSS (VmHWM, reset after
the model is loaded, the mounts planned and one warm-up forward run) above the RSS at that moment.
Prints tokens/s, peak memory and the ratios; checks that both sides report the same figures.

With the controls on both sides: the data ceiling (lit_svd: one Gram matrix of the
normalised outputs per batch; reference: numpy eigen-decomposition of all stored outputs) and the
structureless null (the same figures for a Haar-rotated matrix with the site's singular values, scored on
every ``--null-stride``-th token). lit_svd's extra time for the two controls is printed against its
own scoring time (target: at most +30 %).

    .venv/bin/python bench/mounts_bench.py [--tokens 16384] [--layer 10] [--site down] [--widths scaled]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import torch
from conditions import report_conditions  # bench/conditions.py

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lit_svd.analysis import mounts as M  # noqa: E402
from lit_svd.models.hooks import Hook, first_input, hooks  # noqa: E402

WIKITEXT = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "wikitext-2", "valid.txt")
NULL_SEED = 20011


class _Stop(Exception):
    pass


def _setup(args):
    from lit_svd.datamodules.text import read_local_text, sample_windows, tokenize_texts
    from lit_svd.models import load_causal_lm, view

    model, tok = load_causal_lm("smollm2-135m")
    v = view(model)
    ids = tokenize_texts(tok, read_local_text(WIKITEXT))
    windows = torch.stack(sample_windows(ids, 128, args.tokens, 0))
    W, b = v.site_weight(args.layer, args.site)
    width = M.scaled_tile_width(args.site, W.shape[0]) if args.widths == "scaled" else M.PAPER_TILE_WIDTHS[args.site]
    plan = M.plan_site(W.mT, width, 2, [1, 2, 4, 8, 16], 8, 0, linear=True, bias=b)  # a module site: dh = x W + b
    null = M.plan_site(M.haar_null(W.mT, NULL_SEED), width, 2, [1, 2, 4, 8, 16], 8, 0)
    warm = _batches(model, v, windows[:8], args)  # warm-up: one-time allocations of the first forward
    next(warm)
    warm.close()  # removes its hook
    return model, v, windows, plan, null


def _reset_peak() -> float:
    """Reset the kernel's peak-RSS counter (VmHWM) and return the current RSS in MB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmRSS")


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def _batches(model, v, windows, args):
    """Yield ``(x, dh)`` of the site for each batch of 8 windows (the forward stops after the site)."""
    mod = v.site_module(args.layer, args.site)
    got = {}

    def hook(m, a, kw, o):
        x = first_input(a, kw)
        got["io"] = (x.reshape(-1, x.shape[-1]), v.site_output(args.layer, args.site, o).reshape(-1, o.shape[-1]))
        raise _Stop

    with hooks(Hook(mod, hook, "post")):
        for i in range(0, len(windows), 8):
            try:
                with torch.no_grad():
                    model(input_ids=windows[i : i + 8])
            except _Stop:
                pass
            yield got.pop("io")


def run_lit_svd(args, q):
    model, v, windows, plan, null = _setup(args)
    base = _reset_peak()
    t = time.perf_counter()
    sums = nsums = gram = None
    scoring = ceil_s = null_s = 0.0
    for x, dh in _batches(model, v, windows, args):
        t0 = time.perf_counter()
        one = M.site_sums(plan, x, dh, ceiling=False)
        t1 = time.perf_counter()
        g = M.ceiling_sum(dh, x if plan.affine is not None else None)
        t2 = time.perf_counter()
        none = M.site_sums(null, x[:: args.null_stride], None, ceiling=False)  # the null's own writes
        t3 = time.perf_counter()
        scoring, ceil_s, null_s = scoring + t1 - t0, ceil_s + t2 - t1, null_s + t3 - t2
        sums = one if sums is None else M.add_sums(sums, one)
        nsums = none if nsums is None else M.add_sums(nsums, none)
        gram = g if gram is None else gram + g
    row = M.summarize(plan, {**sums, "gram": gram})
    null_row = M.summarize(null, nsums)
    dt = time.perf_counter() - t
    q.put(
        dict(
            seconds=dt,
            scoring=scoring + ceil_s + null_s,
            scoring_base=scoring,
            controls=ceil_s + null_s,
            ceiling=ceil_s,
            null=null_s,
            peak_mb=_status_mb("VmHWM") - base,
            row=_figures(row, null_row),
        )
    )


def _reference_figures(plan, X, D):
    """The figures by loops over mounts and tokens (numpy, every token's activations in memory)."""
    n2 = (D * D).sum(1) + M.EPS
    ref = plan.ref.numpy().astype(np.float32)
    row = {}
    for s in M.STRATEGIES:
        U = plan.strategies[s].U.numpy().astype(np.float32)
        row[f"lift_{s}"] = float(
            np.mean([np.mean((D @ U[:, j]) ** 2 / n2) - np.mean((D @ ref[:, j]) ** 2 / n2) for j in range(U.shape[1])])
        )
        Q, _ = np.linalg.qr(U)
        row[f"span_{s}"] = float(np.mean(((D @ Q) ** 2).sum(1) / n2))
    lifts = []
    for _, tiled, rand in plan.coverage:
        fr = []
        for cd in (tiled, rand):
            A = cd.D.numpy().astype(np.float32)
            resid = 0.0
            for t_ in range(len(D)):
                idx = np.argsort(-np.abs(D[t_] @ A))[:8]
                coef, *_ = np.linalg.lstsq(A[:, idx], D[t_], rcond=None)
                resid += float(np.sum((D[t_] - A[:, idx] @ coef) ** 2))
            fr.append(1 - resid / float(np.sum(D.astype(np.float64) ** 2)))
        lifts.append(fr[0] - fr[1])
    row["coverage_lift"] = lifts
    tiled, Wn = plan.strategies["tiled"], plan.W.numpy().astype(np.float32)
    tl = []
    for j in range(len(tiled)):
        s, e = plan.tiles[tiled.tile[j]]
        tw = X[:, s:e] @ Wn[:, s:e].T
        tn = (tw * tw).sum(1) + M.EPS
        tl.append(
            float(
                np.mean((tw @ tiled.U[:, j].numpy().astype(np.float32)) ** 2 / tn) - np.mean((tw @ ref[:, j]) ** 2 / tn)
            )
        )
    row["tile_lift"] = tl
    return row


def run_reference(args, q):
    model, v, windows, plan, null = _setup(args)
    base = _reset_peak()
    t = time.perf_counter()
    xs, dhs = zip(*[(x.numpy().copy(), dh.numpy().copy()) for x, dh in _batches(model, v, windows, args)])
    X, D = np.concatenate(xs), np.concatenate(dhs)  # every token's activations
    t0 = time.perf_counter()
    row = _reference_figures(plan, X, D)
    Y = D.astype(np.float64) / np.sqrt((D.astype(np.float64) ** 2).sum(1) + M.EPS)[:, None]
    row["span_ceiling"] = float(np.linalg.eigvalsh(Y.T @ Y)[::-1][: plan.n].sum() / len(Y))
    Xn = np.concatenate([x[:: args.null_stride] for x in xs])  # the null's tokens: every k-th of each batch
    null_row = _reference_figures(null, Xn, Xn @ null.W.numpy().astype(np.float32).T)
    dt = time.perf_counter() - t
    q.put(
        dict(
            seconds=dt,
            scoring=time.perf_counter() - t0,
            peak_mb=_status_mb("VmHWM") - base,
            row=_figures(row, null_row),
        )
    )


def _figures(row, null_row):
    keys = [f"lift_{s}" for s in M.STRATEGIES] + [f"span_{s}" for s in M.STRATEGIES] + ["coverage_lift", "tile_lift"]
    return {
        **{k: row[k] for k in keys},
        "span_ceiling": row["span_ceiling"],
        **{f"null_{k}": null_row[k] for k in keys},
    }


def _child(fn, args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=(args, q))
    p.start()
    out = q.get()
    p.join()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--layer", type=int, default=10)
    ap.add_argument("--site", default="down", choices=sorted(M.PAPER_TILE_WIDTHS))
    ap.add_argument("--widths", default="scaled", choices=["scaled", "fixed"])
    ap.add_argument("--null-stride", type=int, default=8)  # the shipped config's null_stride
    args = ap.parse_args()
    report_conditions()
    print(
        f"SmolLM2 site {args.site} layer {args.layer} ({args.widths} tile widths, null on every {args.null_stride}"
        f" token(s)), {args.tokens} WikiText-2 tokens, torch threads "
        f"{torch.get_num_threads()} (shared machine: timings taken under load from other jobs)"
    )
    ours = _child(run_lit_svd, args)
    ref = _child(run_reference, args)
    worst = 0.0
    for k, a in ours["row"].items():
        b = ref["row"][k]
        worst = max(worst, float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
    for name, r in (("lit_svd (streaming sums)", ours), ("reference (store + loop)", ref)):
        print(
            f"{name:26s} {args.tokens / r['seconds']:8.0f} tokens/s with the forward ({r['seconds']:7.2f} s), "
            f"{args.tokens / r['scoring']:8.0f} tokens/s scoring only ({r['scoring']:7.2f} s), "
            f"peak +{r['peak_mb']:7.1f} MB"
        )
    print(
        f"speed ratio  lit_svd / reference: {ref['seconds'] / ours['seconds']:.1f}x faster with the forward, "
        f"{ref['scoring'] / ours['scoring']:.1f}x scoring only (target >= 3x)"
    )
    base = ours["scoring_base"]
    print(
        f"controls (ceiling + null) add {100 * ours['controls'] / base:.0f} % to lit_svd's scoring time"
        f" ({ours['controls']:.2f} s on {base:.2f} s; target <= 30 %): ceiling {100 * ours['ceiling'] / base:.0f} %,"
        f" null on every {args.null_stride} token(s) {100 * ours['null'] / base:.0f} %"
    )
    print(f"memory ratio lit_svd / reference: {ours['peak_mb'] / max(ref['peak_mb'], 1e-9):.2f} (target <= 0.5)")
    print(f"largest difference between the two sides' figures: {worst:.2e}")
    print(
        json.dumps(
            {
                "tokens": args.tokens,
                "ours": {k: ours[k] for k in ("seconds", "peak_mb")},
                "ours_scoring": ours["scoring"],
                "reference_scoring": ref["scoring"],
                "ours_scoring_base": ours["scoring_base"],
                "ours_controls": ours["controls"],
                "ours_ceiling": ours["ceiling"],
                "ours_null": ours["null"],
                "reference": {k: ref[k] for k in ("seconds", "peak_mb")},
                "max_abs_diff": worst,
            }
        )
    )


if __name__ == "__main__":
    main()
