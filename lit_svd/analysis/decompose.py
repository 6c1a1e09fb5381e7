"""Exact decomposition of a read of the residual stream into the writes of every upstream node.

A *read* is a linear functional of what one norm hands its reader: a coefficient ``w * (r . [1, x^])`` of the
augmented normalised input ``[1, x^]`` (``x^ = view.normalized(point, layer, resid)``, the input the folded
weights act on) at one prompt and position. Every reader of the project is one or a sum of such rows:

* a QK singular direction ``k`` of a head (SAD's basis ``u_k`` of ``Omega(0)``, ``analysis/sad.py``): its score
  term ``t_k(d, s) = f_q(d) f_k(s) (x~_d . u_k)(rope(u_k^T A_q, d) . rope(x~_s A_k, s))`` is linear in the query
  input ``x~_d`` with the key side held at its clean value (``side="query"``) and linear in the key input ``x~_s``
  with the query side held (``side="key"``; the relative rotation ``R_s R_d^T`` goes into the key-side read
  vector ``A_k R_s rope(u_k^T A_q, d)^T``, so rotary models stay exact); ``relative=True`` reads SAD's
  ``c_k(d, s) = t_k(d, s) - mean_{s' != s visible} t_k(d, s')`` instead (key side: one row per visible source);
* a head's OV input direction ``k``: ``sigma_k [1, x^_s] u_k = value_s . (W_O v_k)`` at a source, or mixed by the
  clean pattern (``mix=True``): ``z_h(d) W_O v_k``, what the head writes along ``v_k`` at ``d``;
* an MLP input direction ``k`` (``mlp_in`` / ``mlp_gate``): ``sigma_k [1, x^] u_k``, the pre-activation along ``v_k``;
* a weighted sum of logits (``logit_reads``; e.g. the logit difference), read through the final norm.

**Frozen scales (what makes the split linear).** A norm divides the residual by its per-token RMS,
``x^ = centred(resid) * f`` with ``f = view.norm_factor(...)``; that factor is held at its value on the clean run,
so ``r . [1, x^] = r_0 + f * (r_centred . resid)`` is linear in the residual. Likewise held at their clean values:
Gemma's post-attention / post-MLP norm factors (a sub-layer's write into the residual is ``out * f_post * gain``),
Gemma-3's per-token, per-head query / key norm factors ``f_q``, ``f_k``, the attention pattern of a mixed OV read,
and the other side of a QK term. The residual a reader sees is the sum of the writes before it: the embedding,
and for every earlier sub-layer (GPT-NeoX's parallel residual: the MLP reads the block input, so it sees no
write of its own layer; sequential blocks: the MLP sees its layer's attention)

* each head's write ``z_h W_O[h] = sum_k ((z_h - b_V[h]) W_O[h] v_k) v_k + b_V[h] W_O[h]``, split over the head's
  OV singular directions (``v_k`` of ``[b_V; W_V] W_O``, which span ``W_O[h]``'s rows) and its ``b_V`` node;
* the layer's ``b_O``;
* the MLP's write ``hidden W_out = sum_k (hidden W_out v_k) v_k`` over the output singular directions of
  ``[b_out; W_out]``, and its ``b_out``;

and the read's own bias coordinate ``r_0`` splits into the map's bias (``b_Q``, ``b_K``, ``b_V``, ``b_in``,
``b_gate``, ``b_U`` rows of the augmented matrices) and, for LayerNorm models, the norm's bias folded into it
(``attn_norm_bias``, ``mlp_norm_bias``, ``final_norm_bias``). The pieces sum to the read exactly (float rounding
only): ``Split.values.sum(-1) == Split.total``, and ``Split.total`` is the model's own coefficient (tests compare it
with the hooked HF forward).

Cost: one reader's split over all upstream nodes is one product ``[rows, d_model] @ [d_model, nodes]`` plus the
nodes' coefficients at the read's positions, computed once per row from the cache (``z``, ``mlp_hidden``): about
a forward's work for a batch of prompts, whatever the number of upstream writers (``bench/decompose_bench.py``).
Needs ``fold_norms=True`` views.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from jaxtyping import Float, Int, Shaped
from torch import Tensor

from lit_svd.addresses import EMBED_LAYER, Address
from lit_svd.analysis.sad import causal_visibility
from lit_svd.choices import check_choice
from lit_svd.linalg import SVD, svd_dense, svd_factored
from lit_svd.models.base import ModelView, augment_inputs
from lit_svd.models.points import ActivationCache, Point

ReadPoint = Literal["attn", "mlp", "final"]
Side = Literal["query", "key"]


@dataclass
class Reads:
    """Rows of linear reads of one norm's output (``point`` of ``layer``; ``final``: layer None).

    Row ``i`` reads ``weight[i] * vector[i] . [1, x^(batch[i], position[i])]``; rows with the same ``reader``
    index sum into that reader's coefficient. ``own_bias[i]``: the part of ``vector[i, 0]`` that is the map's
    own bias (the rest is the LayerNorm bias folded into it). Per reader: ``addresses`` (what is read; None
    for logit reads), ``bias`` (the node its bias coordinate belongs to) and ``info`` (columns such as
    ``batch``, ``dest``, ``src``, ``direction``, one entry per reader). ``basis`` / ``coords``: the vectors in a
    ``c``-dimensional factored form (a head's key or value map), which the split uses to project every writer
    once onto the ``c`` columns instead of once per row (``c << d_model``).
    """

    point: ReadPoint
    layer: int | None
    batch: Int[Tensor, " R"]
    position: Int[Tensor, " R"]
    vector: Float[Tensor, "R d_model+1"]
    weight: Float[Tensor, " R"]
    reader: Int[Tensor, " R"]  # 0 .. n_readers - 1
    own_bias: Float[Tensor, " R"]
    bias: list[Address]  # [n_readers]
    addresses: list[Address] | None = None  # [n_readers]
    info: dict[str, Tensor] = field(default_factory=dict)
    basis: Float[Tensor, "d_model+1 c"] | None = None  # when every vector is ``coords @ basis.T`` (a head's map)
    coords: Float[Tensor, "R c"] | None = None

    @property
    def n_readers(self) -> int:
        return len(self.bias)


@dataclass
class Split:
    """``values[j, n]``: the contribution of node ``nodes[n]`` to reader ``j``'s coefficient ``total[j]``
    (``values.sum(-1) == total`` up to float rounding). ``readers`` / ``info`` as the ``Reads``'."""

    nodes: list[Address]
    values: Float[Tensor, "n_readers n_nodes"]
    total: Float[Tensor, " n_readers"]
    readers: list[Address] | None = None
    info: dict[str, Tensor] = field(default_factory=dict)

    def residual(self) -> Float[Tensor, " n_readers"]:
        """``total - sum of the pieces`` per reader (float rounding only)."""
        return self.total - self.values.sum(-1)

    def merge(self, unit: Callable[[Address], Address]) -> Split:
        """The same split over coarser nodes: ``unit(node)`` (e.g. its block, ``Address.block``, or its whole
        head, ``Address.whole``) collects every node it maps to the same address (contributions add)."""
        merged = [unit(n) for n in self.nodes]
        position = {m: i for i, m in enumerate(dict.fromkeys(merged))}
        order = list(position)
        index = torch.tensor([position[m] for m in merged], device=self.values.device)
        values = torch.zeros(self.values.shape[0], len(order), dtype=self.values.dtype, device=self.values.device)
        return Split(order, values.index_add_(1, index, self.values), self.total, self.readers, self.info)

    def top(self, reader: int, k: int = 10) -> list[tuple[Address, float]]:
        """The ``k`` nodes of largest |contribution| to ``reader``, with their signed contributions."""
        row = self.values[reader]
        idx = row.abs().topk(min(k, len(self.nodes))).indices.tolist()
        return [(self.nodes[i], float(row[i])) for i in idx]


@dataclass
class LayerWriters:
    """One layer's writer bases in the compute dtype: OV ``V [H, d, K]`` and ``read = W_O V [H, d_head, K]``
    (``z_h - b_V`` to coefficients), ``bv_write = b_V W_O [H, d]``, ``b_O [d]``; MLP ``mlp_V [d, Km]``,
    ``mlp_read = W_out V [d_mlp, Km]``, ``b_out [d]``; Gemma post-norm gains (None elsewhere)."""

    ov_S: Tensor
    ov_U: Tensor
    ov_V: Tensor
    read: Tensor
    b_V: Tensor
    bv_write: Tensor
    b_O: Tensor
    mlp_V: Tensor
    mlp_read: Tensor
    b_out: Tensor
    attn_gain: Tensor | None
    mlp_gain: Tensor | None


class Decomposer:
    """Splits reads of the residual stream of one model into the contributions of every upstream node.

    Build once per model (the SVDs of every layer's OV and MLP output maps, in float64), run the model once per
    batch with ``view.run_with_cache(decomposer.points(), ids, mask)``, then ``split(cache, reads)`` for any
    reads (``qk_reads``, ``ov_reads``, ``mlp_reads``, ``logit_reads``).

    Args:
        view: a ``fold_norms=True`` view.
        dtype: the compute dtype of the split (float64: exact to float rounding of the cached activations).
    """

    def __init__(self, view: ModelView, dtype: torch.dtype = torch.float64):
        if not view.fold_norms:
            raise ValueError("the decomposition needs a view with fold_norms=True (weights acting on the norm output)")
        self.view, self.dtype = view, dtype
        self.raw = view.unfolded()
        self.layers = [self._layer(l) for l in range(view.n_layers)]
        self.nodes: list[Address] = [Address(EMBED_LAYER, "embed")]
        self.offsets: dict[tuple[int, str], int] = {}
        blocks = []
        for l, w in enumerate(self.layers):
            H, _, K = w.ov_V.shape
            self.offsets[l, "attn"] = len(self.nodes) - 1  # column offsets of the writer matrix (embed apart)
            self.nodes += [Address(l, "ov", h, k) for h in range(H) for k in range(K)]
            self.nodes += [Address(l, "b_V", h) for h in range(H)] + [Address(l, "b_O")]
            attn = torch.cat([w.ov_V.permute(0, 2, 1).reshape(H * K, -1), w.bv_write, w.b_O[None]])
            self.offsets[l, "mlp"] = len(self.nodes) - 1
            self.nodes += [Address(l, "mlp_out", 0, k) for k in range(w.mlp_V.shape[1])] + [Address(l, "b_out")]
            mlp = torch.cat([w.mlp_V.T, w.b_out[None]])
            blocks += [
                attn if w.attn_gain is None else attn * w.attn_gain,
                mlp if w.mlp_gain is None else mlp * w.mlp_gain,
            ]
        self.writers = torch.cat(blocks)  # [N, d]: each writer node's vector in the residual (post-norm gain applied)
        self.offsets[view.n_layers, "attn"] = self.writers.shape[0]
        self._read_bases: dict[tuple[str, int], tuple] = {}

    @torch.no_grad()
    def _layer(self, l: int) -> LayerWriters:
        v, dt = self.view, self.dtype
        fm, w = v.ov(l), v.attn(l)
        svd = svd_factored(fm.A.double(), fm.B.double()).to(dt)
        W_O = w.W_O.to(dt)
        mlp = svd_dense(v.mlp_out(l).double()).to(dt)
        m = v.mlp(l)
        post = [v.post_norm_affine(p, l) for p in ("attn", "mlp")]
        return LayerWriters(
            ov_S=svd.S,
            ov_U=svd.U,
            ov_V=svd.V,
            read=W_O @ svd.V,
            b_V=w.b_V.to(dt),
            bv_write=torch.einsum("hc,hcd->hd", w.b_V.to(dt), W_O),
            b_O=w.b_O.to(dt),
            mlp_V=mlp.V,
            mlp_read=m.W_out.to(dt) @ mlp.V,
            b_out=m.b_out.to(dt),
            attn_gain=None if post[0] is None else post[0].scale.to(dt),
            mlp_gain=None if post[1] is None else post[1].scale.to(dt),
        )

    # --- what the cache must hold -----------------------------------------------------------
    def points(self, mix: bool = False) -> list[Point]:
        """The activation points ``split`` and the read constructors use (``mix``: with the pattern)."""
        v = self.view
        names = ["z", "mlp_hidden", "attn_normalized", "attn_factor", "mlp_normalized", "mlp_factor"]
        if v.post_norm_module("attn", 0) is not None:
            names += ["attn_post_factor", "mlp_post_factor"]
        if mix:
            names.append("pattern")
        per_layer = [Point(n, l) for n in names for l in range(v.n_layers)]
        return [Point("embed"), *per_layer, Point("final_normalized"), Point("final_factor")]

    # --- writers ------------------------------------------------------------------------------
    def upstream(self, point: ReadPoint, layer: int | None) -> int:
        """How many writer columns (in ``self.nodes[1:]`` order) lie upstream of a read of ``point``."""
        if point == "final":
            return self.writers.shape[0]
        v = self.view
        if layer is None:
            raise ValueError(f"point={point!r} is read inside a block: give its layer")
        v.check_layer(layer)
        if point == "mlp" and not v.parallel_residual:
            return self.offsets[layer, "mlp"]
        return self.offsets[layer, "attn"]

    def coefficients(self, cache: ActivationCache, batch: Tensor, position: Tensor, n_up: int | None = None) -> Tensor:
        """``[R, n_up]``: each writer node's coefficient at rows ``(batch, position)`` (its write there is
        ``coefficient * writers[node]``): OV ``(z_h - b_V) W_O v_k``, MLP ``hidden W_out v_k``, 1 for a bias,
        times Gemma's post-norm factor of the row."""
        n_up = self.writers.shape[0] if n_up is None else n_up
        out, done = [], 0
        for l, w in enumerate(self.layers):
            if done >= n_up:
                break
            z = cache["z", l][batch, position].to(self.dtype) - w.b_V  # [R, H, d_head]
            ones = torch.ones(len(batch), w.b_V.shape[0] + 1, dtype=self.dtype, device=z.device)
            attn = torch.cat([torch.einsum("rhc,hck->rhk", z, w.read).flatten(1), ones], 1)
            hidden = cache["mlp_hidden", l][batch, position].to(self.dtype)
            mlp = torch.cat([hidden @ w.mlp_read, ones[:, :1]], 1)
            if w.attn_gain is not None:
                attn = attn * cache["attn_post_factor", l][batch, position].to(self.dtype)
                mlp = mlp * cache["mlp_post_factor", l][batch, position].to(self.dtype)
            out += [attn, mlp]
            done += attn.shape[1] + mlp.shape[1]
        if not out:  # layer 0's attention: only the embedding is upstream
            return torch.zeros(len(batch), 0, dtype=self.dtype, device=batch.device)
        return torch.cat(out, 1)[:, :n_up]

    # --- the split ----------------------------------------------------------------------------
    @torch.no_grad()
    def coefficient_table(self, cache: ActivationCache) -> Tensor:
        """``[B, T, n_writers]``: every writer node's coefficient at every position of the cached batch
        (``coefficients`` of all rows at once); pass it to ``split(..., table=)`` when many reads share a batch."""
        B, T = cache["embed"].shape[:2]
        b, t = torch.meshgrid(torch.arange(B), torch.arange(T), indexing="ij")
        dev = cache["embed"].device
        return self.coefficients(cache, b.reshape(-1).to(dev), t.reshape(-1).to(dev)).reshape(B, T, -1)

    def split(
        self,
        cache: ActivationCache,
        reads: Reads,
        max_elements: int = 1 << 24,
        max_bytes: int = 1 << 31,
        table: Tensor | None = None,
    ) -> Split:
        """Every upstream node's contribution to every reader of ``reads`` (module docstring), dense
        ``[n_readers, n_nodes]`` (at most ``max_bytes``; one-line error beyond). Rows are processed in chunks of
        at most ``max_elements`` products. ``table``: ``coefficient_table(cache)``, if already at hand."""
        v, dt = self.view, self.dtype
        n_up = self.upstream(reads.point, reads.layer)
        layer = reads.layer
        rows = torch.stack([reads.batch, reads.position], 1)
        uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)
        if table is None:
            coef = self.coefficients(cache, uniq[:, 0], uniq[:, 1], n_up)  # [U, n_up]
        else:
            coef = table[uniq[:, 0], uniq[:, 1], :n_up].to(dt)
        embed = cache["embed"][uniq[:, 0], uniq[:, 1]].to(dt)  # [U, d]
        factor = cache[f"{reads.point}_factor", layer][reads.batch, reads.position, 0].to(dt)  # [R]
        r = reads.vector[:, 1:].to(dt)
        if v.norm_kind == "layernorm":
            r = r - r.mean(-1, keepdim=True)  # r . centred(x) = centred(r) . x
        scale = reads.weight.to(dt) * factor  # [R]
        biases = list(dict.fromkeys(reads.bias))
        norm_bias = [] if v.norm_kind != "layernorm" else [_norm_bias_node(reads.point, layer, v.n_layers)]
        nodes = [self.nodes[0], *self.nodes[1 : 1 + n_up], *biases, *norm_bias]
        size = reads.n_readers * len(nodes) * torch.finfo(dt).bits // 8
        if size > max_bytes:
            raise ValueError(
                f"split: {reads.n_readers} readers x {len(nodes)} nodes would take {size / 2**30:.1f} GiB"
                f" (max_bytes={max_bytes / 2**30:.1f} GiB); split fewer readers (directions, positions) at a time"
            )
        values = torch.zeros(reads.n_readers, len(nodes), dtype=dt, device=r.device)
        W = self.writers[:n_up]
        lhs, G = r, W.T  # [R, k] @ [k, n_up]: every row's read of every writer
        if (
            reads.basis is not None and reads.coords is not None and reads.basis.shape[1] < r.shape[1]
        ):  # factored: project the writers once
            cb = reads.basis[1:].to(dt)
            cb = cb - cb.mean(0, keepdim=True) if v.norm_kind == "layernorm" else cb
            lhs, G = reads.coords.to(dt), cb.T @ W.T
        chunk = max(1, max_elements // max(n_up, 1))
        for start in range(0, len(r), chunk):
            sl = slice(start, start + chunk)
            part = torch.cat([(r[sl] * embed[inverse[sl]]).sum(-1, keepdim=True), (lhs[sl] @ G) * coef[inverse[sl]]], 1)
            values[:, : 1 + n_up].index_add_(0, reads.reader[sl], part * scale[sl, None])
        weight = reads.weight.to(dt)
        where = {b: 1 + n_up + i for i, b in enumerate(biases)}
        col = torch.tensor([where[b] for b in reads.bias], device=r.device)
        own = torch.zeros(reads.n_readers, dtype=dt, device=r.device).index_add_(
            0, reads.reader, weight * reads.own_bias.to(dt)
        )
        values[torch.arange(reads.n_readers, device=r.device), col] += own
        if norm_bias:
            rest = weight * (reads.vector[:, 0].to(dt) - reads.own_bias.to(dt))
            values[:, -1] = torch.zeros_like(own).index_add_(0, reads.reader, rest)
        x = augment_inputs(cache[f"{reads.point}_normalized", layer][reads.batch, reads.position].to(dt))
        total = torch.zeros_like(own).index_add_(0, reads.reader, weight * (reads.vector.to(dt) * x).sum(-1))
        return Split(nodes, values, total, reads.addresses, reads.info)

    # --- read bases ---------------------------------------------------------------------------
    def qk_basis(self, layer: int) -> tuple[Tensor, Tensor, SVD, Tensor, Tensor]:
        """``(A_q, A_k, U, S, V, raw bias rows of A_q and A_k)`` of ``layer``'s heads: SAD's basis (the SVD of
        ``Omega(0) = A_q A_k^T``, float64)."""
        key = ("qk", layer)
        if key not in self._read_bases:
            fm, raw = self.view.qk_unrotated(layer), self.raw.qk_unrotated(layer)
            A_q, A_k = fm.A.to(self.dtype), fm.B.to(self.dtype)
            svd = svd_factored(fm.A.double(), fm.B.double()).to(self.dtype)
            self._read_bases[key] = (A_q, A_k, svd, raw.A[:, 0].to(self.dtype), raw.B[:, 0].to(self.dtype))
        return self._read_bases[key]

    def mlp_basis(self, layer: int, kind: str) -> tuple[SVD, Tensor]:
        """``(SVD of the augmented mlp_in / mlp_gate map, its raw bias row)`` of ``layer``."""
        key = (kind, layer)
        if key not in self._read_bases:
            if kind not in ("mlp_in", "mlp_gate"):
                raise ValueError(f"MLP reads are of mlp_in or mlp_gate; got {kind!r}")
            folded = getattr(self.view, kind)(layer)
            raw = getattr(self.raw, kind)(layer)
            self._read_bases[key] = (svd_dense(folded.double()).to(self.dtype), raw[0].to(self.dtype))
        return self._read_bases[key]


def _norm_bias_node(point: ReadPoint, layer: int | None, n_layers: int) -> Address:
    if point == "final":
        return Address(n_layers, "final_norm_bias")
    if layer is None:
        raise ValueError(f"point={point!r} is read inside a block: give its layer")
    return Address(layer, f"{point}_norm_bias")


def _directions(directions: Sequence[int] | Tensor | None, K: int, device: torch.device) -> Tensor:
    d = torch.arange(K) if directions is None else torch.as_tensor(directions, dtype=torch.long).reshape(-1)
    if len(d) and (d.min() < 0 or d.max() >= K):
        raise IndexError(f"directions {d.tolist()} out of range 0..{K - 1}")
    return d.to(device)


def _as_long(*ts: Tensor | Sequence[int]) -> list[Tensor]:
    return [torch.as_tensor(t, dtype=torch.long).reshape(-1) for t in ts]


@torch.no_grad()
def qk_reads(
    dec: Decomposer,
    cache: ActivationCache,
    layer: int,
    head: int,
    batch: Int[Tensor, " P"] | Sequence[int],
    dest: Int[Tensor, " P"] | Sequence[int],
    src: Int[Tensor, " P"] | Sequence[int],
    attention_mask: Shaped[Tensor, "B T"],
    directions: Sequence[int] | Tensor | None = None,
    side: Side = "query",
    relative: bool = False,
) -> Reads:
    """The QK score terms of ``head`` of ``layer`` for the pairs ``(batch[p], dest[p], src[p])``, one reader per
    pair and direction (pair-major; ``info``: ``batch``, ``dest``, ``src``, ``direction``), read on the query
    side (rows at ``dest``) or the key side (rows at ``src``; ``relative``: at every visible source). The
    reader's coefficient is ``t_k(d, s)`` (``relative``: ``c_k(d, s)``), as ``analysis.sad.direction_terms``.
    ``attention_mask``: the batch's ``[B, T]`` mask (the visible sources of ``relative``)."""
    v, dt = dec.view, dec.dtype
    check_choice("side", side, Side)
    v.check_head(head)
    batch, dest, src = _as_long(batch, dest, src)
    A_q, A_k, svd, raw_q, raw_k = dec.qk_basis(layer)
    A_q, A_k, U, S, V = A_q[head], A_k[head], svd.U[head], svd.S[head], svd.V[head]
    ks = _directions(directions, U.shape[-1], U.device)
    x = augment_inputs(cache["attn_normalized", layer].to(dt))  # [B, T, D]
    B, T, D = x.shape
    P, K = len(batch), len(ks)
    vis = causal_visibility(attention_mask.to(x.device), v.window(layer))[batch.to(x.device), dest.to(x.device)]
    if not vis[torch.arange(P, device=x.device), src.to(x.device)].all():
        raise ValueError(f"qk_reads: some pairs' source is not visible from the destination at layer {layer}")
    f = v.qk_factors(layer, cache["attn_normalized", layer].to(dt))
    dev = x.device
    batch, dest, src = batch.to(dev), dest.to(dev), src.to(dev)
    f_q = torch.ones(P, dtype=dt, device=dev) if f is None else f[0][batch, head, dest].to(dt)  # [P]
    f_k = torch.ones(P, T, dtype=dt, device=dev) if f is None else f[1][batch, head].to(dt)  # [P, T]
    Pk = U[:, ks].T @ A_q  # [K, d_head]: each direction as a query vector
    R = v.rotary_matrices(torch.arange(T), layer).to(dt) if v.rotary_dim else None  # [T, dh, dh]
    Pd = Pk.expand(P, -1, -1) if R is None else torch.einsum("kc,pcj->pkj", Pk, R[dest])  # [P, K, dh]
    keys = x[batch] @ A_k  # [P, T, dh]
    if R is not None:
        keys = torch.einsum("ptc,tcj->ptj", keys, R)
    b = torch.einsum("pkc,ptc->pkt", Pd, keys) * f_k[:, None]  # key side with its factor, every source
    a = x[batch, dest] @ U[:, ks]  # [P, K]
    n = vis.sum(-1, keepdim=True).to(dt)  # [P, 1]
    onehot = torch.zeros(P, T, dtype=dt, device=dev).scatter_(1, src[:, None], 1.0)
    if relative:
        if (n < 2).any():
            raise ValueError("qk_reads(relative=True): every destination needs at least two visible sources")
        src_w = torch.where(vis, onehot - (1 - onehot) / (n - 1), torch.zeros((), dtype=dt))  # [P, T]
    else:
        src_w = onehot
    reader = torch.arange(P * K, device=dev).reshape(P, K)
    info = {
        "batch": batch.repeat_interleave(K),
        "dest": dest.repeat_interleave(K),
        "src": src.repeat_interleave(K),
        "direction": ks.repeat(P),
    }
    addresses = [Address(layer, "qk", head, int(k)) for _ in range(P) for k in ks.tolist()]
    if side == "query":
        vec = U[:, ks].T.expand(P, -1, -1).reshape(P * K, D)
        weight = (f_q[:, None] * (b * src_w[:, None]).sum(-1)).reshape(-1)
        own = _query_own_bias(A_k, U, V, S, raw_q[head], ks).expand(P, -1).reshape(-1)
        return Reads(
            "attn",
            layer,
            batch.repeat_interleave(K),
            dest.repeat_interleave(K),
            vec,
            weight,
            reader.reshape(-1),
            own,
            [Address(layer, "b_Q", head)] * (P * K),
            addresses,
            info,
        )
    # key side: rows at every source with a non-zero weight
    ys = Pd[:, :, None, :] if R is None else torch.einsum("tcj,pkj->pktc", R, Pd)  # [P, K, T or 1, dh]
    ys = ys.expand(P, K, T, -1)
    pi, ki, ti = torch.nonzero((src_w != 0)[:, None, :].expand(P, K, T), as_tuple=True)
    y = ys[pi, ki, ti]  # [R, dh]: the key-space vector each row's key is dotted with
    weight = f_q[pi] * a[pi, ki] * f_k[pi, ti] * src_w[pi, ti]
    return Reads(
        "attn",
        layer,
        batch[pi],
        ti,
        y @ A_k.T,
        weight,
        reader[pi, ki],
        y @ raw_k[head],
        [Address(layer, "b_K", head)] * (P * K),
        addresses,
        info,
        A_k,
        y,
    )


def _query_own_bias(A_k: Tensor, U: Tensor, V: Tensor, S: Tensor, raw_row: Tensor, ks: Tensor) -> Tensor:
    """``[K]``: the map's own bias part of ``u_k[0]``: with ``u_k = A_q y_k``, ``y_k = A_k^T v_k / sigma_k``, it is
    ``raw_b_Q . y_k`` (the rest of ``u_k[0] = A_q[0] . y_k`` is the folded LayerNorm bias). Directions past the
    numerical rank (sigma ~ 0, no defined ``y_k``) give their whole bias coordinate to the map's bias."""
    Sk = S[ks]
    ok = Sk > Sk.new_tensor(S.shape[-1] * torch.finfo(S.dtype).eps) * S[0]
    y = (A_k.T @ V[:, ks]) / torch.where(ok, Sk, torch.ones_like(Sk))
    return torch.where(ok, raw_row @ y, U[0, ks])


@torch.no_grad()
def ov_reads(
    dec: Decomposer,
    cache: ActivationCache,
    layer: int,
    head: int,
    batch: Int[Tensor, " P"] | Sequence[int],
    position: Int[Tensor, " P"] | Sequence[int],
    directions: Sequence[int] | Tensor | None = None,
    mix: bool = False,
) -> Reads:
    """OV input directions of ``head`` of ``layer`` at ``(batch[p], position[p])``, one reader per position and
    direction (position-major; ``info``: ``batch``, ``position``, ``direction``): ``sigma_k [1, x^] u_k``, the
    value along ``W_O v_k`` at that source; ``mix``: the head's mixed coefficient ``z_h W_O v_k`` at that
    destination, rows over every source weighted by the clean pattern (the cache needs ``pattern``)."""
    v, dt = dec.view, dec.dtype
    v.check_head(head)
    batch, position = _as_long(batch, position)
    w = dec.layers[v.check_layer(layer)]
    dev = w.ov_S.device
    batch, position = batch.to(dev), position.to(dev)
    ks = _directions(directions, w.ov_S.shape[-1], dev)
    P, K = len(batch), len(ks)
    vec = (w.ov_U[head][:, ks] * w.ov_S[head][ks]).T  # [K, D]: sigma_k u_k
    raw_bv = dec.raw.ov(layer).A[head, 0].to(dt)
    own = raw_bv @ w.read[head][:, ks]  # [K]: raw b_V . W_O v_k
    reader = torch.arange(P * K, device=dev).reshape(P, K)
    info = {"batch": batch.repeat_interleave(K), "position": position.repeat_interleave(K), "direction": ks.repeat(P)}
    addresses = [Address(layer, "ov", head, int(k)) for _ in range(P) for k in ks.tolist()]
    bias = [Address(layer, "b_V", head)] * (P * K)
    if not mix:
        rows_b, rows_p = batch.repeat_interleave(K), position.repeat_interleave(K)
        return Reads(
            "attn",
            layer,
            rows_b,
            rows_p,
            vec.repeat(P, 1),
            torch.ones(P * K, dtype=dt, device=dev),
            reader.reshape(-1),
            own.repeat(P),
            bias,
            addresses,
            info,
        )
    A = cache["pattern", layer][batch, head, position].to(dt)  # [P, T]
    pi, si = torch.nonzero(A != 0, as_tuple=True)
    pi, ki = pi.repeat_interleave(K), torch.arange(K, device=dev).repeat(len(si))
    si = si.repeat_interleave(K)
    coords = w.read[head][:, ks].T  # sigma_k u_k = [b_V; W_V] (W_O v_k): the value map times these
    value_map = dec.view.ov(layer).A[head].to(dt)
    return Reads(
        "attn",
        layer,
        batch[pi],
        si,
        vec[ki],
        A[pi, si],
        reader[pi, ki],
        own[ki],
        bias,
        addresses,
        info,
        value_map,
        coords[ki],
    )


@torch.no_grad()
def mlp_reads(
    dec: Decomposer,
    cache: ActivationCache,
    layer: int,
    batch: Int[Tensor, " P"],
    position: Int[Tensor, " P"],
    directions: Sequence[int] | Tensor | None = None,
    kind: Literal["mlp_in", "mlp_gate"] = "mlp_in",
) -> Reads:
    """MLP input directions (``mlp_in``: the (up) map; ``mlp_gate``: the gate of a gated MLP) of ``layer`` at
    ``(batch[p], position[p])``: ``sigma_k [1, x^] u_k``, the pre-activation along ``v_k``; one reader per position
    and direction (position-major; ``info``: ``batch``, ``position``, ``direction``)."""
    svd, raw_row = dec.mlp_basis(dec.view.check_layer(layer), kind)
    batch, position = _as_long(batch, position)
    dev = svd.S.device
    batch, position = batch.to(dev), position.to(dev)
    ks = _directions(directions, svd.S.shape[-1], dev)
    P, K = len(batch), len(ks)
    vec = (svd.U[:, ks] * svd.S[ks]).T
    own = raw_row @ svd.V[:, ks]
    info = {"batch": batch.repeat_interleave(K), "position": position.repeat_interleave(K), "direction": ks.repeat(P)}
    bias = Address(layer, "b_in" if kind == "mlp_in" else "b_gate")
    return Reads(
        "mlp",
        layer,
        batch.repeat_interleave(K),
        position.repeat_interleave(K),
        vec.repeat(P, 1),
        torch.ones(P * K, dtype=dec.dtype, device=dev),
        torch.arange(P * K, device=dev),
        own.repeat(P),
        [bias] * (P * K),
        [Address(layer, kind, 0, int(k)) for _ in range(P) for k in ks.tolist()],
        info,
    )


@torch.no_grad()
def logit_reads(
    dec: Decomposer,
    cache: ActivationCache,
    batch: Int[Tensor, " P"],
    position: Int[Tensor, " P"],
    logit_weights: Float[Tensor, "P vocab"],
) -> Reads:
    """One reader per row: ``sum_v logit_weights[p, v] * logit_v`` at ``(batch[p], position[p])`` (logits before
    Gemma-2's final soft-cap), read through the final norm; e.g. ``TaskScorer.logit_weights`` (the logit
    difference: +1 on the answer, -1 on the wrong token)."""
    v, dt = dec.view, dec.dtype
    batch, position = _as_long(batch, position)
    W_U, b_U = v.unembed()
    batch, position = batch.to(W_U.device), position.to(W_U.device)
    _, raw_b = dec.raw.unembed()
    wts = logit_weights.to(W_U.device, dt)[:, : W_U.shape[1]]
    vec = torch.cat([(wts @ b_U.to(dt))[:, None], wts @ W_U.to(dt).T], 1)
    P = len(batch)
    return Reads(
        "final",
        None,
        batch,
        position,
        vec,
        torch.ones(P, dtype=dt, device=W_U.device),
        torch.arange(P, device=W_U.device),
        wts @ raw_b.to(dt),
        [Address(v.n_layers, "b_U")] * P,
        None,
        {"batch": batch, "position": position},
    )
