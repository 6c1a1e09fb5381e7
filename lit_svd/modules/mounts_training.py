"""Tiled-SVD mount scores of a model while it trains (``callbacks.mounts_training.MountsCallback``): the chosen
site-layers mounted from their live weights and scored on a probe batch with the same pure functions and the
same row assembly as the mounts test run (``analysis.mounts``: ``plan_site``, ``site_sums``, ``summarize``,
``judge``; ``modules.mounts``: ``site_row``, ``judge_row``, ``steer_scores``)."""

from __future__ import annotations

import math

import torch

from lit_svd.analysis import mounts as M
from lit_svd.models.hooks import capture
from lit_svd.modules.mounts import judge_row, site_row, steer_context, steer_scores

__all__ = ["probe_activations", "score_site_layers"]


def probe_activations(view, lm, ids, mask, keys: list[tuple[int, str]]) -> dict:
    """``{(layer, site): (x [T, d_in], dh [T, d_out])}``: each site's input and its own output on the
    probe's real tokens, from one forward pass."""
    mods = {key: view.site_module(*key) for key in keys}
    with capture(mods, "pre") as xin, capture(mods, "post") as xout:
        lm(input_ids=ids, attention_mask=mask)
    keep = mask.reshape(-1).bool()
    flat = lambda t: t.reshape(-1, t.shape[-1])[keep]  # noqa: E731
    return {key: (flat(xin[key]), flat(view.site_output(*key, xout[key]))) for key in keys}


def score_site_layers(
    view,
    lm,
    ids,
    mask,
    keys: list[tuple[int, str]],
    tile_widths: dict[str, int],
    modes: int,
    sweep: list[int],
    k_active: int,
    seed: int,
    rules: M.MountRules,
    reduce=lambda t: t,
    null_control: bool = False,
    steer: dict | None = None,
) -> list[dict]:
    """One row per (layer, site) of ``keys``: ``summarize`` of the probe's token sums (``reduce`` sums them
    over DDP ranks) plus ``judge``'s checks, exactly as the mounts test run computes them. ``null_control``:
    also the site-layer's structureless null (``row["null"]``, same seed as the test run); ``steer``: check C1
    on residual sites (``{"texts", "alpha", "mounts"}``: ``steer_scores`` on those texts, their prefix cached
    once as the test run's ``"last"`` mode)."""
    plans, nulls = {}, {}
    for key in keys:
        W = view.site_weight(*key)[0].mT
        # plans are built on the CPU in float64 (the same mounts on every device), scored where the model runs
        plans[key] = M.plan_site(W, tile_widths[key[1]], modes, sweep, k_active, seed, f"tile_widths.{key[1]}").to(
            W.device
        )
        if null_control:
            nulls[key] = M.plan_site(
                M.haar_null(W, M.null_seed(*key)),
                tile_widths[key[1]],
                modes,
                sweep,
                k_active,
                seed,
                f"tile_widths.{key[1]}",
            ).to(W.device)
    acts = probe_activations(view, lm, ids, mask, keys) if ids.shape[0] else {}
    if steer is not None:
        steer = {**steer, "context": steer_context(lm, steer["texts"])}
    jobs = [(key, plans[key], True) for key in keys] + [(key, nulls[key], False) for key in nulls]
    flat = []
    for key, plan, real in jobs:  # a rank without probe windows adds zeros
        shapes = M.sum_shapes(plan.n, len(plan.coverage), plan.d_out, ceiling=real)
        if key in acts:
            x, dh = acts[key]
            sums = M.site_sums(plan, x, dh if real else None, ceiling=real)  # None: the null scores its own writes
        else:
            sums = {}
        flat += [
            sums[k].reshape(-1).double()
            if k in sums
            else torch.zeros(shape, dtype=torch.float64, device=W.device).reshape(-1)
            for k, shape in shapes.items()
        ]
    total, start = reduce(torch.cat(flat)), 0
    summaries = {}
    for key, plan, real in jobs:
        sums = {}
        for k, shape in M.sum_shapes(plan.n, len(plan.coverage), plan.d_out, ceiling=real).items():
            size = math.prod(shape)
            sums[k], start = total[start : start + size].reshape(shape), start + size
        summaries[key, real] = M.summarize(plan, sums)
    rows = []
    for key in keys:
        layer, site = key
        null = summaries[key, False] if null_control else None
        row = site_row(layer, site, "module", tile_widths[site], summaries[key, True], null)
        if steer is not None and row["residual"]:
            W_U = view.unembed()[0].double()
            row.update(
                steer_scores(
                    view,
                    lm,
                    steer["context"],
                    plans[key],
                    row["tile_lift"],
                    layer,
                    site,
                    W_U,
                    steer["alpha"],
                    steer["mounts"],
                )
            )
            if null_control:
                row["null"].update(
                    steer_scores(
                        view,
                        lm,
                        steer["context"],
                        nulls[key],
                        row["null"]["tile_lift"],
                        layer,
                        site,
                        W_U,
                        steer["alpha"],
                        steer["mounts"],
                    )
                )
        judge_row(row, rules)
        rows.append(row)
    return rows
