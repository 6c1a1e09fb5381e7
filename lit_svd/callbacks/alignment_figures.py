"""Matplotlib figures of the toy alignment experiment (each returns a Figure; the caller saves it)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def heatmaps(cos_u: torch.Tensor, cos_v: torch.Tensor, pairs: list[tuple[int, int, float]], max_cols: int = 25):
    """|cos(w_i, u_k)| and |cos(w_j, v_k)| of one instance; template pairs' features marked on the axis."""
    k = min(max_cols, cos_u.shape[-1])
    fig, axes = plt.subplots(1, 2, figsize=(8, 4.2), sharey=True)
    for ax, cos, title, feats in ((axes[0], cos_u, "|cos(w_i, u_k)| (query side)", {p[0] for p in pairs}),
                                  (axes[1], cos_v, "|cos(w_j, v_k)| (key side)", {p[1] for p in pairs})):
        im = ax.imshow(cos[:, :k].numpy(), aspect="auto", vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("singular index k")
        for f in feats:
            ax.axhline(f, color="w", lw=0.4, alpha=0.5)
    axes[0].set_ylabel("feature")
    fig.colorbar(im, ax=axes, shrink=0.8)
    return fig


def spectra(singular_values: list[torch.Tensor]):
    """Singular values of every instance, normalised by the largest."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for s in singular_values:
        s = torch.as_tensor(s)
        ax.plot(range(len(s)), (s / s[0].clamp_min(1e-30)).numpy(), marker=".", lw=0.8, alpha=0.7)
    ax.set_yscale("log")
    ax.set_xlabel("singular index k")
    ax.set_ylabel("sigma_k / sigma_1")
    ax.set_title(f"Omega spectra ({len(singular_values)} instance(s))", fontsize=9)
    return fig


def dynamics(history: list[tuple[int, list[float]]]):
    """Mean |cos| of each instance over training steps."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    steps = [s for s, _ in history]
    for n in range(len(history[0][1]) if history else 0):
        ax.plot(steps, [v[n] for _, v in history], lw=0.8, alpha=0.7)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("mean |cos| over pairs")
    ax.set_title("alignment dynamics", fontsize=9)
    return fig


def interference_sweep(interference: list[float], reports: list[dict]):
    """Mean |cos| (raw features) and |cos| with the least-squares prediction against ||E_X||_2."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    raw = [r["mean_abs_cos"] for r in reports]
    pred = [sum((m["cos_query_prediction"] + m["cos_key_prediction"]) / 2 for m in r["pairs"]) / len(r["pairs"])
            for r in reports]
    ax.plot(interference, raw, "o", label="|cos(feature, singular vector)|")
    ax.plot(interference, pred, "s", mfc="none", label="|cos(prediction, singular vector)|")
    ax.set_xlabel("interference ||E_X||_2")
    ax.set_ylabel("mean |cos| over pairs")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    return fig
