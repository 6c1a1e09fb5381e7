"""Edge ablation: the model run with only a circuit's edges clean (MIB's edge semantics; docs/circuits.md, "Edge
circuits"). The edge universe is ``analysis.edges``; a circuit says which of each reader unit's direction edges it
keeps (``Circuit.keep``).

**What an ablated edge does (MIB's evaluation).** A reader's input is its *live* input (the residual in this
patched forward) plus, for every incoming edge outside the circuit, the writer's ``corrupted - live`` write, where
*corrupted* is the writer's output on the corrupted prompt and *live* its output in this forward. So a writer left
out of the circuit for one reader stays in it for another, and the writer's clean value is never used: with every
edge kept nothing is added (the clean forward), with none every reader reads ``live + (corrupted - live)``
summed over all writers, the corrupted residual, so every writer outputs its corrupted value in turn (the
corrupted forward). Writers' clean-run outputs would give neither end: once one reader is patched, downstream
writers are no longer at their clean values.

**The norm factor of a reader.** A reader unit (a head's query, key or value input, an MLP's input, the logits)
reads its input through a norm; its directions read it linearly through the norm's factor ``f``:
``c_k = r_k0 + f r_k . y``. The factor is the unit's own: ``f = 1 / rms(y_u)`` of the unit's patched input
``y_u = live + sum over the writer directions that no direction of the unit keeps of (corrupted - live)``, the
input MIB's graph gives the unit when its edges are kept or dropped for all its directions alike. Each direction
``k`` then adds the ``corrupted - live`` writes of its *own* dropped edges through that factor. For a unit-level
circuit (every block kept or dropped whole) this is MIB's evaluation exactly; dropping every edge into a unit
makes it read the corrupted residual through the corrupted residual's norm (the corrupted forward at the end where
none is kept); a direction-level circuit is exactly linear in its direction edges once the unit's factor is set.
A factor frozen at the clean run cannot give the corrupted forward when every edge is dropped; the factor of the
live residual alone cannot either (the residual of the patched forward still holds the clean embedding). Per-head
query / key norms (Gemma-3, Qwen3) are part of the reader: they act on the patched query / key as the model does.
The logits read the patched residual through the final norm as the model does (one reader, no directions).

**Gemma's post norms.** A sub-layer's write is ``out * f_post * gain``; each writer's corrupted and live writes
carry their own forward's post-norm factor (so the sum of the writes is each forward's residual: both ends
exact). Dropping a writer's edges to every reader then differs from replacing that writer by its corrupted output
(which would also change the post-norm factor of the other writers of its sub-layer) by that factor's change.
Elsewhere the two are the same (tested).

**Cost.** Per reader unit the edges split into blocks (writer unit x reader unit): a block dropped whole adds its
writer unit's summed write ``Delta_U`` in the residual (per reader unit one sum of writer units' writes, with those
its partial columns need: ``_sum_units``; the distinct sums of a read point's units are one product, ``_unit_sums``:
many units drop the same blocks); a block kept whole adds nothing; a partially kept block adds ``sum_j (1 - keep_kj)
G_kj dc_j`` with ``G_kj = r_k . W_j`` (the gains, precomputed by the attribution where given: ``gains``) and
``dc_j`` the writer's coefficient change. Where under ``SPARSE`` of the partial blocks' edges are kept: one sparse
(CSR) product over them (``r_k . total - sum over kept``). Else a column that no direction keeps adds its write to
every direction (``r_k . lost``, the writes of those columns summed), one that every direction keeps nothing, and
only the *mixed* columns (kept by some directions) take a sparse product over their dropped edges (under ``SPARSE``)
or a dense one; the dense ones of a read point's units are one product over the union of their mixed columns where
that costs less than one per unit (``_mixed_sums``: ``K x columns`` multiply-adds per position, each gathered column
of ``dc`` costing about ``GATHER`` more; a run of columns is read in place, the columns between masked to zero; the
mask is written as floats by the levels' comparison and multiplies the gains in place, ``UnitKeep.dropped``). The
unit's input adds ``lost``: summed over those columns or over the others subtracted from their units' writes,
whichever are fewer, block by block (a block's summed write comes with the read point's unit sums), so ``P x min x
d`` multiply-adds per partial block (``_plan``, which counts the kept edges of the mixed columns over their span
where it is narrow: ``_kept``). A circuit of whole blocks (``block_keep``) needs no mask of direction edges; a
circuit given as levels (``KeepLevels``: the sizes of one ranking) reads its mask from them.

**Soft blocks** (edge pruning, ``analysis.edge_pruning``): a circuit with ``block_weights(u)`` (``[n_up]``, each block's
keep weight in [0, 1]) adds ``(1 - w) Delta_U`` of each writer unit, differentiably in ``w``: the writes are kept
one tensor per writer unit (``_Live.writes``) and summed by ``_WeightedSum``, which saves them as they are (no
stacked copy per read point for the backward). Weights of 0 / 1 give the circuit of those whole blocks.

**Soft directions** (direction-level edge pruning): a soft circuit that also gives ``writer_weights()``
(``[n_writer_cols]``, ``x_i``) and ``reader_weights(u)`` (``[K_u]``, ``y_k``) keeps edge ``(k, i)`` of block ``U``
with weight ``y_k w_U x_i`` (a circuit of that product form: a writer direction dropped for every reader, a reader
direction for every writer, a block for all its directions). Each writer unit then also records its
``x``-weighted write ``sum_i x_i dc_i W_i`` (``_Live.kept``); with ``kept = sum_U w_U (x-weighted write of U)`` and
``total`` the sum of every write (the corrupted residual less the live one), the unit's input is ``live + total -
max_k(y_k) kept`` (the writer directions no direction keeps) and direction ``k`` reads ``r_k . (total - y_k kept)``
through that input's norm factor: weights of 0 / 1 give exactly the direction circuit of mask ``y_k w_U x_i``
(tested against the hard path), at the cost of whole blocks (no mask of direction edges is formed).

Only the *active* positions are computed (``active_rows``): from each prompt's first token where clean and corrupted
differ up to its answer position. Before it every writer's ``corrupted - live`` is zero (the same prefix, so the
same forward: nothing to add); after the answer position (and at padding) nothing reaches the metric (causal
attention). On SmolLM2 IOI about 3 positions in 4 are active.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import torch
from torch import Tensor

from lit_svd.analysis.edges import EdgeUniverse, ReaderUnit, ReadPoint, WriterUnit
from lit_svd.metrics import TaskScorer, forward_answer_logits, task_scorer
from lit_svd.models.base import ModelView
from lit_svd.models.hooks import Hook, first_input, hooks, output_tensor
from lit_svd.models.points import eager_attention

SPARSE = 0.02  # a partially kept region of a unit is summed edge by edge when under this fraction is kept (dropped)
GATHER = 200  # gathering one writer column's dc (P values) costs about this many directions' dense product with it
EMPTY, FULL, PARTIAL = 0, 1, 2


class Circuit(Protocol):
    """Which direction edges into each reader unit are kept: ``keep(u)`` is None (all) or ``[K_u, n_cols]`` bool
    (reader directions x the upstream writer columns, ``EdgeUniverse.W``'s rows, column 0 the embedding)."""

    def keep(self, u: ReaderUnit) -> Tensor | None: ...


class AllEdges:
    """The full model: every edge kept."""

    def keep(self, u: ReaderUnit) -> Tensor | None:
        return None


@dataclass
class NoEdges:
    """The empty circuit: every edge dropped."""

    universe: EdgeUniverse

    def keep(self, u: ReaderUnit) -> Tensor | None:
        return torch.zeros(u.size, u.n_cols, dtype=torch.bool, device=self.universe.device)

    def block_keep(self, u: ReaderUnit) -> Tensor | None:
        return torch.zeros(u.n_up, dtype=torch.bool)


@dataclass
class UnitMasks:
    """Explicit masks for some reader units (``{unit index: [K_u, n_cols] bool}``); the others keep every edge."""

    masks: dict[int, Tensor]

    def keep(self, u: ReaderUnit) -> Tensor | None:
        return self.masks.get(u.index)


@dataclass
class DropWriters:
    """Every edge kept but those of the writer columns ``cols`` (to every reader): the writers' node ablation."""

    universe: EdgeUniverse
    cols: Tensor

    def keep(self, u: ReaderUnit) -> Tensor | None:
        cols = self.cols[self.cols < u.n_cols]
        if not len(cols):
            return None
        mask = torch.ones(u.size, u.n_cols, dtype=torch.bool, device=self.universe.device)
        mask[:, cols] = False
        return mask


@dataclass
class Reference:
    """The corrupted run as the edge ablation needs it: the residual at each read point (``("attn", l)``,
    ``("mlp", l)``, ``("final", None)``: ``[P, d]``, ``P = B * T``), every writer column's coefficient ``[P, n_cols]``
    (column 0, the embedding, is 1) and the embedding ``[P, d]``."""

    resid: dict[tuple[str, int | None], Tensor]
    coef: Tensor
    embed: Tensor


@dataclass
class _Live:
    """One patched forward's writers so far: ``dcT = (corrupted - live)^T`` coefficients ``[n_cols, P]`` (a writer
    column per row: the rows a reader unit's edges read are one slice) and each writer
    unit's ``corrupted - live`` write ``delta [n_units, P, d]`` (filled as the forward reaches them), and the
    corrections computed for the reader units (``{index: (delta [P, K], rho [P])}``). ``P`` counts the active
    positions ``rows`` (flat indices into the batch's ``B * T``; None: all of them)."""

    dcT: Tensor
    delta: Tensor
    rows: Tensor | None = None
    corrections: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    captured: dict[str, Tensor] = field(default_factory=dict)
    writes: list[Tensor] | None = None  # soft blocks: each writer unit's ``corrupted - live`` write, in unit order
    kept: list[Tensor] | None = None  # soft directions: each writer unit's ``x``-weighted write
    x: Tensor | None = None  # soft directions: the writer directions' keep weights ``[n_writer_cols]``


class EdgeAblation:
    """Runs ``universe``'s model with a circuit's edges kept and the rest ablated (module docstring).

    ``reference(batch)`` records the corrupted prompts once per batch; ``metric(batch, circuit, reference)`` is the
    task metric ``[B]`` of the clean prompts with the circuit. Clean and corrupted prompts must have the same
    token length.
    """

    def __init__(self, universe: EdgeUniverse, task: str | TaskScorer, gains: Mapping[int, Tensor] | None = None):
        self.u = universe
        self.gains = gains
        self.view = universe.view
        self.task = task_scorer(task)

    # --- writers' coefficients -------------------------------------------------------------------
    def _head_coef(self, layer: int, z: Tensor, out: Tensor, extra: Tensor | None) -> Tensor:
        """``[P, H * K]``: the heads' OV coefficients ``z_h W_O v_k`` (+ ``extra [P, H, K]``), times Gemma's post-norm
        factor of the attention output ``out``."""
        v, dt = self.view, self.u.dtype
        P = z.shape[0] * z.shape[1]
        zz = z.reshape(P, v.n_heads, v.d_head).to(dt)
        c = torch.einsum("phc,hck->phk", zz, self.u.head_read[layer])
        if extra is not None:
            c = c + extra
        post = v.post_norm_factor("attn", layer, out)
        c = c.reshape(P, -1)
        return c if post is None else c * post.reshape(P, 1).to(dt)

    def _mlp_coef(self, layer: int, out: Tensor) -> Tensor:
        """``[P, K]``: the MLP's output coefficients ``out . v_k`` times Gemma's post-norm factor."""
        dt = self.u.dtype
        P = out.shape[0] * out.shape[1]
        c = out.reshape(P, -1).to(dt) @ self.u.mlp_V[layer]
        post = self.view.post_norm_factor("mlp", layer, out)
        return c if post is None else c * post.reshape(P, 1).to(dt)

    # --- the corrupted run -----------------------------------------------------------------------
    def reference(self, batch: dict) -> Reference:
        """The corrupted prompts' residuals and writer coefficients (``Reference``)."""
        return self.record(batch, "corrupt_ids")

    @torch.no_grad()
    def record(self, batch: dict, ids: str = "corrupt_ids") -> Reference:
        """The residuals and writer coefficients of an unpatched run of ``batch[ids]`` (``Reference``)."""
        check_lengths(batch)
        u, v = self.u, self.view
        resid: dict[tuple[str, int | None], Tensor] = {}
        parts: list[Tensor] = []
        got: dict = {}

        def keep_resid(point, layer):
            def pre(module, args, kwargs):
                x = first_input(args, kwargs)
                resid[point, layer] = x.reshape(-1, x.shape[-1]).to(u.dtype)

            return pre

        specs = [Hook(v.norm_module("final", None), keep_resid("final", None), "pre")]
        for l in range(v.n_layers):
            specs += [
                Hook(v.norm_module("attn", l), keep_resid("attn", l), "pre"),
                Hook(v.norm_module("mlp", l), keep_resid("mlp", l), "pre"),
                Hook(v.site_module(l, "o"), _keep_input(got, ("z", l)), "pre"),
                Hook(v.attention_module(l), _keep_output(got, ("attn", l)), "post"),
                Hook(v.site_module(l, "down"), _keep_site(v, l, "down", got, ("down", l)), "post"),
            ]
        with hooks(*specs), eager_attention(v.model):
            forward_answer_logits(v.model, batch[ids], batch["attention_mask"], batch["answer_pos"])
        embed = resid["attn", 0]
        parts.append(torch.ones(embed.shape[0], 1, dtype=u.dtype, device=embed.device))
        for l in range(v.n_layers):
            parts.append(self._head_coef(l, got["z", l], got["attn", l], None))
            parts.append(self._mlp_coef(l, got["down", l]))
        coef = torch.cat(parts, 1)
        return Reference(resid, coef, embed)

    # --- the patched forward ---------------------------------------------------------------------
    @torch.no_grad()
    def metric(self, batch: dict, circuit: Circuit, reference: Reference) -> Tensor:
        """``[B]``: the task metric of the clean prompts with only ``circuit``'s edges clean."""
        with self.patched(batch, circuit, reference):
            logits = forward_answer_logits(
                self.view.model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"]
            )
        return self.task.metric(logits, batch).double()

    @contextmanager
    def patched(self, batch: dict, circuit: Circuit, reference: Reference) -> Iterator[None]:
        """Within the block, forwards of ``batch``'s clean prompts run with ``circuit`` (module docstring)."""
        check_lengths(batch)
        u, v = self.u, self.view
        rows = active_rows(batch)
        reference = reference if rows is None else _take_rows(reference, rows.to(reference.embed.device))
        P = reference.embed.shape[0]
        masks = _LazyMasks(circuit, u)  # one reader unit's mask at a time, when the forward reaches it
        soft = hasattr(circuit, "block_weights")
        directed = soft and hasattr(circuit, "writer_weights")
        n_cols, n_units = (0, 0) if soft else (u.n_writer_cols, len(u.writers))
        live = _Live(
            dcT=torch.zeros(n_cols, P, dtype=u.dtype, device=u.device),
            delta=torch.zeros(n_units, P, v.d_model, dtype=u.dtype, device=u.device),
            rows=None if rows is None else rows.to(u.device),
            writes=[] if soft else None,
            kept=[] if directed else None,
            x=circuit.writer_weights().to(u.device, u.dtype) if directed else None,  # type: ignore[attr-defined]
        )
        specs = [Hook(v.norm_module("final", None), self._final_hook(masks, reference, live), "pre")]
        for l in range(v.n_layers):
            specs += [
                Hook(v.norm_module("attn", l), self._read_hook("attn", l, masks, reference, live), "pre"),
                Hook(v.norm_module("mlp", l), self._read_hook("mlp", l, masks, reference, live), "pre"),
                Hook(v.site_module(l, "v"), _keep_site(v, l, "v", live.captured, "value"), "post"),
                Hook(v.site_module(l, "o"), _keep_input(live.captured, "z"), "pre"),
                Hook(v.attention_module(l), self._attention_hook(l, reference, live), "post"),
                Hook(v.site_module(l, "down"), self._down_hook(l, reference, live), "post"),
            ]
            for site in ("q", "k", "up") + (("gate",) if v.gated_mlp else ()):
                specs.append(Hook(v.site_module(l, site), self._site_hook(l, site, live), "post"))
        with ExitStack() as stack:
            stack.enter_context(eager_attention(v.model))
            stack.enter_context(hooks(*specs))
            yield

    def _read_hook(self, point, layer, masks, reference, live):
        """Pre-hook of a norm: the corrections of every reader unit reading it (and, at layer 0's attention, the
        embedding's write)."""
        u = self.u

        def pre(module, args, kwargs):
            x = first_input(args, kwargs)
            R = _rows(x.reshape(-1, x.shape[-1]), live.rows).to(u.dtype)
            if live.writes is not None:
                self._soft_read(point, layer, masks, reference, live, R)
                return
            if point == "attn" and layer == 0:
                live.dcT[0] = 1.0
                live.delta[0] = reference.embed - R
            todo = [(r, keep) for r in u.reader_units(point, layer) if (keep := masks[r.index]) is not None]
            if not todo:
                return
            plans = [_plan(u, r, keep) for r, keep in todo]
            sums = _unit_sums(live.delta, [_sum_units(keep, plan) for (_, keep), plan in zip(todo, plans)])
            _mixed_sums(live, u, [(r, p) for (r, _), p in zip(todo, plans) if p is not None and p.dense], self.gains)
            for (r, keep), plan, (D, Dr) in zip(todo, plans, sums):
                live.corrections[r.index] = self.correction(r, keep, R, D, Dr, plan, live)

        return pre

    def _soft_read(
        self, point: ReadPoint, layer: int, masks: _LazyMasks, reference: Reference, live: _Live, R: Tensor
    ) -> None:
        """The corrections of one read point's reader units under soft blocks: each unit adds ``sum_U (1 - w_U)
        Delta_U`` (``_WeightedSum``) and reads it through its own norm, as a circuit of whole blocks does."""
        assert live.writes is not None
        if point == "attn" and layer == 0:
            live.writes.append(reference.embed - R)
            if live.kept is not None and live.x is not None:
                live.kept.append(live.x[0] * live.writes[0])
        todo = [(r, w) for r in self.u.reader_units(point, layer) if (w := masks.weights(r.index)) is not None]
        if not todo:
            return
        n = todo[0][0].n_up
        assert all(r.n_up == n for r, _ in todo) and len(live.writes) >= n
        w = torch.stack([w for _, w in todo]).to(R.dtype)
        if live.kept is None:
            D = _WeightedSum.apply(1 - w, *live.writes[:n])
            whole = UnitKeep(torch.full((n,), FULL))
            for (r, _), Du in zip(todo, D):
                live.corrections[r.index] = self.correction(r, whole, R, Du, Du, None, live)
            return
        total = reference.resid[point, layer] - R  # every writer's corrupted - live write: the residuals' difference
        kept = _WeightedSum.apply(w, *live.kept[:n])
        for (r, _), Ku in zip(todo, kept):
            live.corrections[r.index] = self.directed_correction(r, R, total, Ku, masks.reader_weights(r.index))

    def directed_correction(
        self, r: ReaderUnit, R: Tensor, total: Tensor, kept: Tensor, y: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``correction`` under soft directions (module docstring): ``total`` every writer's ``corrupted - live``
        write summed, ``kept`` the block- and ``x``-weighted writes the unit keeps, ``y [K]`` its directions'
        weights."""
        v = self.view
        y = y.to(R.device, R.dtype)
        Rc = self.u.basis(r).Rc
        raw = Rc @ total.T - y[:, None] * (Rc @ kept.T)  # [K, P]
        layer = None if r.point == "final" else r.layer
        f = v.norm_factor(r.point, layer, R + total - y.max() * kept).reshape(-1)
        return raw.T * f[:, None], f / v.norm_factor(r.point, layer, R).reshape(-1)

    def correction(
        self,
        r: ReaderUnit,
        keep: UnitKeep,
        R: Tensor,
        D: Tensor,
        Dr: Tensor,
        plan: _Partial | None,
        live: _Live,
    ) -> tuple[Tensor, Tensor]:
        """``(delta [P, K], rho [P])`` of reader unit ``r`` with what it keeps (``UnitKeep``): each direction's
        coefficient is ``bias + rho * (live coefficient - bias) + delta`` (module docstring). ``R``: the live
        residual ``[P, d]``; ``D``, ``Dr``: the summed ``corrupted - live`` writes of the unit's input and of its
        directions' reading (``_sum_units``); ``plan``: its partially kept columns but the embedding's."""
        u, v = self.u, self.view
        Rc = u.basis(r).Rc
        y = R + D
        if plan is not None:
            lost = plan.lost_sum(live, u)
            y = y + lost
            raw = _partial_sum(live, u, Rc, D, Dr, lost, plan, None if self.gains is None else self.gains[r.index])
        else:
            raw = Rc @ D.T  # [K, P]
        if bool(keep.state[0] == PARTIAL):  # the embedding is kept for some directions only
            raw += (~keep.columns(slice(0, 1))).to(raw.dtype) * (Rc @ live.delta[0].T)
        f = v.norm_factor(r.point, None if r.point == "final" else r.layer, y).reshape(-1)
        f_live = v.norm_factor(r.point, None if r.point == "final" else r.layer, R).reshape(-1)
        return raw.T * f[:, None], f / f_live

    def _site_hook(self, layer, site, live):
        """Post-hook of a q / k / up / gate site: applies its reader units' corrections."""
        u, v = self.u, self.view
        kind = {"q": "q", "k": "k", "up": "mlp", "gate": "mlp"}[site]
        units = [r for r in u.reader_units("mlp" if kind == "mlp" else "attn", layer) if r.kind == kind]

        def hook(module, args, kwargs, out):
            todo = [r for r in units if r.index in live.corrections]
            if not todo:
                return out
            own = v.site_output(layer, site, out)
            B, T, width = own.shape
            new = _rows(own.reshape(B * T, width), live.rows).to(u.dtype).clone()
            for r in todo:
                delta, rho = live.corrections[r.index]
                b = u.basis(r)
                if kind == "mlp":
                    half = slice(0, b.split) if site == "up" else slice(b.split, None)
                    cols, Y = slice(None), b.Y[half]
                    bias = b.bias.reshape(-1, width)[0 if site == "up" else 1]
                    delta = delta[:, half]
                else:
                    d = b.Y.shape[1]
                    cols, Y, bias = slice(r.group * d, (r.group + 1) * d), b.Y, b.bias
                part = new[:, cols]
                new[:, cols] = bias + rho[:, None] * (part - bias) + delta @ Y
            if live.rows is not None:
                new = own.reshape(B * T, width).to(u.dtype).index_copy(0, live.rows, new)
            return v.with_site_output(layer, site, out, new.reshape(B, T, width).to(own.dtype))

        return hook

    def _attention_hook(self, layer, reference, live):
        """Post-hook of the attention module: the value readers' corrections mixed by the live pattern, then the
        layer's head writers (live coefficients, ``corrupted - live`` writes)."""
        u, v = self.u, self.view
        units = [r for r in u.reader_units("attn", layer) if r.kind == "v"]
        heads = u.writer_units(layer, "head")
        per_kv = v.n_heads // v.n_kv_heads

        def hook(module, args, kwargs, out):
            attn = output_tensor(out)
            B, T, d = attn.shape
            todo = [r for r in units if r.index in live.corrections]
            extra = None
            if todo:
                pattern = output_tensor(out, 1)
                if pattern is None:
                    raise RuntimeError("edge ablation needs the attention pattern: run under eager attention")
                value = _rows(live.captured["value"].reshape(B * T, v.n_kv_heads, v.d_head), live.rows).to(u.dtype)
                extra = torch.zeros(B * T, v.n_heads, u.head_read[layer].shape[-1], dtype=u.dtype, device=u.device)
                add = torch.zeros(B * T, d, dtype=u.dtype, device=u.device)
                for r in todo:
                    delta, rho = live.corrections[r.index]
                    b = u.basis(r)
                    assert b.read is not None  # a value reader's read map
                    own = (value[:, r.group // per_kv] - b.bias) @ b.read  # [P, K]: the live coefficients
                    change = _scatter_rows(delta + (rho - 1)[:, None] * own, live.rows, B * T).reshape(B, T, -1)
                    mixed = torch.einsum("bds,bsk->bdk", pattern[:, r.group].to(u.dtype), change).reshape(B * T, -1)
                    extra[:, r.group] = mixed
                    add += mixed @ b.Y
                attn = attn + add.reshape(B, T, d).to(attn.dtype)
                out = (attn, *out[1:]) if isinstance(out, tuple) else attn
            coef = self._head_coef(layer, live.captured["z"], attn, extra)
            self._fill(heads, _rows(coef, live.rows), reference, live)
            return out

        return hook

    def _down_hook(self, layer, reference, live):
        v = self.view
        mlp = self.u.writer_units(layer, "mlp")

        def hook(module, args, kwargs, out):
            coef = self._mlp_coef(layer, v.site_output(layer, "down", out))
            self._fill(mlp, _rows(coef, live.rows), reference, live)

        return hook

    def _fill(self, units: list[WriterUnit], coef: Tensor, reference: Reference, live: _Live) -> None:
        """Record the live coefficients of consecutive writer units: their ``dc`` columns and ``delta`` writes."""
        u = self.u
        start, stop = units[0].offset, units[-1].offset + units[-1].size
        if live.writes is not None:  # soft blocks: one tensor per writer unit, no buffer written in place
            change = reference.coef[:, start:stop] - coef
            for w in units:
                assert len(live.writes) == w.index
                cols = slice(w.offset, w.offset + w.size)
                part = change[:, cols.start - start : cols.stop - start]
                live.writes.append(part @ u.W[cols])
                if live.kept is not None and live.x is not None:
                    live.kept.append((part * live.x[cols]) @ u.W[cols])
            return
        live.dcT[start:stop] = (reference.coef[:, start:stop] - coef).T
        for w in units:
            cols = slice(w.offset, w.offset + w.size)
            live.delta[w.index] = live.dcT[cols].T @ u.W[cols]

    def _final_sum(self, r: ReaderUnit, keep: UnitKeep, reference: Reference, live: _Live, R: Tensor) -> Tensor:
        """``[P, d]``: the ``corrupted - live`` writes of the logits' dropped edges."""
        u = self.u
        state = keep.state
        empty = state == EMPTY
        T = reference.resid["final", None] - R
        D = _unit_sum(live.delta, empty) if int(empty.sum()) * 2 <= r.n_up else T - _unit_sum(live.delta, ~empty)
        partial = (state == PARTIAL)[u.col_unit[1 : r.n_cols]]
        cols = torch.nonzero(partial & ~keep.any_col[1:]).flatten() + 1 if keep.any_col is not None else partial[:0]
        if len(cols):
            D = D + _take(live.dcT, cols, 0).T @ _take(u.W, cols, 0)
        return D

    def _final_hook(self, masks, reference, live):
        """Pre-hook of the final norm: the logits' input gets the ``corrupted - live`` writes of its dropped edges."""
        u = self.u
        r = u.readers[-1]

        def pre(module, args, kwargs):
            soft = live.writes is not None
            kept = masks.weights(r.index) if soft else masks[r.index]
            if kept is None:  # every edge into the logits kept
                return None
            x = first_input(args, kwargs)
            R = _rows(x.reshape(-1, x.shape[-1]), live.rows).to(u.dtype)
            if soft and live.kept is not None:  # soft directions: the logits read one direction
                y = masks.reader_weights(r.index).to(R.device, R.dtype)
                total = reference.resid["final", None] - R
                D = total - y.max() * _WeightedSum.apply(kept[None].to(R.dtype), *live.kept[: r.n_up])[0]
            elif soft:
                D = _WeightedSum.apply((1 - kept)[None].to(R.dtype), *live.writes[: r.n_up])[0]
            else:
                D = self._final_sum(r, kept, reference, live, R)
            new = (R + D).to(x.dtype)
            if live.rows is not None:
                new = x.reshape(-1, x.shape[-1]).index_copy(0, live.rows.to(x.device), new)
            new = new.reshape(x.shape)
            if args:
                return (new, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}

        return pre


@dataclass
class KeepLevels:
    """A reader unit's keep mask as ``level >= need`` (``level [K, n_cols]`` integer): nested circuits (the sizes of
    one ranking) share ``level`` and differ in ``need``, so a size reads no scores. ``low`` / ``high`` ``[n_cols]``:
    the column minima / maxima of ``level`` (a column is kept by every / by some direction where they are >=
    ``need``)."""

    level: Tensor
    low: Tensor
    high: Tensor
    need: int


@dataclass
class UnitKeep:
    """What a reader unit keeps: ``state [n_up]`` each block EMPTY, FULL or PARTIAL; where some block is PARTIAL
    ``any_col`` / ``all_col [n_cols]`` (the columns some / every direction keeps) and the keep mask ``[K, n_cols]``
    (``mask``, or ``levels``: ``columns`` reads either), else None."""

    state: Tensor
    mask: Tensor | None = None
    any_col: Tensor | None = None
    levels: KeepLevels | None = None
    all_col: Tensor | None = None

    def columns(self, cols: Cols = slice(None)) -> Tensor:
        """``[K, len(cols)]`` bool: the keep mask of the writer columns ``cols``."""
        if self.levels is not None:
            level = self.levels.level[:, cols]
            return level >= _row(self.levels.need, level.shape[1], level.device)
        assert self.mask is not None, "a unit of whole blocks has no mask"
        return self.mask[:, cols]

    def dropped(self, cols: Cols, within: Tensor, out: Tensor) -> Tensor:
        """``out [K, len(cols)]`` (float): 1 at the dropped edges of the writer columns ``cols`` where ``within
        [len(cols)]``, 0 elsewhere (a comparison writing floats: several times faster than a bool mask's
        conversion)."""
        if self.levels is None:
            assert self.mask is not None, "a unit of whole blocks has no mask"
            return torch.lt(self.mask[:, cols], within, out=out)  # not kept, and within
        level = self.levels.level[:, cols]
        return torch.lt(level, torch.where(within, _row(self.levels.need, level.shape[1], level.device), 0), out=out)

    def partial_units(self) -> Tensor:
        """``[n_up]``: the partially kept writer units but the embedding (whose write is not ``dcT W``)."""
        out = self.state == PARTIAL
        out[0] = False
        return out


def _row(value: int, n: int, device: torch.device) -> Tensor:
    """``[n]`` uint8 of ``value``: levels compared with a row of their own dtype, not a Python scalar (several times
    faster on the CPU)."""
    return torch.full((n,), value, dtype=torch.uint8, device=device)


class _LazyMasks:
    """``masks[index]``: what the circuit keeps of a reader unit (``UnitKeep``; None: every edge), computed when asked
    (each is asked once). A circuit with ``block_keep(u)`` (``[n_up]`` bool, or None) gives whole blocks without a
    mask of direction edges; one with ``levels(u)`` (``KeepLevels``) gives its mask as levels."""

    def __init__(self, circuit: Circuit, universe: EdgeUniverse):
        self.circuit, self.u = circuit, universe

    def weights(self, index: int) -> Tensor | None:
        """``[n_up]``: a soft circuit's keep weight of each block of reader unit ``index`` (None: every block kept)."""
        return self.circuit.block_weights(self.u.readers[index])  # type: ignore[attr-defined]

    def reader_weights(self, index: int) -> Tensor:
        """``[K_u]``: a soft-directions circuit's keep weight of each direction of reader unit ``index``."""
        return self.circuit.reader_weights(self.u.readers[index])  # type: ignore[attr-defined]

    def __getitem__(self, index: int) -> UnitKeep | None:
        r = self.u.readers[index]
        blocks = getattr(self.circuit, "block_keep", None)
        kept = blocks(r) if blocks is not None else None
        if kept is not None:
            kept = kept.to(self.u.device)
            return None if bool(kept.all()) else UnitKeep(torch.where(kept, FULL, EMPTY), None)
        levels = getattr(self.circuit, "levels", None)
        L, M = (levels(r), None) if levels is not None else (None, self.circuit.keep(r))
        if L is not None:
            any_col, all_col = L.high >= L.need, L.low >= L.need
        elif M is not None:
            any_col, all_col = M.any(0), M.all(0)
        else:
            return None
        if bool(all_col.all()):
            return None
        return UnitKeep(_block_states(self.u, r, any_col, all_col), M, any_col, L, all_col)


def _block_states(u: EdgeUniverse, r: ReaderUnit, any_col: Tensor, all_col: Tensor) -> Tensor:
    """``[n_up]``: each block of ``r`` EMPTY, FULL or PARTIAL from its columns kept by some (``any_col``) and by
    every (``all_col``) direction."""
    unit = u.col_unit[: r.n_cols].to(any_col.device)
    count = lambda c: torch.zeros(r.n_up, dtype=torch.long, device=c.device).index_add_(0, unit, c.long())  # noqa: E731
    some, every = count(any_col), count(all_col)
    size = u.writer_sizes[: r.n_up].to(any_col.device)
    return torch.where(some == 0, EMPTY, torch.where(every == size, FULL, PARTIAL))


def _sum_units(keep: UnitKeep, plan: _Partial | None) -> tuple[Tensor, Tensor]:
    """``[n_up]`` bool twice: the writer units whose writes a reader unit's input adds in full (its blocks dropped
    whole, and where ``plan.subtract`` the partial ones its lost columns are summed from), and those whose sum its
    directions read (the same, but few kept: every partial unit, ``Dp``)."""
    empty = keep.state == EMPTY
    if plan is None or not plan.with_units:
        return empty, empty
    read = empty | plan.units
    return (read if plan.subtract else empty), read


class _WeightedSum(torch.autograd.Function):
    """``[U, P, d]``: ``weights [U, n] @ writes`` (``n`` tensors ``[P, d]``), differentiable in both, saving the writes
    as they are for the backward (each is its own tensor: a stacked copy per read point would hold the writes of
    every earlier writer once per read point)."""

    @staticmethod
    def forward(ctx: Any, weights: Tensor, *writes: Tensor) -> Tensor:
        ctx.save_for_backward(weights, *writes)
        return (weights @ torch.stack(writes).reshape(len(writes), -1)).reshape(len(weights), *writes[0].shape)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        weights, *writes = ctx.saved_tensors
        g = grad.reshape(len(weights), -1)
        stacked = torch.stack(writes).reshape(len(writes), -1)
        d_weights = g @ stacked.T if ctx.needs_input_grad[0] else None
        d_writes = (weights.T @ g).reshape(len(writes), *writes[0].shape)
        return (d_weights, *d_writes.unbind(0))


def _unit_sums(delta: Tensor, which: list[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
    """Every ``_sum_units`` sum of one read point's reader units (``[P, d]`` each) as one product over the distinct
    sets of writer units (many units drop the same blocks)."""
    rows = torch.stack([row for pair in which for row in pair])
    n = rows.shape[1]
    distinct, at = torch.unique(rows, dim=0, return_inverse=True)
    sums = (distinct.to(delta.dtype) @ delta[:n].reshape(n, -1)).reshape(len(distinct), *delta.shape[1:])
    at = at.tolist()
    return [(sums[at[2 * i]], sums[at[2 * i + 1]]) for i in range(len(which))]


def _unit_sum(delta: Tensor, which: Tensor) -> Tensor:
    """``[P, d]``: the sum of the writer units' writes ``delta[U]`` over ``which [n_up]`` (bool)."""
    n = len(which)
    w = which.to(delta.dtype)
    return (w @ delta[:n].reshape(n, -1)).reshape(delta.shape[1:])


Cols = Tensor | slice  # writer columns: an index tensor, or a slice where they are one contiguous run


def _span(cols: Tensor) -> Cols:
    """``cols`` (ascending) as a slice where they are one contiguous run (no copies of them), else as they are."""
    if len(cols) and int(cols[-1]) - int(cols[0]) + 1 == len(cols):
        return slice(int(cols[0]), int(cols[-1]) + 1)
    return cols


def _length(cols: Cols) -> int:
    return cols.stop - cols.start if isinstance(cols, slice) else len(cols)


@dataclass
class _Partial:
    """The partially kept columns ``cols`` of a reader unit (but the embedding), planned before its read point's unit
    sums: ``mixed``, those kept by some directions but not all (keep mask ``Mm``); ``few_kept``: at most ``SPARSE``
    of their edges kept; ``units [n_up]`` (where ``with_units``): the writer units whose summed write the unit sums
    give (few kept: every partial unit, ``Dp``; else the partial units of more columns no direction keeps than
    others). The columns no direction keeps sum to the writes of ``add``, plus (``subtract``) those units' writes
    (added with the blocks dropped whole: ``_sum_units``) less the writes of ``sub`` (``lost_sum``). ``dense``: the
    mixed columns' dropped edges take a dense product (more than ``SPARSE`` of the partial edges dropped there),
    ``mixed_sum [K, P]`` (``_mixed_sums``)."""

    keep: UnitKeep
    cols: Cols
    mixed: Cols
    few_kept: bool
    units: Tensor
    with_units: bool
    subtract: bool
    add: Tensor
    sub: Tensor
    dense: bool
    mixed_sum: Tensor | None = None

    @cached_property
    def Mm(self) -> Tensor:
        """``[K, len(mixed)]`` bool: the keep mask of the mixed columns (formed where a path reads it)."""
        return self.keep.columns(self.mixed)

    def lost_sum(self, live: _Live, u: EdgeUniverse) -> Tensor:
        """``[P, d]``: the ``corrupted - live`` writes of the columns no direction keeps, but (``subtract``) the
        ``units``' writes, which come with the unit sums (``_sum_units``)."""
        lost = _take(live.dcT, self.add, 0).T @ _take(u.W, self.add, 0)
        if self.subtract:
            lost -= _take(live.dcT, self.sub, 0).T @ _take(u.W, self.sub, 0)
        return lost


def _plan(u: EdgeUniverse, r: ReaderUnit, keep: UnitKeep) -> _Partial | None:
    """``_Partial`` of ``r``'s partially kept columns (None where none but the embedding's). The columns no direction
    keeps are summed over the fewer side: few kept, over them or over the others (subtracted from ``Dp``); else
    block by block (in a block of more such columns than others, the others are subtracted from its write)."""
    if keep.any_col is None or keep.all_col is None:
        return None
    partial = keep.partial_units()
    dev = partial.device
    cols = _span(torch.nonzero(partial[u.col_unit[1 : r.n_cols]]).flatten() + 1)
    if not _length(cols):
        return None
    idx = _index(cols, dev)
    some, every = keep.any_col[idx], keep.all_col[idx]
    mixed = _span(idx[some & ~every])
    K, n, kept_mixed = r.size, len(idx), _kept(keep, mixed, r.size)
    few = K * int(every.count_nonzero()) + kept_mixed <= SPARSE * K * n
    unit = u.col_unit[idx].to(dev)
    if few:  # Dp is needed anyway (``_partial_sum``)
        units, subtract = partial, 2 * int(some.count_nonzero()) < n
        within = torch.full_like(some, subtract)
    else:
        kept = torch.zeros(len(partial), dtype=torch.long, device=dev).index_add_(0, unit, some.long())
        units = partial & (2 * kept < u.writer_sizes[: len(partial)].to(dev))
        subtract, within = bool(units.any()), units[unit]
    add, sub = idx[~some & ~within], idx[some & within]
    dense = not few and _length(mixed) > 0 and K * _length(mixed) - kept_mixed > SPARSE * K * n
    return _Partial(keep, cols, mixed, few, units, few or subtract, subtract, add, sub, dense)


def _kept(keep: UnitKeep, mixed: Cols, K: int) -> int:
    """The kept edges of the mixed columns: counted over their span where it is at most twice as wide (the mask of a
    slice: no gathered columns, about a third of the cost), less ``K`` for each column there that every direction
    keeps (the others there keep none)."""
    if isinstance(mixed, slice) or not len(mixed) or int(mixed[-1]) - int(mixed[0]) + 1 > 2 * len(mixed):
        return int(keep.columns(mixed).count_nonzero())
    span = slice(int(mixed[0]), int(mixed[-1]) + 1)
    assert keep.all_col is not None
    return int(keep.columns(span).count_nonzero()) - K * int(keep.all_col[span].count_nonzero())


def _partial_sum(
    live: _Live,
    u: EdgeUniverse,
    Rc: Tensor,
    D: Tensor,
    Dr: Tensor,
    lost: Tensor,
    plan: _Partial,
    G: Tensor | None,
) -> Tensor:
    """``[K, P]``: ``Rc . D`` plus ``sum_j (1 - keep_kj) G_kj dc_j`` over the partially kept columns (``_Partial``;
    ``D + lost``: the writes of the blocks and columns no direction keeps, ``Dr``: ``_sum_units``'s read sum). Few
    kept: ``r . Dr`` (with ``Dp``) less a sparse product over the kept edges; else ``r . (D + lost)`` (a column no
    direction keeps adds its write to every direction) plus the mixed columns: a sparse product over their dropped
    edges where few (``SPARSE``), else a dense one. ``G [K, n_cols]``: the unit's gains ``Rc W^T`` if precomputed
    (else formed here)."""
    if plan.few_kept:
        return Rc @ Dr.T - _edge_sum(live, u, Rc, plan.keep.columns(plan.cols), plan.cols, G)
    raw = Rc @ (D + lost).T
    if plan.dense:
        assert plan.mixed_sum is not None
        return raw.add_(plan.mixed_sum)
    if not _length(plan.mixed):
        return raw
    return raw + _edge_sum(live, u, Rc, ~plan.Mm, plan.mixed, G)


def _mixed_sums(
    live: _Live, u: EdgeUniverse, units: list[tuple[ReaderUnit, _Partial]], gains: Mapping[int, Tensor] | None
) -> None:
    """Set ``mixed_sum [K, P]``, ``sum_j (1 - keep_kj) G_kj dc_j`` over the mixed columns, of the dense ``units`` of one
    read point: one product over the union of their mixed columns where that costs less than one product per unit,
    each over its columns gathered or over their span (``_columns``)."""
    if not units:
        return
    mixed = [_index(p.mixed, live.dcT.device) for _, p in units]
    K = [r.size for r, _ in units]
    union = torch.unique(torch.cat(mixed)) if len(units) > 1 else mixed[0]
    cost, cols = _columns(sum(K), union)
    if len(units) > 1 and cost > sum(_columns(k, m)[0] for k, m in zip(K, mixed)):
        for unit in units:
            _mixed_sums(live, u, [unit], gains)
        return
    A = torch.empty(sum(K), _length(cols), dtype=live.dcT.dtype, device=live.dcT.device)
    at = 0
    for (r, plan), m in zip(units, mixed):
        G = _gains(u, r, cols) if gains is None else _take(gains[r.index], cols, 1)
        _dropped(plan, cols, m, A[at : at + r.size]).mul_(G)
        at += r.size
    for (_, plan), part in zip(units, (A @ _take(live.dcT, cols, 0)).split(K)):
        plan.mixed_sum = part


def _columns(K: int, cols: Tensor) -> tuple[float, Cols]:
    """The writer columns of a dense product of ``K`` directions over the columns ``cols`` (ascending) and its cost
    in columns x directions: their span (no copies, the columns between them zero) or themselves gathered (each
    costing ``GATHER``, and a quarter for its gains)."""
    n, span = len(cols), int(cols[-1]) - int(cols[0]) + 1
    gathered = n * (K + K / 4 + GATHER)
    return (K * span, slice(int(cols[0]), int(cols[-1]) + 1)) if K * span <= gathered else (gathered, cols)


def _take(x: Tensor, cols: Cols, dim: int) -> Tensor:
    """``x``'s columns (``dim`` 1) or rows (``dim`` 0) ``cols``."""
    if isinstance(cols, slice):
        return x[:, cols] if dim else x[cols]
    return x.index_select(dim, cols)


def _dropped(plan: _Partial, cols: Cols, mixed: Tensor, out: Tensor) -> Tensor:
    """``out [K, len(cols)]`` (float): 1 at the dropped edges of the mixed columns ``mixed`` among the columns
    ``cols``, 0 elsewhere."""
    if _length(cols) == len(mixed):  # the mixed columns themselves
        return torch.logical_not(plan.Mm, out=out)
    idx = _index(cols, mixed.device)
    on = torch.zeros(int(idx[-1]) + 1, dtype=torch.bool, device=mixed.device)
    on[mixed] = True
    return plan.keep.dropped(cols, on[idx], out)


def _gains(u: EdgeUniverse, r: ReaderUnit, cols: Cols) -> Tensor:
    """``[K, len(cols)]``: reader unit ``r``'s gains ``G = Rc W^T`` of the writer columns ``cols``."""
    return u.basis(r).Rc @ u.W[cols].T


def _index(cols: Cols, device: torch.device) -> Tensor:
    """``cols`` as an index tensor."""
    return torch.arange(cols.start, cols.stop, device=device) if isinstance(cols, slice) else cols


def _edge_sum(
    live: _Live, u: EdgeUniverse, Rc: Tensor, which: Tensor, cols: Cols, G: Tensor | None, chunk: int = 1 << 16
) -> Tensor:
    """``[K, P]``: ``sum over the edges (k, j) in which of G_kj dc_j`` as one sparse (CSR) product with the writers'
    ``dcT`` (``G_kj`` read from ``G [K, n_cols]`` or formed edge by edge)."""
    k, j = torch.nonzero(which, as_tuple=True)  # row-major: CSR order
    col = j + cols.start if isinstance(cols, slice) else cols[j]
    if G is not None:
        g = G[k, col].to(Rc.dtype)
    else:
        parts = [(Rc[k[i : i + chunk]] * u.W[col[i : i + chunk]]).sum(-1) for i in range(0, len(k), chunk)]
        g = torch.cat(parts) if parts else Rc.new_zeros(0)
    n = (cols.stop if isinstance(cols, slice) else int(cols.max()) + 1) if len(col) else 1
    crow = torch.zeros(which.shape[0] + 1, dtype=torch.int64, device=which.device)
    crow[1:] = torch.bincount(k, minlength=which.shape[0]).cumsum(0)
    S = torch.sparse_csr_tensor(crow, col, g, (which.shape[0], n), check_invariants=False)
    return S @ live.dcT[:n]


def _keep_input(store: dict, key: object) -> Callable:
    def pre(module, args, kwargs):
        store[key] = first_input(args, kwargs)

    return pre


def _keep_output(store: dict, key: object) -> Callable:
    def post(module, args, kwargs, out):
        store[key] = output_tensor(out)

    return post


def _keep_site(view: ModelView, layer: int, site: str, store: dict, key: object) -> Callable:
    def post(module, args, kwargs, out):
        store[key] = view.site_output(layer, site, out)

    return post


def active_rows(batch: dict) -> Tensor | None:
    """The flat positions (``b * T + t``) that can change the metric: from each prompt's first token where clean and
    corrupted differ to its answer position, padding excluded (module docstring); None where that is every one."""
    clean, corrupt, mask = batch["clean_ids"], batch["corrupt_ids"], batch["attention_mask"]
    B, T = clean.shape
    t = torch.arange(T, device=clean.device)
    differ = (clean != corrupt) & mask.bool()
    first = torch.where(differ.any(1), differ.int().argmax(1), T)
    active = (t >= first[:, None]) & (t <= batch["answer_pos"].to(clean.device)[:, None]) & mask.bool()
    return None if bool(active.all()) else torch.nonzero(active.reshape(-1)).flatten()


def _rows(x: Tensor, rows: Tensor | None) -> Tensor:
    """``x [B * T, ...]`` at the active rows (all where ``rows`` is None)."""
    return x if rows is None else x.index_select(0, rows.to(x.device))


def _scatter_rows(x: Tensor, rows: Tensor | None, n: int) -> Tensor:
    """``[n, ...]``: ``x`` (the active rows) in place, zero elsewhere."""
    return x if rows is None else x.new_zeros(n, *x.shape[1:]).index_copy_(0, rows, x)


def _take_rows(reference: Reference, rows: Tensor) -> Reference:
    """``reference`` at the active rows."""
    resid = {key: _rows(x, rows) for key, x in reference.resid.items()}
    return Reference(resid, _rows(reference.coef, rows), _rows(reference.embed, rows))


def check_lengths(batch: dict) -> None:
    """Clean and corrupted prompts of the same token length (the edges act position by position)."""
    if batch["clean_ids"].shape != batch["corrupt_ids"].shape:
        raise ValueError(
            f"clean_ids {tuple(batch['clean_ids'].shape)} and corrupt_ids {tuple(batch['corrupt_ids'].shape)} differ:"
            " edge ablation patches position by position and needs prompts of the same token length"
        )
