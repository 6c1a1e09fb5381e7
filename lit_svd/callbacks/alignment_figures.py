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


def interference_sweep(instances: list[dict]):
    """Theorem 1 against ||E_X||_2, read from the instances' results.json records: |cos(u_1, whitened
    prediction)| and |cos(u_1, x_1)| of each ``theorem1`` record (singular index 0, the theorem's claim), and
    the mean |cos| over pairs at each pair's recorded ``singular_index`` (``mean_abs_cos``)."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    x = [i["interference"] for i in instances]
    ax.plot(x, [i["theorem1"]["cos_u1_prediction"] for i in instances], "s", mfc="none",
            label="|cos(u_1, Sigma_X^-1 x_1)| (whitened prediction)")
    ax.plot(x, [i["theorem1"]["cos_u1_raw"] for i in instances], "o", label="|cos(u_1, x_1)| (raw feature)")
    ax.plot(x, [i["mean_abs_cos"] for i in instances], "x", label="mean |cos| over pairs, matched index")
    ax.set_xlabel("interference ||E_X||_2")
    ax.set_ylabel("|cos|")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    return fig


def theorem1_superposition(groups: list[dict], n_features: int):
    """Theorem 1 across N/D and ||E_X||_2 from ``summary.theorem1_groups``: the mean over seeds (line) and
    the worst seed (open marker) of |cos(u_1, whitened prediction)| (solid) and |cos(u_1, x_1)| (dashed)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    dims = sorted({g["d_model"] for g in groups}, reverse=True)
    for color, d in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], dims):
        rows = sorted((g for g in groups if g["d_model"] == d), key=lambda g: g["interference_mean"])
        x = [g["interference_mean"] for g in rows]
        for key, ls, mk, name in (("cos_u1_prediction", "-", "s", "whitened prediction"),
                                  ("cos_u1_raw", "--", "o", "raw x_1")):
            ax.plot(x, [g[f"{key}_mean"] for g in rows], ls=ls, marker=mk, color=color,
                    label=f"N/D = {n_features / d:g}: {name} (mean)")
            ax.plot(x, [g[f"{key}_worst"] for g in rows], ls="none", marker=mk, mfc="none", color=color, alpha=0.7)
    ax.set_xlabel("interference ||E_X||_2 (mean over seeds)")
    ax.set_ylabel("|cos(u_1, .)|  (open markers: worst seed)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Theorem 1 in superposition (N = {n_features}, {groups[0]['n_seeds']} seeds per point)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    return fig
