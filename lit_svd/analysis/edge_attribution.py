"""Edge attribution with integrated gradients (EAP-IG, MIB's best-ranked edge method) for the edge universe of
``analysis.edges`` at every level (docs/circuits.md, "Edge circuits").

**Direction edges.** The score of the edge from writer direction ``j`` to reader direction ``k`` (of reader unit
``u``) is the writer's clean-minus-corrupted change along the reader's read vector times the metric's gradient with
respect to the reader's coefficient, summed over positions, averaged over the prompts and over the interpolation
steps:

    s(j -> k) = mean_prompts sum_p mean_alpha f_u(p; alpha) dm/dc_k(p; alpha) G_kj (c_j(p; clean) - c_j(p; corrupt))

``G_kj = r_k . W_j`` (the read vector on the residual, LayerNorm: centred, times the writer's write), ``f_u`` the
unit's norm factor in the interpolated forward: the first-order effect of that one edge under the edge ablation
(``analysis.edge_ablation``: a direction edge moves its reader's coefficient through the unit's factor, which one
direction edge alone leaves as it is). The embedding's edge uses its whole clean-minus-corrupted write. The logits
are one reader that reads the residual through the final norm: their edges use the gradient at the final norm's
input (the norm's own derivative included).

**Interpolation (MIB's EAP-IG-inputs).** Step ``i = 0 .. steps - 1`` runs the clean prompts with the embedding
(the residual entering block 0) at ``corrupted + (i / steps) (clean - corrupted)`` and takes one backward for the
gradient at every reader's coefficient at once (zero offsets added at the sites, ``dm/d offset``); the writers'
changes come from one clean and one corrupted run (``EdgeAblation.record``). MIB's convention: ``steps = 5``, the
clean end not included.

**Head-level edges (the anchor).** The score of writer unit ``U`` into reader unit ``u`` is the gradient of the
metric at ``u``'s *input residual* (the norm's derivative included: a block dropped whole changes the unit's
factor, ``edge_ablation``) dotted with ``U``'s clean-minus-corrupted write: MIB's EAP-IG on heads and MLPs, computed
on the same forward and backward passes. It equals the sum of the block's direction edge scores plus the norm's
part ``-(f^3 / d) (gamma . y) (y_c . Delta_U)`` with ``gamma = sum_k dm/dc_k r_k``. Reader-direction x writer-unit
edges are the sums of direction edges over the writer unit. Scores are signed (positive: the clean edge raises the
metric); the absolute ranking uses ``|s|``.

Cost: ``steps`` forwards and backwards with offsets at every reader site, a clean and a corrupted recording; then,
per reader unit, ``G_u`` (``K x d x n_cols``) and ``A_u dc^T`` (``K x P x n_cols``) once over all prompts: the edge
count times ``d + P`` multiply-adds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_svd.analysis.edge_ablation import EdgeAblation, check_lengths
from lit_svd.analysis.edges import EdgeUniverse, ReaderUnit
from lit_svd.metrics import TaskScorer, forward_answer_logits, task_scorer
from lit_svd.models.hooks import Hook, first_input, hooks, output_tensor
from lit_svd.models.points import eager_attention

STEPS = 5  # MIB's EAP-IG default
ROWS = 128  # reader directions per product when the scores are formed


@dataclass
class BatchGradients:
    """One batch's share of the attribution: per reader unit ``A[u] [K, P]`` (``mean_alpha f dm/dc``, summed later
    against ``dc``), the logits' gradient ``g_final [P, d]``, the writers' ``dc [P, n_cols]`` (clean - corrupted
    coefficients) and the embedding's change ``d_embed [P, d]``, the head-level scores summed over this batch's
    prompts ``units [n_blocks]`` (float64) and the number of prompts."""

    A: dict[int, Tensor]
    g_final: Tensor
    dc: Tensor
    d_embed: Tensor
    units: Tensor
    prompts: int
    steps: int


class EdgeAttribution:
    """EAP-IG gradients of ``universe``'s readers on task batches (module docstring)."""

    def __init__(self, universe: EdgeUniverse, task: str | TaskScorer, steps: int = STEPS):
        if steps < 1:
            raise ValueError(f"steps={steps}: integrated gradients need at least 1 step")
        self.u, self.view, self.steps = universe, universe.view, steps
        self.task = task_scorer(task)
        self.ablation = EdgeAblation(universe, self.task)

    def writer_changes(self, batch: dict) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(dc [P, n_cols], d_embed [P, d], delta [n_units, P, d], corrupt_embed [P, d])``: clean - corrupted writer
        coefficients, the embedding's change, each writer unit's clean - corrupted write, the corrupted embedding."""
        clean, corrupt = self.ablation.record(batch, "clean_ids"), self.ablation.record(batch, "corrupt_ids")
        dc = clean.coef - corrupt.coef
        d_embed = clean.embed - corrupt.embed
        delta = torch.empty(len(self.u.writers), *d_embed.shape, dtype=d_embed.dtype, device=d_embed.device)
        delta[0] = d_embed
        for w in self.u.writers[1:]:
            cols = slice(w.offset, w.offset + w.size)
            torch.matmul(dc[:, cols], self.u.W[cols], out=delta[w.index])
        dc[:, 0] = 0.0  # the embedding has no coefficient: its edges use d_embed
        return dc, d_embed, delta, corrupt.embed

    def batch(self, batch: dict) -> BatchGradients:
        """The gradients of one batch over ``steps`` interpolation steps (module docstring)."""
        check_lengths(batch)
        u = self.u
        dc, d_embed, delta, corrupt_embed = self.writer_changes(batch)
        A: dict[int, Tensor] = {}
        g_final = torch.zeros_like(d_embed)
        units = torch.zeros(u.n_blocks, dtype=torch.float64, device=u.device)
        for i in range(self.steps):
            embed = corrupt_embed + (i / self.steps) * d_embed
            grads, inputs = self._step(batch, embed)
            g_final += grads.pop(u.readers[-1].index) / self.steps
            for (point, layer), y in inputs.items():
                if point not in ("attn", "mlp") or layer is None:
                    continue
                readers = u.reader_units("attn" if point == "attn" else "mlp", layer)
                f = self.view.norm_factor("attn" if point == "attn" else "mlp", layer, y)  # [P, 1]
                y_c = y - y.mean(-1, keepdim=True) if self.view.norm_kind == "layernorm" else y
                full = []
                for r in readers:
                    g = grads[r.index]
                    A[r.index] = A.get(r.index, 0) + (g * f).T / self.steps
                    gamma = g @ u.basis(r).Rc  # [P, d]: dm/dx^ through the directions, x^ = f y_c
                    full.append(f * gamma - f**3 / y.shape[-1] * (gamma * y_c).sum(-1, keepdim=True) * y_c)
                n_up = readers[0].n_up  # the units of one read point see the same writers
                got = torch.stack(full).reshape(len(readers), -1) @ delta[:n_up].reshape(n_up, -1).T
                for r, row in zip(readers, got.double() / self.steps):
                    units[int(u.block_offsets[r.index]) : int(u.block_offsets[r.index + 1])] += row
        logits = u.readers[-1]
        units[int(u.block_offsets[logits.index]) :] += torch.einsum("pd,npd->n", g_final, delta).double()
        return BatchGradients(A, g_final, dc, d_embed, units, len(batch["answer_pos"]), self.steps)

    def _step(self, batch: dict, embed: Tensor) -> tuple[dict[int, Tensor], dict[tuple[str, int | None], Tensor]]:
        """One forward and backward with the embedding at ``embed [P, d]``: ``dm/dc`` ``[P, K]`` per reader unit (the
        logits: ``dm/d resid [P, d]``) and each read point's input residual ``[P, d]``."""
        u, v = self.u, self.view
        B, T = batch["clean_ids"].shape
        P = B * T
        offsets = {
            r.index: torch.zeros(P, r.size if r.kind != "logits" else v.d_model, dtype=u.dtype, device=u.device)
            for r in u.readers
        }
        for t in offsets.values():
            t.requires_grad_(True)
        inputs: dict[tuple[str, int | None], Tensor] = {}
        specs = [
            Hook(v.block(0), _replace_input(embed.reshape(B, T, -1)), "pre"),
            Hook(v.norm_module("final", None), _offset_input(offsets[u.readers[-1].index], inputs), "pre"),
        ]
        for l in range(v.n_layers):
            specs += [
                Hook(v.norm_module("attn", l), _keep_resid(inputs, ("attn", l)), "pre"),
                Hook(v.norm_module("mlp", l), _keep_resid(inputs, ("mlp", l)), "pre"),
                Hook(v.attention_module(l), self._value_offsets(l, offsets), "post"),
            ]
            for site in ("q", "k", "up") + (("gate",) if v.gated_mlp else ()):
                specs.append(Hook(v.site_module(l, site), self._site_offsets(l, site, offsets), "post"))
        with torch.enable_grad(), eager_attention(v.model), hooks(*specs):
            logits = forward_answer_logits(v.model, batch["clean_ids"], batch["attention_mask"], batch["answer_pos"])
            metric = self.task.metric(logits, batch).sum()
            names = list(offsets)
            grads = torch.autograd.grad(metric, [offsets[n] for n in names], allow_unused=True)
        out = {n: torch.zeros_like(offsets[n]) if g is None else g.detach() for n, g in zip(names, grads)}
        return out, inputs

    def _site_offsets(self, layer: int, site: str, offsets: dict[int, Tensor]) -> Callable:
        u, v = self.u, self.view
        kind = {"q": "q", "k": "k", "up": "mlp", "gate": "mlp"}[site]
        units = [r for r in u.reader_units("mlp" if kind == "mlp" else "attn", layer) if r.kind == kind]

        def hook(module, args, kwargs, out):
            own = v.site_output(layer, site, out)
            B, T, width = own.shape
            if kind == "mlp":  # one unit: its mlp_in rows act on up, its mlp_gate rows on gate
                b = u.basis(units[0])
                half = slice(0, b.split) if site == "up" else slice(b.split, None)
                add = offsets[units[0].index][:, half] @ b.Y[half]
            else:  # one unit per head (q) or KV head (k), in order
                add = torch.cat([offsets[r.index] @ u.basis(r).Y for r in sorted(units, key=lambda r: r.group)], 1)
            return v.with_site_output(layer, site, out, own + add.reshape(B, T, width).to(own.dtype))

        return hook

    def _value_offsets(self, layer: int, offsets: dict[int, Tensor]) -> Callable:
        u = self.u
        units = [r for r in u.reader_units("attn", layer) if r.kind == "v"]

        def hook(module, args, kwargs, out):
            attn = output_tensor(out)
            pattern = output_tensor(out, 1)
            B, T, d = attn.shape
            add = torch.zeros(B * T, d, dtype=u.dtype, device=u.device)
            for r in units:
                change = offsets[r.index].reshape(B, T, -1)
                mixed = torch.einsum("bds,bsk->bdk", pattern[:, r.group].to(u.dtype), change)
                add = add + mixed.reshape(B * T, -1) @ u.basis(r).Y
            attn = attn + add.reshape(B, T, d).to(attn.dtype)
            return (attn, *out[1:]) if isinstance(out, tuple) else attn

        return hook


def _replace_input(new: Tensor) -> Callable:
    def pre(module, args, kwargs):
        new_ = new.to(first_input(args, kwargs).dtype)
        if args:
            return (new_, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": new_}

    return pre


def _keep_resid(store: dict, key: tuple) -> Callable:
    def pre(module, args, kwargs):
        x = first_input(args, kwargs)
        store[key] = x.detach().reshape(-1, x.shape[-1])

    return pre


def _offset_input(offset: Tensor, store: dict) -> Callable:
    def pre(module, args, kwargs):
        x = first_input(args, kwargs)
        store["final", None] = x.detach().reshape(-1, x.shape[-1])
        new = x + offset.reshape(x.shape).to(x.dtype)
        if args:
            return (new, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": new}

    return pre


@dataclass
class EdgeScores:
    """EAP-IG scores of every edge (module docstring), averaged over the prompts: ``directions(u)`` ``[K_u, n_cols]``
    per reader unit (held in ``store``), ``units`` ``[n_blocks]`` (float64, MIB's head-level edges, block order of
    ``EdgeUniverse.block_offsets``); ``writer_units(u)`` ``[K_u, n_up]`` sums a unit's direction scores per writer
    unit."""

    universe: EdgeUniverse
    store: Mapping[int, Tensor]
    units: Tensor
    prompts: int
    steps: int

    def directions(self, r: ReaderUnit) -> Tensor:
        return self.store[r.index]

    def writer_units(self, r: ReaderUnit) -> Tensor:
        u = self.universe
        S = self.directions(r)
        out = torch.zeros(S.shape[0], r.n_up, dtype=S.dtype, device=S.device)
        return out.index_add_(1, u.col_unit[: r.n_cols].to(S.device), S)


@torch.no_grad()
def edge_scores(
    universe: EdgeUniverse,
    parts: Sequence[BatchGradients],
    store: MutableMapping[int, Tensor] | None = None,
    gains: MutableMapping[int, Tensor] | None = None,
) -> EdgeScores:
    """Direction and head-level edge scores from the batches' gradients: per reader unit
    ``G_u * (A_u dc^T) / prompts`` over every prompt at once (module docstring). ``store``: where each unit's scores
    go (by reader unit index; default: a dict, in memory in the analysis dtype; ``edge_curves.ScoreFile``: a file).
    ``gains``: where each unit's gains ``G_u = Rc W^T`` ``[K, n_cols]`` go if given (the logits have none): the edge
    ablation's partial sums read them (``EdgeAblation(gains=...)``) instead of forming them per forward."""
    u = universe
    prompts = sum(p.prompts for p in parts)
    if prompts == 0:
        raise ValueError("edge attribution: no prompts")
    dc = torch.cat([p.dc for p in parts])  # [P, n_cols]
    d_embed = torch.cat([p.d_embed for p in parts])
    held: MutableMapping[int, Tensor] = {} if store is None else store
    for r in u.readers:
        n = r.n_cols
        if r.kind == "logits":
            g = torch.cat([p.g_final for p in parts])
            S = ((g @ u.W[:n].T) * dc[:, :n]).sum(0, keepdim=True)
            S[0, 0] = (g * d_embed).sum()
        else:
            A = torch.cat([p.A[r.index] for p in parts], 1)  # [K, P]
            Rc = u.basis(r).Rc
            S = torch.empty(r.size, n, dtype=A.dtype, device=A.device)
            G = None if gains is None else torch.empty_like(S)
            for i in range(0, r.size, ROWS):  # a few rows at a time: G_u and A_u dc^T are [K, n_cols] each
                rows = slice(i, i + ROWS)
                g = Rc[rows] @ u.W[:n].T
                if G is not None:
                    G[rows] = g
                torch.mul(g, A[rows] @ dc[:, :n], out=S[rows])
            if gains is not None and G is not None:
                gains[r.index] = G
            S[:, 0] = (A * (Rc @ d_embed.T)).sum(1)
        held[r.index] = S / prompts
    units = torch.stack([p.units for p in parts]).sum(0) / prompts
    return EdgeScores(u, held, units, prompts, parts[0].steps)


def attribute(
    universe: EdgeUniverse,
    batches: Iterable[dict],
    task: str | TaskScorer,
    steps: int = STEPS,
    store: MutableMapping[int, Tensor] | None = None,
    gains: MutableMapping[int, Tensor] | None = None,
) -> EdgeScores:
    """EAP-IG scores of every edge over ``batches`` (``EdgeAttribution.batch`` then ``edge_scores``)."""
    att = EdgeAttribution(universe, task, steps)
    return edge_scores(universe, [att.batch(b) for b in batches], store, gains)
