"""The control figure of a method's result for a model's report page (``python -m lit_svd report``): the number
a method claims beside what its control gives. ``control(result)`` returns a figure, or None for a result
without one. Pure functions of the result, as every figure here."""

from __future__ import annotations

import numpy as np

from lit_svd.figures.base import new_figure
from lit_svd.results import DirectionCheckResult, MaskResult, MountsResult, SADResult


def control(result):
    """The control figure of ``result`` (SAD, mask, direction-check or mounts result), else None."""
    for kind, draw in (
        (SADResult, sad_against_controls),
        (MaskResult, masks_kept_and_kl),
        (DirectionCheckResult, directions_pass_rates),
        (MountsResult, mounts_real_and_null),
    ):
        if isinstance(result, kind):
            return draw(result)
    return None


def sad_against_controls(result: SADResult):
    """Heads sparser than each control (matched-spectrum null, pair null, rotated basis), of the eligible heads."""
    s = result.overall
    labels, counts = [], []
    for key, label in (("null", "matched null"), ("unattended", "pair null"), ("rotated", "rotated")):
        if f"n_heads_sparser_than_{key}" in s:
            labels.append(label)
            counts.append(s[f"n_heads_sparser_than_{key}"])
    fig, ax = new_figure(figsize=(4.2, 3.0))
    ax.bar(labels, counts, color="tab:blue")
    ax.axhline(s["n_heads_eligible"], color="grey", ls="--", lw=0.8, label=f"eligible heads ({s['n_heads_eligible']})")
    ax.set_ylabel("heads sparser than the control")
    ax.set_title("SAD: singular basis against its controls", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def masks_kept_and_kl(result: MaskResult):
    """Kept fraction and hard-mask KL along training (the trajectory's validation batch): sparsity is bought
    with KL; the final test values are marked."""
    traj = result.trajectory
    fig, ax = new_figure(figsize=(4.6, 3.0))
    if traj:
        steps = np.array([t["step"] for t in traj], dtype=float)
        ax.plot(steps, [t["kept_fraction"] for t in traj], color="tab:blue", label="kept fraction")
    ax.axhline(result.kept_fraction, color="tab:blue", ls=":", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("kept fraction", color="tab:blue")
    ax.set_ylim(0, 1.02)
    kl = ax.twinx()
    if traj:
        kl.plot(steps, [t["kl_hard"] for t in traj], color="tab:red", label="KL hard")
    kl.axhline(result.kl_hard, color="tab:red", ls=":", lw=0.8)
    kl.set_ylabel("KL(full || hard-masked)", color="tab:red")
    ax.set_title(f"kept {result.kept_fraction:.2%} at KL {result.kl_hard:.3g} ({result.eval_split})", fontsize=9)
    return fig


def directions_pass_rates(result: DirectionCheckResult):
    """Fraction of claimed directions passing the causal check (all, isolated, in blocks) against the level
    a random direction passes at."""
    bars = [
        ("all", result.fraction_pass),
        ("isolated", result.fraction_pass_isolated),
        ("in blocks", result.fraction_pass_in_blocks),
    ]
    fig, ax = new_figure(figsize=(4.2, 3.0))
    ax.bar([b[0] for b in bars], [b[1] if b[1] is not None else np.nan for b in bars], color="tab:green")
    ax.axhline(result.level, color="grey", ls="--", lw=0.8, label=f"random directions ({result.level:g})")
    ax.set_ylim(0, 1)
    ax.set_ylabel("fraction passing")
    ax.set_title(f"{result.n_pass}/{result.n_directions} kept directions pass", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def mounts_real_and_null(result: MountsResult):
    """Site-layers passing every check, per site: the real weights against the structureless null."""
    sites = list(dict.fromkeys(r["site"] for r in result.sites))
    real = [sum(bool(r["pass"]) for r in result.sites if r["site"] == s) for s in sites]
    null = [sum(bool((r.get("null") or {}).get("pass")) for r in result.sites if r["site"] == s) for s in sites]
    total = [sum(r["site"] == s for r in result.sites) for s in sites]
    x = np.arange(len(sites))
    fig, ax = new_figure(figsize=(1.6 + 0.6 * len(sites), 3.0))
    ax.bar(x - 0.2, real, width=0.4, label=f"real ({sum(real)})", color="tab:blue")
    ax.bar(x + 0.2, null, width=0.4, label=f"null ({sum(null)})", color="tab:gray")
    ax.scatter(x, total, marker="_", color="k", label="layers")
    ax.set_xticks(x)
    ax.set_xticklabels(sites)
    ax.set_ylabel("site-layers passing")
    ax.set_title("mounts: real weights against the null", fontsize=9)
    ax.legend(fontsize=7)
    return fig
