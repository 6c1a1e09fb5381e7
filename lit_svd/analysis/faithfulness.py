"""Faithfulness of direction circuits, measured as the Mechanistic Interpretability Benchmark (MIB) measures
circuits: keep a circuit, patch everything else toward the corrupted run, and see how much of the task metric
comes back.

**The universe** is every maskable singular direction of the model (``lit_svd.models.intervene``): per layer the
query map's directions of every head (``q``), the key map's of every KV head (``k``), the OV map's of every head
(``ov``), and the MLP's input, gate and output maps' (``mlp_in``, ``mlp_gate``, ``mlp_out``): ``UNIVERSE_KINDS``,
the same maps the mask runs of rotary models use, without their null directions (singular value ``<=
linalg.NULL_RTOL`` of the map's largest: a bias-free map's zero bias row, a zero norm gain; rounding residue along a
vector the SVD routine picks freely; SmolLM2-135M 60 of 92,220, Gemma-3-270M 304 of 76,068). Non-rotary models
(GPT-2) are scored on ``q`` and ``k`` too: their joint ``qk`` component can only be zero-ablated, not patched.

**A circuit** ``C`` is a set of directions of the universe. Every direction outside ``C`` has its coefficient
patched to its value on the corrupted prompt, at every position (``models.patching.CircuitPatch``: the same
ablation as ``Intervention.apply`` with scale 1 for the kept directions, 0 for the others and the corrupted run's
coefficients as the reference, computed at the cost of the smaller of the kept and dropped sets); the directions
in ``C`` keep their live values (computed in the patched forward from whatever reaches them). Clean and corrupted
prompts must have the same token length (``check_same_length``). With every direction patched every site writes
its corrupted value, so the residual stream at the answer position is the corrupted run's: ``m(empty)`` is the
corrupted prompt's metric; with none patched the forward is the clean one.

**Faithfulness** ``f(C) = (m(C) - m(empty)) / (m(full) - m(empty))`` with ``m`` the task's metric
(``metrics.task_scorer``: IOI / GP logit difference, GT probability difference) averaged over the prompts first:
a ratio of means, as MIB; **not clipped** (a circuit that leaves out what works against the task scores above 1).

**Sizes**: MIB's grid ``MIB_SIZES`` (0.1 % ... 100 %) on two axes (``AXES``):

* ``raw``: the fraction of the universe's directions; a circuit of size ``s`` keeps the first ``floor(s * N)``
  directions of a ranking (``n_kept``; MIB's ``int(pct * n)``).
* ``fair``: the mean over *units* of the fraction of each unit's directions kept (``fair_weights``): a unit is a
  query head (its ``q`` and ``ov`` directions and its share ``1 / group`` of its KV head's ``k`` directions) or an
  MLP layer (``mlp_in``, ``mlp_gate``, ``mlp_out``), so that a circuit of whole units has the size a node-level
  (head) circuit has on MIB's axis (MIB's neuron-level weighting applied to directions; exact for models whose
  query heads have their own key heads; with grouped keys a head circuit brings its KV head's key directions,
  whose shares of the other query heads count too). A circuit of size ``s`` keeps the longest prefix of the
  ranking whose fair size is at most ``s`` (``prefix_counts``).

**CPR** is the area under ``f`` against the size, trapezoids over the grid's points only (x from 0.001 to 1; no
point (0, 0) is added, as MIB's own code); **CMD** the area of ``|1 - f|`` over the same trapezoids (``areas``).
A perfect curve has CPR 0.999 (the grid starts at 0.001) and CMD 0. **Every method is scored twice**, as MIB's
``print_results``: CPR on the curve of its *signed* ranking (most positive attribution first), CMD on the curve of
its *absolute* ranking (largest magnitude first); a method with one ranking (random, mask, graph) uses it for
both (``method_scores``).

**Intervals over the test prompts** (as the edge curves', ``area_intervals``): every prompt's metric is kept
(``CurveSums``: the full and empty circuits' and every planned circuit's, per prompt), the prompts put in the order
of their index in the split (``index``; the same order under any batching or number of DDP ranks), and each curve
carries the 95 % BCa bootstrap intervals of its CPR, CMD and ``f`` at each size (``cpr_ci``, ``cmd_ci``,
``values_ci``) and its per-prompt metric (``prompt_metric``), from which the interval of the difference of two
curves, paired over the same prompts, is drawn (``area_intervals.paired_differences``). The point values are the
ratio of the means, as before.

Deviation from MIB: MIB scores *edge* circuits (an edge ablated is the writer's contribution to one reader
patched); these are *node* circuits over directions (a direction ablated is patched for all its readers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch
from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.analysis.area_intervals import area_samples, curve_intervals
from lit_svd.analysis.faithfulness_options import MIB_SIZES, check_sizes
from lit_svd.metrics import TaskScorer, forward_answer_logits, task_scorer
from lit_svd.models.base import ModelView
from lit_svd.models.intervene import Component, build_components
from lit_svd.models.patching import CircuitPatch, Reference

UNIVERSE_KINDS: tuple[str, ...] = ("q", "k", "ov", "mlp")
Axis = Literal["raw", "fair"]
AXES: tuple[Axis, ...] = ("raw", "fair")
FAIR_TOLERANCE = 1e-9  # relative slack of a prefix's fair size against a grid size (float sums of many weights)


def universe_components(
    view: ModelView, layers: Sequence[int] | None = None, dtype: torch.dtype | None = None, progress: bool = False
) -> list[Component]:
    """The universe's components (``UNIVERSE_KINDS`` of every layer, or of ``layers``) without their null
    directions (``build_component``'s ``drop_null``), in the model's dtype (or ``dtype``): float64 models are scored
    in float64."""
    comps = build_components(view, UNIVERSE_KINDS, layers, progress=progress, drop_null=True)
    dtype = dtype or next(view.model.parameters()).dtype
    if dtype != torch.float32:
        for c in comps:
            for attr in ("U", "S", "V", "read"):
                t = getattr(c, attr)
                if t is not None:
                    setattr(c, attr, t.to(dtype))
    return comps


class Universe:
    """The directions of ``components`` as one flat index ``0 .. N-1``: component by component (their order),
    within one group-major (``[G, K]`` flattened)."""

    def __init__(self, components: Sequence[Component]):
        joint = [c.name for c in components if c.kind == "qk"]
        if joint:
            raise ValueError(
                f"components: {joint[0]} is a joint qk component, which can only be zero-ablated; the faithfulness"
                " universe patches q and k (use universe_components)"
            )
        self.components = list(components)
        self.names = [c.name for c in self.components]
        self.shapes = [tuple(c.shape) for c in self.components]
        sizes = [g * k for g, k in self.shapes]
        self.offsets = [0, *torch.tensor(sizes).cumsum(0).tolist()] if sizes else [0]
        self._position = {name: i for i, name in enumerate(self.names)}

    def __len__(self) -> int:
        return self.offsets[-1]

    def index(self, address: Address) -> int:
        """The flat index of one direction (``size`` 1); one-line error when it is not in the universe."""
        i = self._position.get(address.component)
        G, K = self.shapes[i] if i is not None else (0, 0)
        if i is None or address.size != 1 or address.group >= G or address.index >= K:
            raise KeyError(f"{address} is not a direction of this universe")
        return self.offsets[i] + address.group * K + address.index

    def has(self, address: Address) -> bool:
        try:
            self.index(address)
        except KeyError:
            return False
        return True

    def address(self, flat: int) -> Address:
        """The address of flat index ``flat``."""
        i = max(j for j in range(len(self.names)) if self.offsets[j] <= flat)
        G, K = self.shapes[i]
        group, index = divmod(flat - self.offsets[i], K)
        c = self.components[i]
        return c.address(group, index)

    def slice(self, name: str) -> slice:
        """The flat indices of component ``name``."""
        i = self._position[name]
        return slice(self.offsets[i], self.offsets[i + 1])

    def split(self, flat: Tensor) -> dict[str, Tensor]:
        """``flat: [N]`` -> ``{component name: [G, K]}``."""
        return {
            n: flat[self.offsets[i] : self.offsets[i + 1]].reshape(self.shapes[i]) for i, n in enumerate(self.names)
        }

    def flatten(self, per_component: Mapping[str, Tensor], fill: float = math.nan) -> Tensor:
        """``{name: [G, K]}`` -> ``[N]`` float64; components not given get ``fill``; a name or shape that is not
        the universe's fails in one line."""
        out = torch.full((len(self),), fill, dtype=torch.float64)
        for name, value in per_component.items():
            if name not in self._position:
                raise KeyError(f"component {name!r} is not in the universe ({', '.join(self.names[:6])}, ...)")
            i = self._position[name]
            if tuple(value.shape) != self.shapes[i]:
                raise ValueError(f"{name}: shape {tuple(value.shape)}, the universe has {self.shapes[i]}")
            out[self.offsets[i] : self.offsets[i + 1]] = value.detach().double().cpu().flatten()
        return out

    def scales(
        self, keep: Tensor, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> dict[str, Tensor]:
        """Scales of a circuit: 1 for the kept directions (``keep: [N]`` bool), 0 for the others."""
        if keep.shape != (len(self),):
            raise ValueError(f"keep has shape {tuple(keep.shape)}; expected ({len(self)},)")
        return {n: s.to(dtype=dtype, device=device) for n, s in self.split(keep.to(dtype)).items()}


def n_kept(size: float, n: int) -> int:
    """How many directions a circuit of fraction ``size`` of ``n`` keeps: ``floor(size * n)`` (MIB)."""
    if not 0 <= size <= 1:
        raise ValueError(f"size={size!r}: a circuit's size is a fraction in [0, 1]")
    return int(math.floor(size * n + 1e-9))


def check_ranking(ranking: Tensor, n: int, name: str = "ranking") -> Tensor:
    """A ranking is a permutation of ``0 .. n-1`` (most important first); one-line error otherwise."""
    ranking = torch.as_tensor(ranking, dtype=torch.long).flatten().cpu()
    if ranking.numel() != n or not torch.equal(ranking.sort().values, torch.arange(n)):
        raise ValueError(f"{name}: a ranking must order every one of the universe's {n} directions exactly once")
    return ranking


def areas(sizes: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: trapezoid areas of ``f`` and of ``|1 - f|`` against the fraction, over the given points
    only (module docstring)."""
    cpr, cmd = area_samples(sizes, torch.tensor(values, dtype=torch.float64)[:, None])
    return float(cpr[0]), float(cmd[0])


def reference_means(full: float, empty: float, prompts: int, what: str) -> tuple[float, float]:
    """``(m(full), m(empty))``: the metric sums over ``prompts`` as means; one line naming ``what`` where no prompt
    was scored or the two leave no gap to normalise by."""
    if prompts == 0:
        raise ValueError(f"{what}: no prompts were scored")
    full, empty = full / prompts, empty / prompts
    gap = full - empty
    if not math.isfinite(gap) or gap == 0:
        raise ValueError(f"{what}: m(full) = {full} and m(empty) = {empty} leave no gap to normalise by")
    return full, empty


def faithfulness_of(
    sizes: Sequence[float], metric: Sequence[float], full: float, empty: float
) -> tuple[list[float], float, float]:
    """``(values, cpr, cmd)``: ``f = (m - m(empty)) / (m(full) - m(empty))`` of each mean metric (a ratio of means)
    and its areas over ``sizes`` (``areas``)."""
    gap = full - empty
    values = [(m - empty) / gap for m in metric]
    return (values, *areas(sizes, values))


POSITION_KEYS = ("clean_ids", "corrupt_ids", "attention_mask", "corrupt_attention_mask")  # [B, T] entries


def by_length(batches: Iterable[dict]) -> list[dict]:
    """The prompts of ``batches`` (right-padded task batches, every entry ``[B, ...]``) sorted by length and cut into
    as many batches of the same sizes, each trimmed to its longest prompt: less padding to compute, the same prompts
    (a sum over prompts does not see the grouping). Batches with other entries are returned as they are."""
    batches = list(batches)
    regular = all(
        isinstance(v, Tensor) and v.ndim >= 1 and len(v) == len(b["answer_pos"]) for b in batches for v in b.values()
    )
    if len(batches) < 2 or not regular or any(set(b) != set(batches[0]) for b in batches):
        return batches
    rows = [(b, i, int(b["attention_mask"][i].sum())) for b in batches for i in range(len(b["answer_pos"]))]
    rows.sort(key=lambda row: row[2])
    out, start = [], 0
    for size in (len(b["answer_pos"]) for b in batches):
        chunk, start = rows[start : start + size], start + size
        width = max(length for _, _, length in chunk)
        out.append({key: _rows(chunk, key, width if key in POSITION_KEYS else None) for key in batches[0]})
    return out


def _rows(chunk: Sequence[tuple[dict, int, int]], key: str, width: int | None) -> Tensor:
    """Entry ``key`` of the rows ``(batch, row, length)`` stacked; ``width``: a position entry cut or padded (with
    0, past every row's length) to that many positions."""
    if width is None:
        return torch.stack([b[key][i] for b, i, _ in chunk])
    first = chunk[0][0][key]
    out = torch.zeros((len(chunk), width), dtype=first.dtype, device=first.device)
    for row, (b, i, _) in enumerate(chunk):
        n = min(width, b[key].shape[1])
        out[row, :n] = b[key][i, :n]
    return out


def check_same_length(batch: dict) -> None:
    """Clean and corrupted prompts must have the same token length (the patch is position by position)."""
    clean, corrupt = batch["clean_ids"], batch["corrupt_ids"]
    if clean.shape != corrupt.shape:
        raise ValueError(
            f"clean_ids {tuple(clean.shape)} and corrupt_ids {tuple(corrupt.shape)} differ: faithfulness patches"
            " position by position and needs clean and corrupted prompts of the same token length"
        )
    other = batch.get("corrupt_attention_mask")
    if other is not None and not torch.equal(other, batch["attention_mask"]):
        raise ValueError(
            "corrupt_attention_mask differs from attention_mask: faithfulness needs clean and corrupted prompts of"
            " the same token length"
        )


def fair_weights(universe: Universe) -> Tensor:
    """``[N]`` float64: each direction's share of the fair size axis (module docstring), summing to 1. A query
    head's unit holds its ``q`` and ``ov`` directions (1 each) and ``1 / group`` of each of its KV head's ``k``
    directions; an MLP layer's unit holds its ``mlp_in``, ``mlp_gate`` and ``mlp_out`` directions; a direction
    weighs ``share / (its unit's total share)``, summed over its units, over the number of units."""
    comps = {(c.layer, c.kind): c for c in universe.components}
    units: list[list[tuple[str, int, float]]] = []
    for layer in sorted({c.layer for c in universe.components}):
        q, k, ov = (comps.get((layer, kind)) for kind in ("q", "k", "ov"))
        heads = q or ov or k
        if heads is not None:
            H = heads.shape[0]
            H_kv = k.shape[0] if k is not None else H
            if H % H_kv:
                raise ValueError(f"L{layer}: {H} query heads do not share {H_kv} key heads evenly")
            for h in range(H):
                unit = [(c.name, h, 1.0) for c in (q, ov) if c is not None]
                if k is not None:
                    unit.append((k.name, h // (H // H_kv), H_kv / H))
                units.append(unit)
        mlp = [(c.name, 0, 1.0) for kind in ("mlp_in", "mlp_gate", "mlp_out") if (c := comps.get((layer, kind)))]
        if mlp:
            units.append(mlp)
    weights = torch.zeros(len(universe), dtype=torch.float64)
    for unit in units:
        widths = {name: universe.shapes[universe.names.index(name)][1] for name, _, _ in unit}
        total = sum(share * widths[name] for name, _, share in unit)
        for name, group, share in unit:
            start = universe.slice(name).start + group * widths[name]
            weights[start : start + widths[name]] += share / total
    return weights / len(units)


def prefix_counts(weights_in_order: Tensor, sizes: Sequence[float]) -> list[int]:
    """Per size ``s`` the length of the longest prefix whose summed weight is at most ``s`` (relative slack
    ``FAIR_TOLERANCE``): how many items of a ranking a circuit of weighted size ``s`` keeps."""
    total = torch.cumsum(weights_in_order.double(), 0)
    bounds = torch.tensor([s * (1 + FAIR_TOLERANCE) for s in sizes], dtype=torch.float64)
    return [int(c) for c in torch.searchsorted(total, bounds, right=True)]


def kept_counts(ranking: Tensor, sizes: Sequence[float], axis: Axis, weights: Tensor | None = None) -> list[int]:
    """How many of ``ranking``'s first directions a circuit of each size keeps on ``axis`` (``fair`` needs
    ``weights``, ``fair_weights``)."""
    if axis == "raw":
        return [n_kept(s, len(ranking)) for s in sizes]
    if weights is None:
        raise ValueError("the fair axis needs the universe's fair weights (fair_weights)")
    return prefix_counts(weights[ranking], sizes)


@dataclass
class Curve:
    """One ranking's faithfulness curve on one axis: per size the kept count, ``f``, ``m`` (the mean metric), and
    the kept prefix's raw fraction and fair size (``fair_size``: None without weights); the 95 % bootstrap intervals
    over the prompts of CPR / CMD and of ``f`` at each size (``[lo, hi]``; ``values_ci``: ``[[lo per size], [hi per
    size]]``; None for one prompt) and the metric per size and prompt (``prompt_metric``, prompts in ``CurveSums``'
    order)."""

    sizes: list[float]
    n_kept: list[int]
    raw_size: list[float]
    fair_size: list[float] | None
    values: list[float]
    metric: list[float]
    cpr: float
    cmd: float
    seconds: float
    cpr_ci: list[float] | None = None
    cmd_ci: list[float] | None = None
    values_ci: list[list[float]] | None = None
    prompt_metric: list[list[float]] = field(default_factory=list)

    def row(self) -> dict:
        """The curve as the results hold it."""
        return asdict(self)


@dataclass
class CurvePlan:
    """The circuits to run: per ranking (``{name: [N] long}``, most important first) the kept counts per axis at
    the grid sizes (``counts[name][axis]``); ``weights``: the fair weights (None: raw axis only)."""

    sizes: list[float]
    rankings: dict[str, Tensor]
    counts: dict[str, dict[Axis, list[int]]]
    n: int
    weights: Tensor | None = None

    def circuits(self, name: str) -> list[int]:
        """The distinct kept counts of ranking ``name`` over its axes (each one forward)."""
        return sorted({k for counts in self.counts[name].values() for k in counts})


def plan_curves(
    rankings: Mapping[str, Tensor],
    sizes: Sequence[float],
    n: int,
    axes: Sequence[Axis] = ("raw",),
    weights: Tensor | None = None,
) -> CurvePlan:
    """A ``CurvePlan`` of ``rankings`` (checked permutations of ``n``) on ``axes`` at ``sizes``."""
    sizes = check_sizes(sizes)
    rankings = {name: check_ranking(r, n, name) for name, r in rankings.items()}
    counts = {name: {axis: kept_counts(r, sizes, axis, weights) for axis in axes} for name, r in rankings.items()}
    return CurvePlan(sizes, rankings, counts, n, weights)


def _empty() -> Tensor:
    return torch.zeros(0, dtype=torch.float64)


@dataclass
class CurveSums:
    """The per-prompt metrics of one evaluation (the terms of the sums the means are; what a module gathers over
    batches and DDP ranks): ``full`` and ``empty`` ``[P]``, ``circuits[name]: [len(plan.circuits(name)), P]``
    (float64), ``index`` ``[P]``: each prompt's index in its split (the batches' ``index``; -1 where a batch has
    none), and the seconds of each ranking's forwards."""

    full: Tensor = field(default_factory=_empty)
    empty: Tensor = field(default_factory=_empty)
    circuits: dict[str, Tensor] = field(default_factory=dict)
    index: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def prompts(self) -> int:
        return len(self.full)

    def add(self, other: CurveSums) -> None:
        """Append ``other``'s prompts (after this one's)."""
        self.full = torch.cat([self.full, other.full.double().cpu()])
        self.empty = torch.cat([self.empty, other.empty.double().cpu()])
        self.index = torch.cat([self.index, other.index.long().cpu()])
        for name, value in other.circuits.items():
            before = self.circuits.get(name, torch.zeros((len(value), 0), dtype=torch.float64))
            self.circuits[name] = torch.cat([before, value.double().cpu()], 1)
        for name, secs in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + secs

    def in_index_order(self) -> CurveSums:
        """The same prompts ordered by ``index`` (stable: prompts without one keep their order), so that any batching
        or sharding of one split lists them alike."""
        order = torch.sort(self.index, stable=True).indices
        circuits = {name: t[:, order] for name, t in self.circuits.items()}
        return CurveSums(self.full[order], self.empty[order], circuits, self.index[order], dict(self.seconds))


def curves_from_sums(sums: CurveSums, plan: CurvePlan) -> tuple[dict[str, dict[Axis, Curve]], dict]:
    """Curves ``{name: {axis: Curve}}`` from the per-prompt metrics (put in ``index`` order): ratio of means (the
    means over all prompts first), with their bootstrap intervals over the prompts (``area_intervals``, every curve
    on the same draws; none for a single prompt). ``info``: ``m_full``, ``m_empty``, ``n_prompts``,
    ``n_directions``, ``prompt_full`` / ``prompt_empty`` / ``prompt_index`` (the ends per prompt and the prompts'
    indices, in the curves' order), ``intervals`` (their method, level, resamples, percentile fallbacks)."""
    sums = sums.in_index_order()
    P = sums.prompts
    full, empty = reference_means(float(sums.full.sum()), float(sums.empty.sum()), P, "faithfulness")
    per_prompt: dict[str, dict[Axis, Tensor]] = {}
    for name, rows in sums.circuits.items():
        at = dict(zip(plan.circuits(name), rows.double()))
        per_prompt[name] = {axis: torch.stack([at[k] for k in counts]) for axis, counts in plan.counts[name].items()}
    flat = {f"{name}@{axis}": t for name, by_axis in per_prompt.items() for axis, t in by_axis.items()}
    ci, about = curve_intervals(plan.sizes, flat, sums.full, sums.empty)
    curves: dict[str, dict[Axis, Curve]] = {}
    for name, by_axis in per_prompt.items():
        prefix = None if plan.weights is None else torch.cumsum(plan.weights[plan.rankings[name]], 0)
        curves[name] = {}
        for axis, t in by_axis.items():
            counts = plan.counts[name][axis]
            metric = (t.sum(1) / P).tolist()
            values, cpr, cmd = faithfulness_of(plan.sizes, metric, full, empty)
            fair = None if prefix is None else [float(prefix[k - 1]) if k else 0.0 for k in counts]
            curves[name][axis] = Curve(list(plan.sizes), counts, [k / plan.n for k in counts], fair, values, metric,
                                       cpr, cmd, sums.seconds.get(name, 0.0), **ci[f"{name}@{axis}"],
                                       prompt_metric=t.tolist())  # fmt: skip
    info: dict = {"m_full": full, "m_empty": empty, "n_prompts": P, "n_directions": plan.n}
    if about:
        info["intervals"] = about
    ends = {"prompt_full": sums.full.tolist(), "prompt_empty": sums.empty.tolist()}
    return curves, info | ends | {"prompt_index": sums.index.tolist()}


def method_scores(curves: Mapping[str, Mapping[Axis, Curve]], signed: str, absolute: str) -> dict[str, dict]:
    """MIB's two scores of a method per axis: ``cpr`` of its signed ranking's curve, ``cmd`` of its absolute
    ranking's (the same ranking for a method with one)."""
    return {
        "cpr": {axis: c.cpr for axis, c in curves[signed].items()},
        "cmd": {axis: c.cmd for axis, c in curves[absolute].items()},
    }


def corrupted_reference(patch: CircuitPatch, batch: dict) -> Reference:
    """The corrupted prompts' site outputs and coefficient sources at every position (``CircuitPatch.record``)."""
    return patch.record(batch["corrupt_ids"], batch["attention_mask"])


@torch.no_grad()
def circuit_metric(
    patch: CircuitPatch, universe: Universe, batch: dict, keep: Tensor, reference: Reference, task: TaskScorer
) -> Tensor:
    """``[B]``: the task metric of the clean prompts with every direction outside ``keep: [N]`` (bool) patched to
    ``reference`` (``corrupted_reference``) at every position."""
    with patch.apply(universe.split(keep), reference):
        logits = forward_answer_logits(
            patch.view.model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"]
        )
    return task.metric(logits, batch).double()


@torch.no_grad()
def batch_sums(
    patch: CircuitPatch,
    universe: Universe,
    batch: dict,
    plan: CurvePlan,
    task: str | TaskScorer,
    progress: Callable[[int], None] | None = None,
) -> CurveSums:
    """One batch's ``CurveSums``: every prompt's ``m(full)``, ``m(empty)`` and metric of every planned circuit, one
    forward each on the same corrupted reference (recorded once; the empty and full circuits are not run twice)."""
    check_same_length(batch)
    task = task_scorer(task)
    n = len(universe)
    reference = corrupted_reference(patch, batch)
    B = len(batch["answer_pos"])
    index = batch.get("index")
    out = CurveSums(index=torch.full((B,), -1, dtype=torch.long) if index is None else index.long().cpu())
    out.full = circuit_metric(patch, universe, batch, torch.ones(n, dtype=torch.bool), reference, task).cpu()
    out.empty = circuit_metric(patch, universe, batch, torch.zeros(n, dtype=torch.bool), reference, task).cpu()
    for name, ranking in plan.rankings.items():
        start = time.monotonic()
        values = []
        for count in plan.circuits(name):
            if count in (0, n):
                values.append(out.empty if count == 0 else out.full)
                continue
            keep = torch.zeros(n, dtype=torch.bool)
            keep[ranking[:count]] = True
            values.append(circuit_metric(patch, universe, batch, keep, reference, task).cpu())
            if progress:
                progress(1)
        out.circuits[name] = torch.stack(values)
        out.seconds[name] = time.monotonic() - start
    return out


def faithfulness_curves(
    view: ModelView,
    components: Sequence[Component],
    batches: Iterable[dict],
    rankings: Mapping[str, Tensor],
    task: str | TaskScorer,
    sizes: Sequence[float] = MIB_SIZES,
    progress: bool = False,
    axes: Sequence[Axis] = AXES,
) -> tuple[dict[str, dict[Axis, Curve]], dict]:
    """The faithfulness curves ``{name: {axis: Curve}}`` of every ranking (``{name: [N] long}``: the universe's
    flat indices, most important first; ``lit_svd.analysis.rankings``) on the same prompts, sizes and ablation.
    Returns ``(curves, info)``, ``info``: ``curves_from_sums``' (the means, the per-prompt ends, the intervals) and
    ``wall_s``.
    ``Curve.seconds``: the time of that ranking's forwards (the shared reference, full and empty runs not
    included). The caller's batches are kept (the Lightning module sums the same ones); ``by_length`` regroups them
    with less padding, at the price of other float rounding."""
    from tqdm.auto import tqdm

    universe = Universe(components)
    weights = fair_weights(universe) if "fair" in axes else None
    plan = plan_curves(rankings, sizes, len(universe), axes, weights)
    patch = CircuitPatch(view, components)
    batches = list(batches)
    start = time.monotonic()
    total = CurveSums()
    n = len(universe)
    n_forwards = len(batches) * sum(len(set(plan.circuits(name)) - {0, n}) for name in plan.rankings)
    with tqdm(total=n_forwards, desc="faithfulness circuits", disable=not progress) as bar:
        for batch in batches:
            total.add(batch_sums(patch, universe, batch, plan, task, bar.update))
    curves, info = curves_from_sums(total, plan)
    info["wall_s"] = time.monotonic() - start
    return curves, info
