"""The exact split of a read into upstream writes (``analysis/decompose.py``) against the hooked HF forward.

For every architecture (float64 tiny models, RMSNorms in float64: ``exact_rms_norms``) and, marked slow, the
real SmolLM2 and Gemma-3 in float32:

* the pieces sum to the reader's coefficient (``Split.residual``), and that coefficient is the model's own:
  QK terms summed over directions give the pre-softmax score HF computed (captured at its eager softmax;
  Gemma-2: soft-capped), ``relative=True`` the score minus the mean over the other visible sources; each term
  equals SAD's ``direction_terms`` (an independent implementation of the rotary terms); OV reads give the
  value projection's output (unmixed) or the o projection's input (mixed) along ``W_O v_k``; MLP reads the up /
  gate projection's output along ``v_k``; logit reads the HF logits;
* per writer, the pieces of a head (its OV directions and ``b_V``) and of an MLP (its output directions and
  ``b_out``) sum to the read of that sub-layer's actual write (``head_out`` / ``mlp_out`` from the cache,
  through Gemma's frozen post norm): the split is right node by node, not only in total;
* only upstream writers appear (GPT-NeoX's parallel MLP sees nothing of its own layer).

Tolerance: ``|ours - model| <= TOL * max |model|`` over the compared set (1e-10 float64, 1e-5 float32).
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from lit_svd.addresses import Address
from lit_svd.analysis.decompose import Decomposer, logit_reads, mlp_reads, ov_reads, qk_reads
from lit_svd.analysis.sad import causal_visibility, direction_terms, qk_heads_from_view, relative
from lit_svd.models import view as make_view
from lit_svd.models.base import augment_inputs
from lit_svd.models.hooks import capture
from lit_svd.models.points import eager_attention
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm
from tests.helpers import exact_rms_norms

ALL = ARCHITECTURES + HEAD_NORM_ARCHITECTURES


def close(ours, ref, what, tol):
    err = (ours - ref).abs().max().item()
    bound = tol * ref.abs().max().item()
    assert err <= bound, f"{what}: max abs diff {err:.3g} > {bound:.3g} (max |ref| {ref.abs().max().item():.3g})"


@contextmanager
def softmax_inputs():
    """Record the input of every 4-d softmax (HF eager attention's scores, mask and soft-cap applied)."""
    got, real = [], torch.nn.functional.softmax

    def softmax(x, *args, **kwargs):
        if x.dim() == 4:
            got.append(x.detach().clone())
        return real(x, *args, **kwargs)

    torch.nn.functional.softmax = softmax
    try:
        yield got
    finally:
        torch.nn.functional.softmax = real


@torch.no_grad()
def hf_reference(v, ids, mask):
    """One eager HF forward: per layer the scores, value / up / gate projection outputs and o projection input."""
    sites = {}
    for l in range(v.n_layers):
        sites.update({("v", l): v.site_module(l, "v"), ("up", l): v.site_module(l, "up")})
        if v.gated_mlp:
            sites["gate", l] = v.site_module(l, "gate")
    with eager_attention(v.model), softmax_inputs() as scores, capture(sites, "post") as outs:
        with capture({l: v.site_module(l, "o") for l in range(v.n_layers)}, "pre") as z:
            logits = v.model(input_ids=ids, attention_mask=mask).logits
    ref = {("score", l): s for l, s in enumerate(scores)}
    for (site, l), out in outs.items():
        ref[site, l] = v.site_output(l, site, out)
    ref.update({("z", l): t for l, t in z.items()})
    ref["logits"] = logits
    return ref


class Setup:
    def __init__(self, model, ids, mask):
        self.view = make_view(model)
        self.ids, self.mask = ids, mask
        self.dec = Decomposer(self.view)
        self.cache = self.view.run_with_cache(self.dec.points(mix=True) + ["head_out", "mlp_out"], ids, mask)
        self.ref = hf_reference(self.view, ids, mask)


def tiny_batch(vocab: int, B=3, T=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, T - 2 :] = 0
    return ids, mask


@pytest.fixture(params=ALL, scope="module")
def tiny(request):
    model = tiny_causal_lm(request.param).double()
    with exact_rms_norms(model):
        yield Setup(model, *tiny_batch(model.config.vocab_size))


def pairs(s, layer, n=5, seed=0):
    """``n`` (batch, dest, src) pairs with src visible from dest and at least two visible sources."""
    vis = causal_visibility(s.mask, s.view.window(layer))
    ok = vis & (vis.sum(-1, keepdim=True) >= 2)
    idx = torch.nonzero(ok)
    pick = idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(seed))[:n]]
    return pick[:, 0], pick[:, 1], pick[:, 2]


def check_qk(s, tol, heads=None, layers=None, n_pairs=5):
    v = s.view
    for layer in layers or range(v.n_layers):
        b, d, src = pairs(s, layer, n_pairs)
        vis = causal_visibility(s.mask, v.window(layer))
        x = augment_inputs(s.cache["attn_normalized", layer].double())
        qk = qk_heads_from_view(v, layer).to(torch.float64)
        U = s.dec.qk_basis(layer)[2].U
        terms = direction_terms(x, x, qk, U)  # [B, H, T_d, K, T_s], SAD's own implementation
        model = s.ref["score", layer].double()  # [B, H, T, T]
        if v.attn_softcap:
            model = v.attn_softcap * torch.atanh(model / v.attn_softcap)  # back to the pre-cap score
        for head in heads or range(v.n_heads):
            for rel in (False, True):
                want = relative(terms, vis) if rel else terms
                want = want[b, head, d, :, src]  # [P, K]
                scores = relative(model, vis) if rel else model
                for side in ("query", "key"):
                    reads = qk_reads(s.dec, s.cache, layer, head, b, d, src, s.mask, side=side, relative=rel)
                    split = s.dec.split(s.cache, reads)
                    total = split.total.view(len(b), -1)
                    what = f"L{layer}H{head} {side} relative={rel}"
                    close(split.values.sum(-1), split.total, f"{what}: pieces vs coefficient", tol)
                    close(total, want, f"{what}: coefficient vs SAD's direction terms", tol)
                    close(total.sum(-1), scores[b, head, d, src], f"{what}: sum over directions vs HF score", tol)


def test_qk_terms_sum_to_hf_scores(tiny):
    check_qk(tiny, 1e-10)


def check_ov_mlp_logits(s, tol, layers=None, stride=1):
    """At every ``stride``-th real position, every 7th direction (a bounded split)."""
    v = s.view
    B, T = s.ids.shape
    b, p = (t[::stride] for t in torch.nonzero(s.mask.bool(), as_tuple=True))
    rep = v.n_heads // v.n_kv_heads
    for layer in layers or range(v.n_layers):
        w = s.dec.layers[layer]
        value = s.ref["v", layer].reshape(B, T, v.n_kv_heads, v.d_head).double()
        z = s.ref["z", layer].reshape(B, T, v.n_heads, v.d_head).double()
        for head in (0, v.n_heads - 1):
            for mix, src in ((False, value[:, :, head // rep]), (True, z[:, :, head])):
                ks = torch.arange(0, w.ov_S.shape[-1], 7)
                split = s.dec.split(s.cache, ov_reads(s.dec, s.cache, layer, head, b, p, directions=ks, mix=mix))
                close(split.values.sum(-1), split.total, f"L{layer}H{head} OV mix={mix}: pieces", tol)
                want = src[b, p] @ w.read[head][:, ks]  # [P, K]: along W_O v_k
                close(split.total.view(len(b), -1), want, f"L{layer}H{head} OV mix={mix} vs HF", tol)
        for kind, site in (("mlp_in", "up"), ("mlp_gate", "gate"))[: 1 + v.gated_mlp]:
            ks = torch.arange(0, s.dec.mlp_basis(layer, kind)[0].S.shape[-1], 7)
            split = s.dec.split(s.cache, mlp_reads(s.dec, s.cache, layer, b, p, directions=ks, kind=kind))
            close(split.values.sum(-1), split.total, f"L{layer} {kind}: pieces", tol)
            want = s.ref[site, layer].double()[b, p] @ s.dec.mlp_basis(layer, kind)[0].V[:, ks]
            close(split.total.view(len(b), -1), want, f"L{layer} {kind} vs HF", tol)
    tokens = torch.tensor([0, 5, v.vocab_size - 1])
    weights = torch.zeros(len(tokens), v.vocab_size, dtype=torch.float64)
    weights[torch.arange(len(tokens)), tokens] = 1.0
    rows = torch.tensor([0, 1, 2]), torch.tensor([T - 1, 3, 0])
    split = s.dec.split(s.cache, logit_reads(s.dec, s.cache, *rows, weights))
    close(split.values.sum(-1), split.total, "logit reads: pieces", tol)
    got = split.total if not v.final_softcap else v.final_softcap * torch.tanh(split.total / v.final_softcap)
    close(got, s.ref["logits"].double()[rows[0], rows[1], tokens], "logit reads vs HF logits", tol)


def test_ov_mlp_and_logit_reads_sum_to_hf(tiny):
    check_ov_mlp_logits(tiny, 1e-10)


def test_each_writer_sums_to_the_read_of_its_own_write(tiny):
    """Per head and per MLP, the pieces of its nodes sum to the reader's frozen read of that sub-layer's write
    (``head_out`` / ``mlp_out`` of the cache through Gemma's post norm); only upstream writers appear."""
    s, v = tiny, tiny.view
    last = v.n_layers - 1
    b, p = torch.nonzero(s.mask.bool(), as_tuple=True)
    for point, reads in (
        ("attn", qk_reads(s.dec, s.cache, last, 1, *pairs(s, last), s.mask, side="key", relative=True)),
        ("mlp", mlp_reads(s.dec, s.cache, last, b, p, directions=[0, 3])),
    ):
        split = s.dec.split(s.cache, reads)
        layers = {n.layer for n in split.nodes if n.kind in ("ov", "b_V", "b_O", "mlp_out", "b_out")}
        sees_own_attn = point == "mlp" and not v.parallel_residual
        assert max(layers) == (last if sees_own_attn else last - 1)
        assert all(n.kind != "mlp_out" or n.layer < last for n in split.nodes)
        # the reader's read of one writer's actual write, rows summed per reader as the split does
        factor = s.cache[f"{point}_factor", last][reads.batch, reads.position, 0].double()
        r = reads.vector[:, 1:].double()
        r = r - r.mean(-1, keepdim=True) if v.norm_kind == "layernorm" else r
        col = {n: i for i, n in enumerate(split.nodes)}
        for l in sorted(layers):
            post = [v.post_norm_affine(q, l) for q in ("attn", "mlp")]
            head_write = s.cache["head_out", l].double()[reads.batch, reads.position]  # [R, H, d]
            mlp_write = s.cache["mlp_out", l].double()[reads.batch, reads.position] - s.dec.layers[l].b_out
            if post[0] is not None:
                pf = s.cache["attn_post_factor", l][reads.batch, reads.position].double()
                head_write = head_write * pf[:, None] * post[0].scale
                mf = s.cache["mlp_post_factor", l][reads.batch, reads.position].double()
                mlp_write = mlp_write * mf * post[1].scale
            scale = reads.weight.double() * factor
            for h in range(v.n_heads):
                want = torch.zeros(reads.n_readers, dtype=torch.float64).index_add_(
                    0, reads.reader, scale * (r * head_write[:, h]).sum(-1)
                )
                nodes = [Address(l, "ov", h, k) for k in range(s.dec.layers[l].ov_S.shape[-1])] + [Address(l, "b_V", h)]
                got = split.values[:, [col[n] for n in nodes]].sum(-1)
                close(got, want, f"{point} read of L{l}H{h}'s write", 1e-10)
            if point == "mlp" and l == last:
                continue  # the MLP of the reader's own layer is downstream
            want = torch.zeros(reads.n_readers, dtype=torch.float64).index_add_(
                0, reads.reader, scale * (r * mlp_write).sum(-1)
            )
            got = split.values[:, [col[n] for n in split.nodes if n.layer == l and n.kind == "mlp_out"]].sum(-1)
            close(got, want, f"{point} read of L{l} MLP's write (b_out apart)", 1e-10)


def test_merge_to_blocks_and_heads_keeps_the_sum(tiny):
    s = tiny
    split = s.dec.split(s.cache, ov_reads(s.dec, s.cache, 1, 0, torch.tensor([0]), torch.tensor([5])))
    from lit_svd.linalg import direction_blocks

    blocks = {l: direction_blocks(w.ov_S, 0.05) for l, w in enumerate(s.dec.layers)}
    by_block = split.merge(lambda n: n.block(blocks[n.layer]) if n.kind == "ov" else n)
    by_head = split.merge(lambda n: n.whole(s.view.d_head) if n.kind == "ov" else n)
    assert len(by_head.nodes) < len(by_block.nodes) <= len(split.nodes)
    for m in (by_block, by_head):
        close(m.values.sum(-1), split.total, "merged pieces", 1e-12)
    assert by_head.top(0, 3)[0][0] in by_head.nodes


def test_bad_reads_fail_in_one_line():
    v = make_view(tiny_causal_lm("llama"), fold_norms=False)
    with pytest.raises(ValueError, match="fold_norms=True"):
        Decomposer(v)
    model = tiny_causal_lm("gpt2").double()
    s = Setup(model, *tiny_batch(model.config.vocab_size))
    with pytest.raises(ValueError, match="not visible"):
        qk_reads(s.dec, s.cache, 0, 0, torch.tensor([0]), torch.tensor([1]), torch.tensor([3]), s.mask)
    with pytest.raises(ValueError, match="^side='value' is unknown; choose one of query, key$"):
        qk_reads(s.dec, s.cache, 0, 0, torch.tensor([0]), torch.tensor([3]), torch.tensor([1]), s.mask, side="value")
    with pytest.raises(IndexError, match="out of range"):
        ov_reads(s.dec, s.cache, 0, 0, torch.tensor([0]), torch.tensor([1]), directions=[99])
    with pytest.raises(ValueError, match="split fewer readers"):
        s.dec.split(s.cache, mlp_reads(s.dec, s.cache, 1, torch.tensor([0]), torch.tensor([1])), max_bytes=1000)


def one_hot(tokens, vocab):
    return torch.zeros(len(tokens), vocab, dtype=torch.float64).scatter_(1, tokens[:, None], 1.0)


def real_setup(model, tokenizer):
    from lit_svd.datamodules.tasks import TaskDataModule

    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=4, batch_size=4)
    batch = next(iter(dm.test_dataloader()))
    return Setup(model, batch["clean_ids"], batch["attention_mask"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_models_float32(name, request):
    model, tokenizer = request.getfixturevalue(name)
    s = real_setup(model, tokenizer)
    last = s.view.n_layers - 1
    # Gemma-3: a sliding and a global layer; few pairs and positions (a real split is ~1e11 products a layer)
    check_qk(s, 1e-5, heads=[s.view.n_heads - 1], layers=[1, last], n_pairs=2)
    check_ov_mlp_logits(s, 1e-5, layers=[last], stride=8)


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox"])
def test_layernorm_bias_is_its_own_node(arch):
    """The bias coordinate of a read splits into the map's own bias and the LayerNorm bias folded into it: with
    every LayerNorm bias zeroed the norm-bias node reads 0 (to float rounding: the two parts come from the folded
    and the unfolded map); with the biases in place it does not."""
    got = {}
    for zero in (False, True):
        model = tiny_causal_lm(arch).double()
        if zero:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if ("ln" in name or "layernorm" in name or "layer_norm" in name) and name.endswith("bias"):
                        p.zero_()
        s = Setup(model, *tiny_batch(model.config.vocab_size))
        b, d, src = pairs(s, 1)
        split = s.dec.split(s.cache, qk_reads(s.dec, s.cache, 1, 2, b, d, src, s.mask, directions=[0, 1], side="query"))
        cols = {n: i for i, n in enumerate(split.nodes)}
        got[zero] = split.values[:, cols[Address(1, "attn_norm_bias")]]
        for reads in (
            ov_reads(s.dec, s.cache, 1, 0, b, d),
            mlp_reads(s.dec, s.cache, 1, b, d, directions=[0]),
            logit_reads(s.dec, s.cache, b, d, one_hot(b, model.config.vocab_size)),
        ):
            norm_bias = s.dec.split(s.cache, reads).values[:, -1]
            assert (norm_bias.abs().max() < 1e-12) if zero else (norm_bias.abs().max() > 1e-6)
    assert got[True].abs().max() < 1e-12 and got[False].abs().max() > 1e-6
