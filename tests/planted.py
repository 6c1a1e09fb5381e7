"""Tiny float64 models with planted circuits: a GPT-2 with a planted two-step circuit, for the circuit-graph and
edge-check tests (``planted_model``, ``planted_batch``), and a Llama with one live head, for the rankings and the
faithful mask (``planted_llama``).

Weights (on top of small random noise, scale ``NOISE``, LayerNorms without affine, no position embeddings):

* tokens: fillers, a marker ``M``, a non-marker ``N`` (the corrupted prompt's marker), a query token ``Q`` and the
  answers ``X`` / ``Y``; their embeddings are orthogonal directions (norm 8, orthogonal to the all-ones vector,
  so LayerNorm's centring leaves them);
* layer 0, head 0 (``L0H0``): attends to its own token (QK: the token directions) and its OV writes a fresh
  direction ``f`` where the token is ``M``: **the earlier head's OV writes f**;
* layer 1, head 0 (``L1H0``): QK reads ``Q`` on the query side and ``f`` on the key side: **the later head's QK
  reads f**, so from the last position (``Q``) it attends to ``M``; its OV copies ``M`` into ``X - Y``: the metric
  (logit X - logit Y, IOI's scorer with ``correct_id`` X and ``wrong_id`` Y) depends on that attention.

The corrupted prompt has ``N`` where the clean one has ``M``: no ``f``, L1H0 spreads its attention, the metric
falls. The planted edge is ``L0.ov.h0.d0 -> L1.qk.h0.d0`` on the key side.
"""

from __future__ import annotations

import torch

from lit_svd.models.tiny import tiny_causal_lm

NOISE = 0.02
FILLERS = list(range(10, 18))
M, N, Q, X, Y = 20, 21, 22, 23, 24
LENGTH = 8


def planted_model(seed: int = 0):
    """The planted GPT-2 (float64, eval) and its token directions ``{token: unit vector}``, ``f``."""
    model = tiny_causal_lm("gpt2", seed=seed, vocab_size=64).double()
    g = torch.Generator().manual_seed(seed + 1)
    d = model.config.n_embd
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    A = A - A.mean(0, keepdim=True)  # columns orthogonal to the all-ones vector
    basis, _ = torch.linalg.qr(A)
    tokens = [*FILLERS, M, N, Q, X, Y]
    direction = {t: basis[:, i] for i, t in enumerate(tokens)}
    f = basis[:, len(tokens)]
    tr = model.transformer
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(NOISE / max(p.std().item(), 1e-12) if p.numel() > 1 else 0.0)
        for ln in [tr.ln_f, *(b.ln_1 for b in tr.h), *(b.ln_2 for b in tr.h)]:
            ln.weight.fill_(1.0)
            ln.bias.zero_()
        tr.wpe.weight.zero_()
        tr.wte.weight.mul_(0.1)
        for t, u in direction.items():
            tr.wte.weight[t] = 8.0 * u
        dh = d // model.config.n_head
        # layer 0 head 0: attend to the own token, write f at M
        a0 = tr.h[0].attn
        W = a0.c_attn.weight  # [d, 3d]: q | k | v, head h in columns h * dh ..
        for i, t in enumerate(tokens[:dh]):
            W[:, i] = direction[t] * 0.6
            W[:, d + i] = direction[t] * 0.6
        W[:, 2 * d] = direction[M]
        a0.c_proj.weight[0] = 1.0 * f
        # layer 1 head 0: query Q, key f; copy M into X - Y
        a1 = tr.h[1].attn
        W = a1.c_attn.weight
        W[:, 0] = direction[Q] * 1.0
        W[:, d] = f * 1.0
        W[:, 2 * d] = direction[M]
        a1.c_proj.weight[0] = 0.5 * (direction[X] - direction[Y])
    return model.eval(), direction, f


def planted_batch(n: int = 12, seed: int = 0) -> dict:
    """``n`` prompts of ``LENGTH`` tokens: fillers with ``M`` at a random position before the last, ``Q`` last;
    corrupted: ``M`` -> ``N``. IOI-style batch keys (``correct_id`` X, ``wrong_id`` Y)."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.empty(n, LENGTH, dtype=torch.long)
    for i in range(n):
        clean[i] = torch.tensor(FILLERS)[torch.randperm(len(FILLERS), generator=g)[:LENGTH]]
        clean[i, int(torch.randint(1, LENGTH - 2, (1,), generator=g))] = M
        clean[i, -1] = Q
    corrupt = torch.where(clean == M, torch.full_like(clean, N), clean)
    return {
        "clean_ids": clean,
        "corrupt_ids": corrupt,
        "attention_mask": torch.ones(n, LENGTH, dtype=torch.long),
        "answer_pos": torch.full((n,), LENGTH - 1, dtype=torch.long),
        "index": torch.arange(n),
        "correct_id": torch.full((n,), X, dtype=torch.long),
        "wrong_id": torch.full((n,), Y, dtype=torch.long),
    }


def planted_llama():
    """A float64 tiny Llama whose only live writer is head 0 of layer 1: every other head's o-projection slice and
    both MLPs' down projections are zero, so an IOI metric can only flow through L1's q (head 0), k (KV head 0) and
    ov (head 0) directions (48 of the universe's 512: the zero maps, L0's OV and both MLP outputs, have no
    directions)."""
    model = tiny_causal_lm("llama", seed=3).double()
    model.set_attn_implementation("sdpa")
    dh = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        for l, layer in enumerate(model.model.layers):
            layer.mlp.down_proj.weight.zero_()
            for h in range(model.config.num_attention_heads):
                if (l, h) != (1, 0):
                    layer.self_attn.o_proj.weight[:, h * dh : (h + 1) * dh] = 0
    return model
