"""DirectionCheckModule: the claimed directions of a finished direction-mask run, one row each, for ``test``.

For each claimed direction (the kept mask directions of the requested kinds, or the GP class-mean swap
directions of ``results.json["steering_swap"]``) it measures the causal check of ``lit_svd.analysis.causal``
on the test batches (summed over batches through the named state ``changes``), and at the end of the epoch
builds the table: component, layer, head, direction, sigma, block (id, size, first, last, claimed in it),
isolation gap, isolated, past_rank, effect, z, percentile, passes (z alone), metric_gap, gap_fraction,
passes_gap (z and at least ``MIN_GAP_FRACTION`` of the clean - corrupted metric gap), readout.
``callbacks.direction_report.DirectionReport`` writes it.

The data module must give the run's own test split (checked against the run's ``config.yaml``): nothing
here is chosen on those prompts (``n_random``, ``seed`` and the level are fixed before the run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import PositiveInt
from torch import Tensor
from torchmetrics import Metric

from lit_svd.addresses import Address
from lit_svd.analysis.blocks import component_blocks, direction_block
from lit_svd.analysis.causal import (
    N_RANDOM,
    PATCHABLE,
    Probes,
    corrupted_coefficients,
    judge,
    metric_gap,
    patched_metrics,
    probe_set,
)
from lit_svd.analysis.masks import hard_masks
from lit_svd.analysis.readouts import readouts
from lit_svd.choices import check_choice
from lit_svd.linalg import REL_GAP
from lit_svd.models.intervene import Component, build_components
from lit_svd.modules.pretrained import PretrainedLMModule, run_loading
from lit_svd.runs import load_run


class ProbeChanges(Metric):
    """Sum over prompts of each probe's change of the task metric, and the number of prompts."""

    def __init__(self, n_probes: int):
        super().__init__()
        self.add_state("change", torch.zeros(n_probes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("prompts", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, change: Tensor) -> None:  # [prompts, probes]
        self.change += change.double().sum(0)
        self.prompts += change.shape[0]

    def compute(self) -> dict[str, Tensor]:
        """``mean``: each probe's mean change over every prompt seen (all ranks); ``prompts``: their number."""
        return {"mean": self.change / self.prompts.clamp_min(1), "prompts": self.prompts.clone()}


def run_claims(
    run: Path, claims: str, kinds: Sequence[str], max_claims: int | None = None
) -> tuple[dict, dict[str, list[Address]], int]:
    """``(masks_state, {component name: [Address of each claimed direction]}, number claimed)`` of a finished mask
    run (``lit_svd.runs``); with ``max_claims`` only that many are kept (``strongest_claims``)."""
    found = load_run(run, need=("masks",), what="direction-mask run")
    state = found.masks
    out: dict[str, list[Address]] = {}
    if claims == "kept":
        for name, hard in hard_masks(state["lambdas"], state["threshold"]).items():
            if name.split(".", 1)[1] in kinds:
                keep = torch.nonzero(hard).tolist()
                if keep:
                    out[name] = [_claim(name, g, k) for g, k in keep]
    else:
        swap = found.content.get("steering_swap") if found.has("results") else None
        if not swap:
            raise ValueError(
                f"claims='swap' but {str(found.path('results'))!r} has no steering_swap (a two-class task's run,"
                " e.g. GP)"
            )
        for d in swap["directions"]:
            out.setdefault(d["component"], []).append(_claim(d["component"], d["head"], d["direction"]))
    n_claimed = sum(len(v) for v in out.values())
    if max_claims is not None and n_claimed > max_claims:
        out = strongest_claims(out, state["lambdas"], max_claims)
    return state, out, n_claimed


def strongest_claims(claims: dict[str, list[Address]], lambdas: dict[str, Tensor], n: int) -> dict[str, list[Address]]:
    """The ``n`` claims with the largest mask values ``lambdas[component][group, direction]`` over all components
    (ties by address), in the input's per-component order."""
    ranked = sorted(
        ((name, a) for name, addrs in claims.items() for a in addrs),
        key=lambda item: (-float(lambdas[item[0]][item[1].group, item[1].index]), item[1]),
    )
    chosen = {a for _, a in ranked[:n]}
    kept = {name: [a for a in addrs if a in chosen] for name, addrs in claims.items()}
    return {name: addrs for name, addrs in kept.items() if addrs}


def _claim(component: str, group: int, direction: int) -> Address:
    layer, kind = component.split(".", 1)
    return Address(int(layer[1:]), kind, int(group), int(direction))


def block_columns(component: Component, claims: Sequence[Address], rel_gap: float) -> list[dict]:
    """Per claim its block fields as every mask report gives them (``analysis.blocks.direction_block``:
    ``block`` {id, size, first, last}, ``gap``, ``isolated``, ``past_rank``) and ``block_claimed``: how many
    claims share its block (k of the block's m directions)."""
    blocks = component_blocks(component, rel_gap)
    count: dict[Address, int] = {}
    for a in claims:
        count[a.block(blocks)] = count.get(a.block(blocks), 0) + 1
    return [{**direction_block(blocks, a.group, a.index), "block_claimed": count[a.block(blocks)]} for a in claims]


class DirectionCheckModule(PretrainedLMModule):
    """Causal check, blocks and readouts of the claimed directions of a finished direction-mask run.

    Args:
        run: folder of the finished mask run (``masks.pt``; ``results.json`` for ``claims: swap``); read only.
        claims: ``kept`` (the kept mask directions of ``kinds``) or ``swap`` (the class-mean swap directions of
            a two-class run, ``results.json["steering_swap"]``).
        kinds: component kinds whose kept directions are checked (``ov``, ``mlp_in``, ``mlp_gate``, ``mlp_out``).
        n_random: random unit directions per head (group) in the null.
        seed: seeds the random directions.
        max_claims: check at most this many claimed directions, those with the largest mask values (all kinds
            together); ``null`` checks every claim. A barely trained mask keeps most directions, and the check
            costs one patched forward row per (prompt, direction).
        rows_per_forward: (prompt, direction) rows per batched forward (memory against speed).
        top_k: tokens per readout side.
        rel_gap: relative gap below which neighbouring singular values share a block (``linalg.REL_GAP``).
        model: the model (default: the run's; its gguf_file, revision and fold_norms are the run's too).
    """

    def __init__(
        self,
        run: str,
        claims: Literal["kept", "swap"] = "kept",
        kinds: Sequence[str] = ("ov",),
        n_random: int = N_RANDOM,
        seed: int = 0,
        max_claims: PositiveInt | None = None,
        rows_per_forward: int = 512,
        top_k: int = 8,
        rel_gap: float = REL_GAP,
        model: str | None = None,
        **loading,
    ):
        for kind in kinds:
            check_choice("kinds", kind, PATCHABLE, where=" among the kinds that can be patched")
        if n_random < 2:
            raise ValueError(f"n_random={n_random}: the null needs at least 2 random directions")
        if rows_per_forward < 1:
            raise ValueError(f"rows_per_forward={rows_per_forward}: must be >= 1")
        if not 0 <= rel_gap < 1:
            raise ValueError(f"rel_gap={rel_gap!r}: must be in [0, 1)")
        self.run_path = Path(run)
        state, self.claims, self.n_claimed = run_claims(self.run_path, claims, kinds, max_claims)
        super().__init__(model=model or state["model"], **run_loading(state.get("hparams", {}), loading))
        self.save_hyperparameters()
        layers = sorted({int(n.split(".")[0][1:]) for n in self.claims})
        wanted = sorted({n.split(".", 1)[1] for n in self.claims})
        comps = build_components(self.view, wanted, layers, progress=True) if self.claims else []
        self.components = [c for c in comps if c.name in self.claims]
        self.probes = {c.name: probe_set(c, self.claims[c.name], n_random, seed) for c in self.components}
        self.changes = torch.nn.ModuleDict({_key(n): ProbeChanges(len(p) - 1) for n, p in self.probes.items()})
        self.gap = ProbeChanges(1)  # m(clean) - m(corrupted) per prompt: the gap the effects are fractions of
        self.task: str | None = None
        self.table: list[dict] = []
        self.timing: dict = {}

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        self.task = getattr(getattr(dm, "task", None), "name", None)
        check_same_test_split(self.run_path, dm)

    def on_test_start(self) -> None:
        for c in self.components:
            for attr in ("U", "S", "V", "read"):
                t = getattr(c, attr)
                if t is not None:
                    setattr(c, attr, t.to(self.device))
        self.probes = {
            c.name: Probes(c, self.probes[c.name].group.to(self.device), self.probes[c.name].coords.to(self.device))
            for c in self.components
        }
        self._wall = 0.0

    @torch.no_grad()
    def test_step(self, batch: dict, batch_idx: int) -> None:
        from tqdm.auto import tqdm

        start = time.monotonic()
        reference = corrupted_coefficients(self.view, self.components, batch)
        show = self.trainer.is_global_zero and self.trainer.progress_bar_callback is not None
        total = sum(len(p) for p in self.probes.values()) * len(batch["answer_pos"])
        with tqdm(
            total=total, desc=f"batch {batch_idx}: (prompt, direction) rows", disable=not show, leave=False
        ) as bar:
            for c in self.components:
                metrics = patched_metrics(
                    self.view,
                    self.probes[c.name],
                    batch,
                    reference[c.name],
                    self.task,
                    self.hparams.rows_per_forward,
                    bar.update,
                )
                self.changes[_key(c.name)].update(metrics[:, 1:] - metrics[:, :1])
            self.gap.update(metric_gap(self.view, batch, self.task)[:, None])
        self._wall += time.monotonic() - start

    def on_test_epoch_end(self) -> None:
        hp = self.hparams
        rows, n_prompts = [], 0
        gap = float(self.gap.compute()["mean"].reshape(-1)[0])
        self.gap.reset()
        for c in self.components:
            metric = self.changes[_key(c.name)]
            reduced = metric.compute()
            n_prompts = int(reduced["prompts"])
            claims = self.claims[c.name]
            judged = judge(c, claims, reduced["mean"].float().cpu(), hp.n_random, gap)
            reads = readouts(self.view, c, claims, self.tokenizer, hp.top_k)
            for row, blk, read in zip(judged, block_columns(c, claims, hp.rel_gap), reads):
                rows.append({**row, **blk, "readout": read})
            metric.reset()
        rows.sort(key=lambda r: (r["layer"], r["kind"], r["head"], r["direction"]))
        self.table = rows
        n_probes = sum(len(p) for p in self.probes.values())
        self.timing = {
            "wall_s": self._wall,
            "directions": len(rows),
            "probes": n_probes,
            "n_prompts": n_prompts,
            "directions_per_s": len(rows) / max(self._wall, 1e-9),
            "probe_rows_per_s": n_probes * n_prompts / max(self._wall, 1e-9),
        }


def check_same_test_split(run: Path, dm) -> None:
    """The data module's test prompts must be the run's (its ``config.yaml`` data section), else one-line error."""
    from lit_svd.datamodules.tasks import TaskDataModule

    found = load_run(run)
    if dm is None or not found.has("config"):
        raise ValueError(f"run={str(run)!r}: the check needs the run's config.yaml and a TaskDataModule of its data")
    args = found.init_args("data")
    args.pop("num_workers", None)
    theirs = TaskDataModule(**args).splits["test"]
    ours = dm.splits["test"]
    if theirs.examples != ours.examples:
        raise ValueError(
            f"data: the test split differs from the run's ({found.path('config')}); use its data section"
            f" (task, tokenizer, n_train, n_val, n_test, seed, test_last, prepend_bos)"
        )


def _key(name: str) -> str:
    return name.replace(".", "_")
