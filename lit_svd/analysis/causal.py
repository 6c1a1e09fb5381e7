"""A causal check per claimed direction: does patching the component along that direction alone move the
task metric by more than patching random unit directions of the same component?

A direction of a component (``lit_svd.models.intervene.Component``: one head's OV map, or an MLP map) is a
unit vector ``a`` in the basis of its write directions ``V`` of one group (head): ``e_k`` for the claimed
singular direction ``k``, a Haar-random unit vector (a normalised Gaussian) for the null. Patching along
``a`` at the answer position sets that direction's coefficient ``c . a`` (``c``: the group's coefficients,
``Component.coefficients``) to its value on the corrupted prompt and leaves the orthogonal rest as it was:

    out' = out + ((c_corrupt - c) . a) V a

The effect of a direction is the mean over prompts of the change in the task metric (IOI / GP: logit
difference correct - wrong; GT: probability difference greater - lesser: ``metrics.task_scorer``).
Against ``n_random`` random directions of the same group: ``z = (|effect| - mean |null|) / std |null|``; a
direction *passes* when ``z >= Z_PASS`` (one-sided level ``LEVEL`` = 1 % under a normal null); the empirical
percentile of ``|effect|`` among the draws is reported beside it (``percentile``; with N draws it cannot
resolve below 1 / (N + 1), which is why the level is stated on z).

Beside z, each effect as a fraction of the clean-vs-corrupted metric gap (issue 24):
``gap_fraction = (m(clean) - m(patched)) / (m(clean) - m(corrupted))`` (means over the prompts);
``passes_gap`` needs ``passes`` (z) and ``|gap_fraction| >= MIN_GAP_FRACTION`` (1 % of the gap, fixed before any
run). ``passes`` stays the z-only rule; reports give both counts.

Batched over directions: the change is made at the last position only, so every prompt's prefix runs once
and only the last token runs per direction, fanned out from the component's layer
(``lit_svd.models.fanout``); one forward carries hundreds of directions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.analysis.direction_options import PATCHABLE
from lit_svd.metrics import TaskScorer, task_scorer
from lit_svd.models.base import ModelView
from lit_svd.models.fanout import last_token_copies, prefix_cache
from lit_svd.models.hooks import Hook, first_input, hooks
from lit_svd.models.intervene import Component, Intervention

LEVEL = 0.01  # one-sided level of the check, fixed before any run
Z_PASS = 2.3263478740408408  # the standard normal's 1 - LEVEL quantile
N_RANDOM = 32  # random directions per group (head) in the null, fixed before any run
MIN_GAP_FRACTION = (
    0.01  # a gap pass also needs |effect| >= 1 % of the clean - corrupted metric gap; fixed before any run
)


@dataclass
class Probes:
    """Directions of one component to patch: ``group: [C]`` (head) and ``coords: [C, K]`` (unit vectors in
    that group's ``V`` basis; a zero row patches nothing: the unmodified model)."""

    component: Component
    group: Tensor
    coords: Tensor

    def __len__(self) -> int:
        return len(self.group)

    def write(self) -> Tensor:
        """``[C, d_out]``: each direction in the site's output space."""
        c = self.component
        delta = torch.zeros(len(self), *c.shape, dtype=c.V.dtype, device=c.V.device)
        delta[torch.arange(len(self), device=self.group.device), self.group] = self.coords.to(c.V.dtype)
        return c.write(delta)


def random_coords(n: int, k: int, generator: torch.Generator | None = None) -> Tensor:
    """``[n, k]`` Haar-random unit vectors (uniform on the sphere)."""
    x = torch.randn(n, k, generator=generator, dtype=torch.float64)
    return (x / x.norm(dim=-1, keepdim=True)).float()


def probe_coefficients(probes: Probes, coef: Tensor) -> Tensor:
    """``coef: [R, G, K]`` (rows prompt-major: row ``i * C + j`` is prompt ``i``, probe ``j``) -> ``[R]``: each
    row's coefficient along its probe's direction."""
    C = len(probes)
    rows = torch.arange(coef.shape[0], device=coef.device)
    own = coef[rows, probes.group.repeat(coef.shape[0] // C)]  # [R, K]
    return (own * probes.coords.to(coef.dtype).repeat(coef.shape[0] // C, 1)).sum(-1)


def patch_hook(view: ModelView, probes: Probes, reference: Tensor) -> Hook:
    """The hook that patches row ``i * C + j`` along probe ``j`` toward ``reference[i * C + j]`` (its
    coefficient on the corrupted prompt), at every position of the forward (the fanned-out last token)."""
    c = probes.component
    write = probes.write()  # [C, d_out]

    def hook(module, args, kwargs, out):
        site = view.site_output(c.layer, c.site, out)  # [R, T, d_out]
        src = first_input(args, kwargs) if c.kind == "ov" else site
        R, T = site.shape[:2]
        coef = c.coefficients(src).transpose(0, 1).reshape(T * R, *c.shape)  # position-major rows
        now = probe_coefficients(Probes(c, probes.group.repeat(T), probes.coords.repeat(T, 1)), coef).view(T, R)
        shift = (reference.to(now.dtype)[None] - now).transpose(0, 1)  # [R, T]
        rows = write.to(shift.dtype).repeat(R // len(probes), 1)  # [R, d_out], in the analysis dtype
        # the patch in the analysis dtype, written in the model's (bf16 / fp16 models: float32 maths, bf16 write)
        return view.with_site_output(c.layer, c.site, out, site + (shift[..., None] * rows[:, None]).to(site.dtype))

    return Hook(view.site_module(c.layer, c.site), hook, "post")


@torch.no_grad()
def patched_metrics(
    view: ModelView,
    probes: Probes,
    batch: dict,
    reference: Tensor,
    task: str | TaskScorer,
    rows_per_forward: int = 512,
    progress: Callable[[int], None] | None = None,
) -> Tensor:
    """``[n_prompts, C]``: the task metric at the answer position with each probe patched alone (toward
    ``reference: [n_prompts, G, K]``, the corrupted prompts' coefficients at the answer position). ``batch``:
    the task batch (right-padded, ``answer_pos``). Prompts are grouped by length; each forward carries up to
    ``rows_per_forward`` (prompt, probe) rows. ``progress(k)``: called after every ``k`` probes x prompts."""
    c = probes.component
    if c.kind not in PATCHABLE:
        raise ValueError(f"component {c.name}: the causal check patches {', '.join(PATCHABLE)}; got {c.kind!r}")
    task = task_scorer(task)
    cols = task.columns(batch)
    C = len(probes)
    out = torch.empty(len(batch["answer_pos"]), C, device=batch["answer_pos"].device)
    unembed = view.unembed()
    for length in batch["answer_pos"].unique().tolist():
        idx = torch.nonzero(batch["answer_pos"] == length).flatten()
        ids = batch["clean_ids"][idx, : length + 1]
        prefix = prefix_cache(view, ids)
        per = max(1, rows_per_forward // len(idx))
        for start in range(0, C, per):
            part = Probes(c, probes.group[start : start + per], probes.coords[start : start + per])
            ref = probe_coefficients(part, reference[idx].repeat_interleave(len(part), 0))
            with hooks(patch_hook(view, part, ref)):
                logits = last_token_copies(
                    view,
                    ids,
                    prefix,
                    c.layer,
                    len(part),
                    None if cols is None else cols[idx].repeat_interleave(len(part), 0),
                    unembed,
                )
            out[idx, start : start + len(part)] = (
                task.column_metric(logits, batch, idx.repeat_interleave(len(part))).view(len(idx), -1).float()
            )
            if progress:
                progress(len(part) * len(idx))
    return out


def corrupted_coefficients(view: ModelView, components: Sequence[Component], batch: dict) -> dict[str, Tensor]:
    """Each component's coefficients ``[n, G, K]`` at the answer position of the corrupted prompts."""
    intervention = Intervention(view, components)
    with torch.no_grad(), intervention.record(positions=batch["answer_pos"]) as store:
        view.model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"])
    return dict(store)


def summarize(effect: float, null: Tensor) -> dict:
    """One direction's ``effect`` (mean change of the metric) against its group's null draws ``[N]``."""
    size, null_size = abs(effect), null.abs()
    mean, std = float(null_size.mean()), float(null_size.std())
    z = (size - mean) / std if std > 0 else (math.inf if size > mean else 0.0)
    return {
        "effect": effect,
        "null_mean": mean,
        "null_std": std,
        "z": z,
        "percentile": float((null_size < size).float().mean()),
        "passes": bool(z >= Z_PASS),
    }


def check_claims(component: Component, claims: Sequence[Address]) -> None:
    """Every claim names one direction of ``component``; one-line error otherwise."""
    for a in claims:
        if (
            a.component != component.name
            or a.size != 1
            or not (a.group < component.shape[0] and a.index < component.shape[1])
        ):
            raise ValueError(f"claim {a} is not a direction of component {component.name} {tuple(component.shape)}")


def probe_set(component: Component, claims: Sequence[Address], n_random: int = N_RANDOM, seed: int = 0) -> Probes:
    """The probes of one component's check, in this order: the unmodified model (a zero row), each claimed
    direction (``e_k`` in its group), then ``n_random`` Haar-random unit directions per claimed group (sorted),
    drawn with ``seed``: the same null for every claim of a group."""
    if n_random < 2:
        raise ValueError(f"n_random={n_random}: the null needs at least 2 random directions")
    check_claims(component, claims)
    K = component.shape[1]
    groups = sorted({a.group for a in claims})
    gen = torch.Generator().manual_seed(seed)
    coords = [torch.zeros(1, K), torch.eye(K)[[a.index for a in claims]]] + [
        random_coords(n_random, K, gen) for _ in groups
    ]
    group = [torch.zeros(1, dtype=torch.long), torch.tensor([a.group for a in claims], dtype=torch.long)]
    group += [torch.full((n_random,), g, dtype=torch.long) for g in groups]
    device = component.V.device
    return Probes(component, torch.cat(group).to(device), torch.cat(coords).to(device))


def gap_columns(row: dict, metric_gap: float | None) -> dict:
    """``metric_gap`` (mean m(clean) - m(corrupted)), ``gap_fraction`` (``-effect / metric_gap``) and
    ``passes_gap`` (``passes`` and ``|gap_fraction| >= MIN_GAP_FRACTION``) of a ``summarize`` row; none when
    ``metric_gap`` is None."""
    if metric_gap is None:
        return {}
    frac = -row["effect"] / metric_gap if metric_gap != 0 else 0.0
    return {
        "metric_gap": metric_gap,
        "gap_fraction": frac,
        "passes_gap": bool(row["passes"] and abs(frac) >= MIN_GAP_FRACTION),
    }


def judge(
    component: Component,
    claims: Sequence[Address],
    change: Tensor,
    n_random: int = N_RANDOM,
    metric_gap: float | None = None,
) -> list[dict]:
    """Rows for the claims from ``change: [C - 1]``: the mean change of the metric of every probe of
    ``probe_set`` but the first (the unmodified model); with ``metric_gap`` (the mean clean - corrupted metric
    over the same prompts) also ``gap_columns``."""
    groups = sorted({a.group for a in claims})
    claimed, null = change[: len(claims)], change[len(claims) :].reshape(len(groups), n_random)
    rows = []
    for i, a in enumerate(claims):
        row = summarize(float(claimed[i]), null[groups.index(a.group)])
        rows.append({**a.row(), "sigma": float(component.S[a.group, a.index]), **row, **gap_columns(row, metric_gap)})
    return rows


@torch.no_grad()
def metric_gap(view: ModelView, batch: dict, task: str | TaskScorer) -> Tensor:
    """``[n_prompts]``: m(clean) - m(corrupted) of the task metric at the answer position."""
    from lit_svd.metrics import forward_answer_logits

    task = task_scorer(task)
    m = [
        task.metric(forward_answer_logits(view.model, batch[k], batch["attention_mask"], batch["answer_pos"]), batch)
        for k in ("clean_ids", "corrupt_ids")
    ]
    return (m[0] - m[1]).double()


@torch.no_grad()
def causal_check(
    view: ModelView,
    component: Component,
    claims: Sequence[Address],
    batch: dict,
    task: str | TaskScorer,
    reference: Tensor,
    n_random: int = N_RANDOM,
    seed: int = 0,
    rows_per_forward: int = 512,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """For each claimed direction of ``component``: its effect against ``n_random`` random
    directions of the same group (``probe_set``, ``judge``), in one batched pass. ``reference``:
    ``corrupted_coefficients(...)[component.name]``."""
    probes = probe_set(component, claims, n_random, seed)
    metrics = patched_metrics(view, probes, batch, reference, task, rows_per_forward, progress)
    gap = float(metric_gap(view, batch, task).mean())
    return judge(component, claims, (metrics[:, 1:] - metrics[:, :1]).mean(0), n_random, gap)


def check_components(
    view: ModelView,
    components: Sequence[Component],
    claims: dict[str, list[Address]],
    batch: dict,
    task: str | TaskScorer,
    n_random: int = N_RANDOM,
    seed: int = 0,
    rows_per_forward: int = 512,
    progress: bool = False,
) -> tuple[list[dict], dict]:
    """``causal_check`` for the claims of every component (``claims[name]``: addresses of its directions);
    returns the rows and timing (``wall_s``, ``directions``, ``directions_per_s``: claimed directions per
    second, null draws included in the time)."""
    from tqdm.auto import tqdm

    todo = [c for c in components if claims.get(c.name)]
    reference = corrupted_coefficients(view, todo, batch)
    n_prompts = len(batch["answer_pos"])
    total = sum((1 + len(claims[c.name]) + n_random * len({a.group for a in claims[c.name]})) * n_prompts for c in todo)
    bar = tqdm(total=total, desc="causal check (prompt x direction rows)", disable=not progress)
    start = time.monotonic()
    rows = []
    for c in todo:
        rows += causal_check(
            view, c, claims[c.name], batch, task, reference[c.name], n_random, seed, rows_per_forward, bar.update
        )
    bar.close()
    wall = time.monotonic() - start
    return rows, {
        "wall_s": wall,
        "directions": len(rows),
        "directions_per_s": len(rows) / max(wall, 1e-9),
        "n_random": n_random,
        "n_prompts": n_prompts,
        "level": LEVEL,
        "z_pass": Z_PASS,
        "min_gap_fraction": MIN_GAP_FRACTION,
        "n_pass": sum(r["passes"] for r in rows),
        "n_pass_gap": sum(r["passes_gap"] for r in rows),
    }
