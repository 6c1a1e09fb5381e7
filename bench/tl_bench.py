"""lit_svd against TransformerLens 4.3 on SmolLM2-135M: the SVD of every head's QK and OV matrix, timed side by side
in one run, and the singular values compared where both define the same matrix.

    pip install -e '.[peers]'                 # transformer-lens==4.3.0 (bench only; lit_svd never imports it)
    OMP_NUM_THREADS=1 python bench/tl_bench.py [--repeats 5]

The two libraries' matrices (SmolLM2 is a Llama: RMSNorm, rotary, grouped-query attention, no q/k/v/o biases):

* TransformerLens: ``TransformerBridge.boot_transformers(name, hf_model=..., tokenizer=...)`` keeps the raw HF
  weights; ``bridge.QK = W_Q W_K^T`` and ``bridge.OV = W_V W_O`` per head (``[n_layers, n_heads, d_model,
  d_model]``, no biases, no attention scale, no rotary, kv heads repeated). ``enable_compatibility_mode()``
  processes the weights as HookedTransformer does: RMSNorm weights folded into the reading matrices (centring
  of writing weights applies to LayerNorm models only, so not here).
* lit_svd: ``view.qk(layer, 0)`` is ``[1, x] A B^T [1, x]^T`` with ``A = [b_Q; W_Q] / sqrt(d_head)`` and
  ``B = [b_K; W_K]`` (bias-augmented, ``[d_model + 1]`` per side, the attention scale included, rotary at offset
  0 = no rotation); ``view.ov(layer) = [b_V; W_V] W_O``. ``fold_norms=True`` (the default) folds the RMSNorm
  weights in; ``fold_norms=False`` does not. "Without biases" is the same from ``W_Q, W_K, W_V, W_O`` alone.

Same matrix, so the singular values must agree: TL raw = lit_svd ``fold_norms=False``, TL compatibility mode =
lit_svd ``fold_norms=True``; lit_svd's QK values are TL's times ``1 / sqrt(d_head)`` (divided out below). With
biases the augmented matrices have one more row and column; SmolLM2 has no biases, so the bias row is zero
and the nonzero singular values are the same (checked too). Timed: building the factors from the model's
weights plus the factored SVD of all 270 heads, QK and OV, median of ``--repeats`` runs each, one thread.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from conditions import report_conditions  # noqa: E402  (bench/conditions.py)

from lit_svd.linalg import FactoredABt  # noqa: E402
from lit_svd.models import load_causal_lm, view  # noqa: E402


def ours(v, biases: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values ``[n_layers, n_heads, d_head]`` of every head's QK and OV matrix (lit_svd)."""
    qk, ov = [], []
    for layer in range(v.n_layers):
        if biases:
            qk.append(v.qk(layer, 0 if v.rotary_dim else None).svd().S)
            ov.append(v.ov(layer).svd().S)
        else:
            w = v.attn(layer)
            qk.append(FactoredABt(w.W_Q * w.scale, w.W_K).svd().S)
            ov.append(FactoredABt(w.W_V, w.W_O.mT).svd().S)
    return torch.stack(qk), torch.stack(ov)


def theirs(bridge) -> tuple[torch.Tensor, torch.Tensor]:
    """The same from TransformerLens (``FactoredMatrix.svd()`` of the stacked per-head factors)."""
    return bridge.QK.svd()[1], bridge.OV.svd()[1]


def timed(fn, repeats: int) -> tuple[float, tuple]:
    out, times = None, []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference of the singular values, relative to each head's top singular value."""
    a, b = a.double(), b.double()
    k = min(a.shape[-1], b.shape[-1])
    return ((a[..., :k] - b[..., :k]).abs() / a[..., :1].clamp_min(1e-30)).max().item()


def main() -> None:
    from transformer_lens.model_bridge import TransformerBridge

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--name", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="the name TL boots it under")
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    from importlib.metadata import version

    report_conditions()
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, transformer-lens {version('transformer-lens')}"
    )
    lm, tok = load_causal_lm(opts.model)
    raw = TransformerBridge.boot_transformers(opts.name, hf_model=copy.deepcopy(lm), tokenizer=tok)
    compat = TransformerBridge.boot_transformers(opts.name, hf_model=copy.deepcopy(lm), tokenizer=tok)
    compat.enable_compatibility_mode()
    v_fold, v_raw = view(lm, fold_norms=True), view(lm, fold_norms=False)
    scale = v_fold.attn(0).scale
    print(
        f"{opts.model}: {v_fold.n_layers} layers x {v_fold.n_heads} heads, d_model {v_fold.d_model}, d_head "
        f"{v_fold.d_head}; lit_svd QK includes the attention scale {float(scale):.4f} (divided out below)"
    )
    runs = {
        "TransformerLens, raw weights": lambda: theirs(raw),
        "TransformerLens, compatibility mode (folded norms)": lambda: theirs(compat),
        "lit_svd, biases, fold_norms=True": lambda: ours(v_fold, True),
        "lit_svd, no biases, fold_norms=True": lambda: ours(v_fold, False),
        "lit_svd, no biases, fold_norms=False": lambda: ours(v_raw, False),
        "lit_svd, biases, fold_norms=False": lambda: ours(v_raw, True),
    }
    got = {}
    print(f"\n{'QK and OV SVD of every head':55} {'median s':>9}  (of {opts.repeats})")
    for name, fn in runs.items():
        seconds, (qk, ov) = timed(fn, opts.repeats)
        got[name] = (seconds, qk, ov)
        print(f"{name:55} {seconds:9.3f}")
    tl_raw, tl_fold = got["TransformerLens, raw weights"], got["TransformerLens, compatibility mode (folded norms)"]
    print("\ntime ratio lit_svd / TransformerLens (same processing; < 1: lit_svd faster)")
    for ours_name, tl in (
        ("lit_svd, biases, fold_norms=True", tl_fold),
        ("lit_svd, no biases, fold_norms=True", tl_fold),
        ("lit_svd, no biases, fold_norms=False", tl_raw),
    ):
        print(f"  {ours_name:53} {got[ours_name][0] / tl[0]:6.2f}x")
    print("\nsingular values, largest difference relative to each head's top value (the same matrices)")
    for ours_name, tl, what in (
        ("lit_svd, no biases, fold_norms=False", tl_raw, "TL raw"),
        ("lit_svd, biases, fold_norms=False", tl_raw, "TL raw"),
        ("lit_svd, no biases, fold_norms=True", tl_fold, "TL compatibility mode"),
        ("lit_svd, biases, fold_norms=True", tl_fold, "TL compatibility mode"),
    ):
        _, qk, ov = got[ours_name]
        print(
            f"  {ours_name:40} vs {what:22} QK {max_rel_diff(tl[1], qk / scale):.2e}  OV {max_rel_diff(tl[2], ov):.2e}"
        )
    _, qk_f, _ = got["lit_svd, no biases, fold_norms=True"]
    print(
        "  (a control that must differ: folded vs raw norms, QK "
        f"{max_rel_diff(tl_raw[1], qk_f / scale):.2e}: the RMSNorm weights change the matrices)"
    )


if __name__ == "__main__":
    main()
