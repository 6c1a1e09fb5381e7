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
patched to its value on the corrupted prompt, at every position (``Intervention.apply`` with scale 1 for the
kept directions, 0 for the others, and the corrupted run's recorded coefficients as the reference); the
directions in ``C`` keep their live values (computed in the patched forward from whatever reaches them). Clean
and corrupted prompts must have the same token length (``check_same_length``). With every direction patched
every site writes its corrupted value, so the residual stream at the answer position is the corrupted run's:
``m(empty)`` is the corrupted prompt's metric; with none patched the forward is the clean one.

**Faithfulness** ``f(C) = (m(C) - m(empty)) / (m(full) - m(empty))`` with ``m`` the task's metric
(``metrics.task_scorer``: IOI / GP logit difference, GT probability difference) averaged over the prompts first:
a ratio of means, as MIB. **Sizes**: MIB's grid ``MIB_SIZES`` (0.1 % ... 100 % of the universe's directions);
a circuit of fraction ``s`` keeps the first ``floor(s * N)`` directions of a ranking (``n_kept``; MIB's
``int(pct * n)``). **CPR** is the area under ``f`` against the fraction, trapezoids over the grid's points only
(x from 0.001 to 1; no point (0, 0) is added, as MIB's own code); **CMD** the area of ``|1 - f|`` over the same
trapezoids (``areas``). A perfect curve has CPR 0.999 (the grid starts at 0.001) and CMD 0.

Deviation from MIB: MIB scores *edge* circuits (an edge ablated is the writer's contribution to one reader
patched); these are *node* circuits over directions (a direction ablated is patched for all its readers). An
edge-level ablation of direction graphs is not built.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lit_svd.addresses import Address
from lit_svd.metrics import TaskScorer, forward_answer_logits, task_scorer
from lit_svd.models.base import ModelView
from lit_svd.models.intervene import Component, Intervention, build_components

MIB_SIZES: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
UNIVERSE_KINDS: tuple[str, ...] = ("q", "k", "ov", "mlp")


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


def check_sizes(sizes: Sequence[float]) -> list[float]:
    """Sizes as floats, strictly increasing, in (0, 1]; one-line error otherwise."""
    out = [float(s) for s in sizes]
    if not out or any(not 0 < s <= 1 for s in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"sizes={list(sizes)!r}: give fractions in (0, 1], strictly increasing (MIB: {MIB_SIZES})")
    return out


def check_ranking(ranking: Tensor, n: int, name: str = "ranking") -> Tensor:
    """A ranking is a permutation of ``0 .. n-1`` (most important first); one-line error otherwise."""
    ranking = torch.as_tensor(ranking, dtype=torch.long).flatten().cpu()
    if ranking.numel() != n or not torch.equal(ranking.sort().values, torch.arange(n)):
        raise ValueError(f"{name}: a ranking must order every one of the universe's {n} directions exactly once")
    return ranking


def areas(sizes: Sequence[float], values: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: trapezoid areas of ``f`` and of ``|1 - f|`` against the fraction, over the given points
    only (module docstring)."""
    cpr = cmd = 0.0
    for (x1, f1), (x2, f2) in zip(zip(sizes, values), list(zip(sizes, values))[1:]):
        cpr += (x2 - x1) * (f1 + f2) / 2
        cmd += (x2 - x1) * (abs(1 - f1) + abs(1 - f2)) / 2
    return cpr, cmd


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


@dataclass
class Curve:
    """One ranking's faithfulness curve: per size the kept count, ``f`` and ``m`` (the mean metric)."""

    sizes: list[float]
    n_kept: list[int]
    values: list[float]
    metric: list[float]
    cpr: float
    cmd: float
    seconds: float = 0.0

    def row(self) -> dict:
        """The curve as the results hold it: ``{"sizes", "n_kept", "values", "metric", "cpr", "cmd", "seconds"}``."""
        return {
            "sizes": self.sizes,
            "n_kept": self.n_kept,
            "values": self.values,
            "metric": self.metric,
            "cpr": self.cpr,
            "cmd": self.cmd,
            "seconds": self.seconds,
        }


@dataclass
class CurveSums:
    """Per-prompt metric sums of one evaluation (what a module reduces over batches and DDP ranks):
    ``full``, ``empty`` and ``circuits[name]: [len(sizes)]``, and the number of prompts."""

    full: float = 0.0
    empty: float = 0.0
    circuits: dict[str, Tensor] = field(default_factory=dict)
    prompts: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, other: CurveSums) -> None:
        self.full += other.full
        self.empty += other.empty
        self.prompts += other.prompts
        for name, value in other.circuits.items():
            self.circuits[name] = self.circuits.get(name, torch.zeros_like(value)) + value
        for name, secs in other.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + secs


def curves_from_sums(sums: CurveSums, sizes: Sequence[float], n: int) -> tuple[dict[str, Curve], dict]:
    """Curves from reduced sums: ratio of means (the means are taken over all prompts first)."""
    if sums.prompts == 0:
        raise ValueError("faithfulness: no prompts were scored")
    full, empty = sums.full / sums.prompts, sums.empty / sums.prompts
    gap = full - empty
    if not math.isfinite(gap) or gap == 0:
        raise ValueError(f"faithfulness: m(full) = {full} and m(empty) = {empty} leave no gap to normalise by")
    curves = {}
    for name, total in sums.circuits.items():
        metric = (total.double() / sums.prompts).tolist()
        values = [(m - empty) / gap for m in metric]
        cpr, cmd = areas(sizes, values)
        curves[name] = Curve(list(sizes), [n_kept(s, n) for s in sizes], values, metric, cpr, cmd,
                             sums.seconds.get(name, 0.0))  # fmt: skip
    return curves, {"m_full": full, "m_empty": empty, "n_prompts": sums.prompts, "n_directions": n}


@torch.no_grad()
def corrupted_reference(intervention: Intervention, batch: dict) -> dict[str, Tensor]:
    """Every component's coefficients ``[B, T, G, K]`` at every position of the corrupted prompts."""
    with intervention.record() as store:
        intervention.view.model(input_ids=batch["corrupt_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    return dict(store)


@torch.no_grad()
def circuit_metric(
    intervention: Intervention,
    universe: Universe,
    batch: dict,
    keep: Tensor,
    reference: dict[str, Tensor],
    task: TaskScorer,
) -> Tensor:
    """``[B]``: the task metric of the clean prompts with every direction outside ``keep: [N]`` (bool) patched to
    ``reference`` (``corrupted_reference``) at every position."""
    view = intervention.view
    dtype = next(view.model.parameters()).dtype
    scales = universe.scales(keep, dtype, batch["clean_ids"].device)
    # a component kept whole is left unhooked: its scales of 1 would add exactly (c - c_ref) * 0
    scales = {name: lam for name, lam in scales.items() if not bool(lam.all())}
    with intervention.apply(scales, reference=reference):
        logits = forward_answer_logits(view.model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])
    return task.metric(logits, batch).double()


@torch.no_grad()
def batch_sums(
    intervention: Intervention,
    universe: Universe,
    batch: dict,
    rankings: Mapping[str, Tensor],
    sizes: Sequence[float],
    task: str | TaskScorer,
    progress: Callable[[int], None] | None = None,
) -> CurveSums:
    """One batch's ``CurveSums``: ``m(full)``, ``m(empty)`` and every ranking's circuits at ``sizes``, one forward
    each on the same corrupted reference (recorded once)."""
    check_same_length(batch)
    task = task_scorer(task)
    n = len(universe)
    reference = corrupted_reference(intervention, batch)
    none, every = torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)
    out = CurveSums(prompts=len(batch["answer_pos"]))
    out.full = float(circuit_metric(intervention, universe, batch, every, reference, task).sum())
    out.empty = float(circuit_metric(intervention, universe, batch, none, reference, task).sum())
    for name, ranking in rankings.items():
        start = time.monotonic()
        values = []
        for size in sizes:
            keep = torch.zeros(n, dtype=torch.bool)
            keep[ranking[: n_kept(size, n)]] = True
            values.append(float(circuit_metric(intervention, universe, batch, keep, reference, task).sum()))
            if progress:
                progress(1)
        out.circuits[name] = torch.tensor(values, dtype=torch.float64)
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
) -> tuple[dict[str, Curve], dict]:
    """The faithfulness curve of every ranking (``{name: [N] long}``: the universe's flat indices, most important
    first; ``lit_svd.analysis.rankings``) on the same prompts, sizes and ablation. Returns ``(curves, info)``,
    ``info``: ``m_full``, ``m_empty``, ``n_prompts``, ``n_directions``, ``wall_s``. ``Curve.seconds``: the time of
    that ranking's forwards (the shared reference, full and empty runs not included)."""
    from tqdm.auto import tqdm

    sizes = check_sizes(sizes)
    universe = Universe(components)
    rankings = {name: check_ranking(r, len(universe), name) for name, r in rankings.items()}
    intervention = Intervention(view, components)
    batches = list(batches)
    start = time.monotonic()
    total = CurveSums()
    with tqdm(
        total=len(batches) * len(sizes) * len(rankings), desc="faithfulness circuits", disable=not progress
    ) as bar:
        for batch in batches:
            total.add(batch_sums(intervention, universe, batch, rankings, sizes, task, bar.update))
    curves, info = curves_from_sums(total, sizes, len(universe))
    info["wall_s"] = time.monotonic() - start
    return curves, info


def faithfulness_curve(
    view: ModelView,
    components: Sequence[Component],
    batches: Iterable[dict],
    ranking: Tensor,
    task: str | TaskScorer,
    sizes: Sequence[float] = MIB_SIZES,
) -> Curve:
    """One ranking's curve (``faithfulness_curves`` with one ranking)."""
    curves, _ = faithfulness_curves(view, components, batches, {"ranking": ranking}, task, sizes)
    return curves["ranking"]
