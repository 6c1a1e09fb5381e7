"""EAP-IG edge scores (``analysis/edge_attribution.py``) against central finite differences of the metric, on float64
tiny models of every architecture (RMSNorms in float64), 2 interpolation steps.

* a **direction edge** ``j -> k``: the metric summed over the prompts, at each step's interpolated embedding, with
  reader ``k``'s coefficient moved at every position by ``eps`` times the edge's change ``f(p) G_kj dc_j(p)`` (the
  unit's live norm factor, the read of the writer's write, the writer's clean - corrupted coefficient; the
  embedding: ``f(p) r_k . (embed_clean - embed_corrupt)(p)``), added at the reader's site by a hook; the logits:
  the final norm's input moved by ``eps W_j dc_j(p)``;
* a **head-level edge** ``U -> u``: the reader unit's input residual moved by ``eps`` times the writer unit's
  clean - corrupted write (captured from the clean and corrupted runs), read through the model's own norm and
  projection modules (the norm's derivative included);

``(m(+eps) - m(-eps)) / (2 eps)`` (HF's eager softmax computed in float64: ``exact_softmax``), averaged over the
steps and divided by the prompts, equals the score within ``1e-6`` of the largest |score| of its level. The
writer-unit scores are the direction scores' sums (and the logits' head-level scores too).
"""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.edge_attribution import EdgeAttribution, attribute
from lit_svd.analysis.edges import EdgeUniverse
from lit_svd.metrics import forward_answer_logits, task_scorer
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, first_input, hooks, output_tensor
from lit_svd.models.points import eager_attention
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm
from tests.helpers import exact_rms_norms, exact_softmax
from tests.test_edge_ablation import VOCAB, edge_batch, replace_input

ALL = ARCHITECTURES + HEAD_NORM_ARCHITECTURES
STEPS, EPS, TOL = 2, 1e-4, 1e-6


class Setup:
    def __init__(self, model):
        self.model = model
        self.view = make_view(model)
        self.universe = EdgeUniverse(self.view)
        self.batch = edge_batch(B=3, T=6)
        self.scores = attribute(self.universe, [self.batch], "ioi", steps=STEPS)
        att = EdgeAttribution(self.universe, "ioi", STEPS)
        self.dc, self.d_embed, _, self.corrupt_embed = att.writer_changes(self.batch)
        self.writes = {key: self.unit_writes(key) for key in ("clean_ids", "corrupt_ids")}

    def unit_writes(self, ids: str) -> list[torch.Tensor]:
        """Each writer unit's write into the residual ``[P, d]`` on ``batch[ids]``, from the model's own modules."""
        v, b = self.view, self.batch
        pre = {("z", l): v.site_module(l, "o") for l in range(v.n_layers)}
        pre[("embed", 0)] = v.block(0)
        post = {("out", l): v.attention_module(l) for l in range(v.n_layers)}
        post |= {("down", l): v.site_module(l, "down") for l in range(v.n_layers)}
        with torch.no_grad(), capture(pre, "pre") as a, capture(post, "post") as o, eager_attention(self.model):
            forward_answer_logits(self.model, b[ids], b["attention_mask"], b["answer_pos"])
        P = b["clean_ids"].numel()
        writes = [a["embed", 0].reshape(P, -1)]
        for l in range(v.n_layers):
            z = a["z", l].reshape(P, v.n_heads, v.d_head)
            f_attn = v.post_norm_factor("attn", l, o["out", l])
            down = v.site_output(l, "down", o["down", l])
            f_mlp = v.post_norm_factor("mlp", l, down)
            for h in range(v.n_heads):
                w = z[:, h] @ v.attn(l).W_O[h]
                if f_attn is not None:
                    w = w * f_attn.reshape(P, 1) * v.post_norm_affine("attn", l).scale
                writes.append(w)
            m = down.reshape(P, -1)
            if f_mlp is not None:
                m = m * f_mlp.reshape(P, 1) * v.post_norm_affine("mlp", l).scale
            writes.append(m)
        return writes

    def metric(self, alpha: float, *specs: Hook) -> float:
        """The metric summed over the prompts at the interpolated embedding, with extra hooks."""
        b, v = self.batch, self.view
        embed = (self.corrupt_embed + alpha * self.d_embed).reshape(*b["clean_ids"].shape, -1)
        with torch.no_grad(), eager_attention(self.model), hooks(Hook(v.block(0), replace_input(embed), "pre"), *specs):
            logits = forward_answer_logits(self.model, b["clean_ids"], b["attention_mask"], b["answer_pos"])
        return float(task_scorer("ioi").metric(logits, b).sum())

    def fd(self, make_hooks) -> float:
        """``mean_alpha (m(+eps) - m(-eps)) / (2 eps)`` over the prompts' mean."""
        total = 0.0
        for i in range(STEPS):
            alpha = i / STEPS
            total += (self.metric(alpha, *make_hooks(EPS)) - self.metric(alpha, *make_hooks(-EPS))) / (2 * EPS)
        return total / STEPS / len(self.batch["answer_pos"])


@pytest.fixture(params=ALL, scope="module")
def s(request):
    model = tiny_causal_lm(request.param, vocab_size=VOCAB).double()
    with exact_rms_norms(model), exact_softmax():
        yield Setup(model)


def _unit(s, kind: str, layer: int, group: int = 0):
    return next(r for r in s.universe.readers if r.kind == kind and r.layer == layer and r.group == group)


def _coefficient_hooks(s, r, k: int, change) -> list[Hook]:
    """Hooks adding ``change(f) [P]`` (``f``: the unit's live norm factor ``[P]``) to direction ``k``'s coefficient of
    reader unit ``r`` at its site."""
    v, u = s.view, s.universe
    b = u.basis(r)
    got: dict = {}
    point = "mlp" if r.kind == "mlp" else "attn"
    keep = Hook(v.norm_module(point, r.layer), lambda m, a, kw: got.update(R=first_input(a, kw)), "pre")

    def factor():
        R = got["R"]
        return v.norm_factor(point, r.layer, R.reshape(-1, R.shape[-1])).reshape(-1)

    if r.kind == "v":

        def add_v(module, args, kwargs, out):
            attn = output_tensor(out)
            B, T, _ = attn.shape
            c = change(factor()).reshape(B, T)
            mixed = torch.einsum("bds,bs->bd", output_tensor(out, 1)[:, r.group], c)
            return (attn + mixed[..., None] * b.Y[k], *out[1:])

        return [keep, Hook(v.attention_module(r.layer), add_v, "post")]
    if r.kind == "mlp":  # rows of Y: mlp_in's directions (the up site), then mlp_gate's
        site, sl = ("up" if k < b.split else "gate"), slice(None)
    else:
        d = b.Y.shape[1]
        site, sl = r.kind, slice(r.group * d, (r.group + 1) * d)

    def add(module, args, kwargs, out):
        own = v.site_output(r.layer, site, out)
        B, T, _ = own.shape
        new = own.clone()
        new[..., sl] = new[..., sl] + change(factor()).reshape(B, T, 1) * b.Y[k]
        return v.with_site_output(r.layer, site, out, new)

    return [keep, Hook(v.site_module(r.layer, site), add, "post")]


def _direction_fd(s, r, k: int, col: int) -> float:
    u = s.universe
    if r.kind == "logits":
        write = s.d_embed if col == 0 else s.dc[:, col : col + 1] * u.W[col]

        def make(eps):
            def pre(module, args, kwargs):
                x = first_input(args, kwargs)
                return (x + eps * write.reshape(x.shape), *args[1:]), kwargs

            return [Hook(s.view.norm_module("final", None), pre, "pre")]

        return s.fd(make)
    Rc = u.basis(r).Rc[k]
    edge = s.d_embed @ Rc if col == 0 else s.dc[:, col] * (Rc @ u.W[col])
    return s.fd(lambda eps: _coefficient_hooks(s, r, k, lambda f: eps * f * edge))


READERS = [("q", 1, 1), ("k", 1, 0), ("v", 1, 1), ("mlp", 1, 0), ("mlp", 0, 0), ("logits", None, 0)]


@pytest.mark.parametrize("reader", READERS, ids=lambda r: f"{r[0]}{r[1]}")
def test_direction_edges_are_finite_differences(s, reader):
    kind, layer, group = reader
    u = s.universe
    r = _unit(s, kind, u.view.n_layers if layer is None else layer, group)
    S = s.scores.directions(r)
    scale = max(float(s.scores.directions(q).abs().max()) for q in u.readers)
    k = 0 if r.size == 1 else int(S.abs().sum(1).argmax())  # the most attributed reader direction
    cols = {0, r.n_cols - 1}  # the embedding, the last writer, the strongest writer
    if r.n_cols > 1:
        cols.add(int(S[k, 1:].abs().argmax()) + 1)
    for col in cols:
        fd = _direction_fd(s, r, k, col)
        assert abs(float(S[k, col]) - fd) <= TOL * scale, (
            f"{r} d{k} <- {u.writer_address(col)}: score {float(S[k, col]):.6g}, finite difference {fd:.6g}"
        )


def _unit_input_hooks(s, r, change: torch.Tensor) -> list[Hook]:
    """Hooks moving reader unit ``r``'s input residual by ``change [P, d]`` (read through the model's modules)."""
    v = s.view
    if r.kind in ("mlp", "logits"):
        point = "mlp" if r.kind == "mlp" else "final"
        layer = None if r.kind == "logits" else r.layer

        def pre(module, args, kwargs):
            x = first_input(args, kwargs)
            return (x + change.reshape(x.shape), *args[1:]), kwargs

        return [Hook(v.norm_module(point, layer), pre, "pre")]
    got: dict = {}
    l, dh = r.layer, v.d_head
    keep = Hook(v.norm_module("attn", l), lambda m, a, kw: got.update(R=first_input(a, kw)), "pre")
    site = "v" if r.kind == "v" else r.kind
    group = r.group // (v.n_heads // v.n_kv_heads) if r.kind == "v" else r.group
    sl = slice(group * dh, (group + 1) * dh)

    def moved():  # the modules' own forwards, past their hooks
        R = got["R"]
        normed = v.norm_module("attn", l).forward(R + change.reshape(R.shape))
        return v.site_output(l, site, v.site_module(l, site).forward(normed))

    if r.kind in ("q", "k"):

        def replace(module, args, kwargs, out):
            own = v.site_output(l, site, out).clone()
            own[..., sl] = moved()[..., sl]
            return v.with_site_output(l, site, out, own)

        return [keep, Hook(v.site_module(l, site), replace, "post")]
    live: dict = {}

    def keep_value(module, args, kwargs, out):
        live["v"] = v.site_output(l, "v", out)[..., sl]

    def add(module, args, kwargs, out):
        A = output_tensor(out, 1)[:, r.group]
        extra = torch.einsum("bds,bsc->bdc", A, moved()[..., sl] - live["v"]) @ v.attn(l).W_O[r.group]
        return (output_tensor(out) + extra, *out[1:])

    return [keep, Hook(v.site_module(l, "v"), keep_value, "post"), Hook(v.attention_module(l), add, "post")]


@pytest.mark.parametrize("reader", READERS, ids=lambda r: f"{r[0]}{r[1]}")
def test_head_level_edges_are_finite_differences(s, reader):
    kind, layer, group = reader
    u = s.universe
    r = _unit(s, kind, u.view.n_layers if layer is None else layer, group)
    blocks = s.scores.units[int(u.block_offsets[r.index]) : int(u.block_offsets[r.index + 1])]
    scale = float(s.scores.units.abs().max())
    for U in {0, int(blocks.abs().argmax()), r.n_up - 1}:
        write = s.writes["clean_ids"][U] - s.writes["corrupt_ids"][U]
        fd = s.fd(lambda eps: _unit_input_hooks(s, r, eps * write))
        assert abs(float(blocks[U]) - fd) <= TOL * scale, (
            f"{r} <- {u.writers[U]}: score {float(blocks[U]):.6g}, finite difference {fd:.6g}"
        )


def test_coarser_scores_are_sums_of_direction_scores(s):
    u = s.universe
    for r in u.readers[:-1]:
        S = s.scores.directions(r)
        by_writer = s.scores.writer_units(r)
        for U, w in enumerate(u.writers[: r.n_up]):
            ref = S[:, w.offset : w.offset + w.size].sum(1)
            assert torch.allclose(by_writer[:, U], ref, rtol=0, atol=1e-12 * max(1.0, float(S.abs().max())))
    logits = u.readers[-1]
    blocks = s.scores.units[int(u.block_offsets[logits.index]) :]
    assert torch.allclose(blocks, s.scores.writer_units(logits)[0].double(), rtol=1e-10, atol=1e-14)


def test_bad_steps_fail_in_one_line():
    model = tiny_causal_lm("llama", vocab_size=VOCAB).double()
    with pytest.raises(ValueError, match="steps=0"):
        EdgeAttribution(EdgeUniverse(make_view(model)), "ioi", steps=0)
