"""Factored vs dense SVD of every head's augmented QK and OV matrix, measured side by side.

For SmolLM2-135M (30 layers x 9 heads, d_model 576, rank <= 64) and a random GPT-2-small-sized model
(12 x 12, d_model 768, rank <= 64): the time of ``FactoredABt.svd`` (QR of the thin factors) against
``torch.linalg.svd`` of the same dense augmented matrices (the dense products are formed *before* the
clock starts, so the dense side is not charged for them), batched over heads on both sides, and the
largest difference in the kept singular values (relative to each matrix's top singular value, and
relative to each value itself). Rotary QK matrices are taken at offset 0 (every offset is one more
matrix of the same size and cost).

    .venv/bin/python bench/svd_bench.py [--models smollm2,gpt2] [--threads 1] [--figure PATH_WITH_{model}]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from conditions import report_conditions  # noqa: E402  (bench/conditions.py)
from tqdm import tqdm  # noqa: E402

from lit_svd.linalg import FactoredABt  # noqa: E402
from lit_svd.models import ModelView, load_causal_lm, view  # noqa: E402
from lit_svd.models.tiny import tiny_causal_lm  # noqa: E402


def matrices(v: ModelView) -> list[tuple[str, FactoredABt]]:
    out = []
    for layer in range(v.n_layers):
        out.append((f"qk{layer}", v.qk(layer, 0 if v.rotary_dim else None)))
        out.append((f"ov{layer}", v.ov(layer)))
    return out


def plot_spectra(name: str, mats, fact, path: str) -> None:
    """Normalised singular values ``S / S[0]`` of every head's QK and OV matrix, coloured by layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=True)
    n_layers = len(mats) // 2
    for (label, _), svd in zip(mats, fact):
        ax = axes[0 if label.startswith("qk") else 1]
        layer = int(label[2:])
        S = (svd.S / svd.S[..., :1]).T.cpu()
        ax.semilogy(S, color=plt.cm.viridis(layer / max(1, n_layers - 1)), lw=0.5, alpha=0.6)
    for ax, title in zip(axes, ("QK (offset 0)", "OV")):
        ax.set_title(f"{name}: {title}, every head")
        ax.set_xlabel("direction k")
    axes[0].set_ylabel("S_k / S_0  (colour: layer)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def bench(name: str, v: ModelView, figure: str | None = None) -> dict[str, float]:
    mats = matrices(v)
    dense = [fm.dense() for _, fm in mats]
    t0 = time.perf_counter()
    fact = [fm.svd() for _, fm in tqdm(mats, desc=f"{name} factored", leave=False)]
    t_fact = time.perf_counter() - t0
    if figure:
        plot_spectra(name, mats, fact, figure.format(model=name))
    t0 = time.perf_counter()
    ref = [torch.linalg.svd(M, full_matrices=False) for M in tqdm(dense, desc=f"{name} dense", leave=False)]
    t_dense = time.perf_counter() - t0
    rel_top, rel_each = 0.0, 0.0
    for f, (_, S, _) in zip(fact, ref):
        k = f.S.shape[-1]
        diff = (f.S - S[..., :k]).abs()
        rel_top = max(rel_top, (diff / S[..., :1]).max().item())
        rel_each = max(rel_each, (diff / S[..., :k]).max().item())
    n_heads = sum(fm.A.shape[0] for _, fm in mats)
    return {
        "matrices": n_heads,
        "shape": tuple(mats[0][1].shape[-2:]),
        "factored_s": t_fact,
        "dense_s": t_dense,
        "speedup": t_dense / t_fact,
        "max_rel_diff_vs_top": rel_top,
        "max_rel_diff_each": rel_each,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2,gpt2", help="comma list of smollm2, gpt2")
    parser.add_argument(
        "--figure",
        default=None,
        help="also plot every head's normalised spectrum, e.g. docs/figures/models_{model}_spectra.png",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: multi-threaded LAPACK spins badly on a shared 2-core machine)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    report_conditions()
    rows = {}
    with torch.no_grad():
        for name in args.models.split(","):
            if name == "smollm2":
                model = load_causal_lm("smollm2-135m")[0]
            elif name == "gpt2":
                model = tiny_causal_lm(
                    "gpt2", seed=0, vocab_size=1024, n_embd=768, n_layer=12, n_head=12, n_positions=1024
                )
            else:
                raise ValueError(f"--models: unknown {name!r}; allowed: smollm2, gpt2")
            rows[name] = bench(name, view(model), args.figure)
            del model
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32")
    print(
        f"{'model':8} {'heads x (QK+OV)':>16} {'QK matrix':>11} {'factored s':>11} {'dense s':>9} {'speedup':>8}"
        f" {'max rel dS (top)':>17} {'max rel dS (each)':>18}"
    )
    for name, r in rows.items():
        print(
            f"{name:8} {r['matrices']:>16} {str(r['shape']):>11} {r['factored_s']:>11.3f} {r['dense_s']:>9.2f}"
            f" {r['speedup']:>7.1f}x {r['max_rel_diff_vs_top']:>17.2e} {r['max_rel_diff_each']:>18.2e}"
        )


if __name__ == "__main__":
    main()
