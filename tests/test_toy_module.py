"""ToyAlignmentModule: the batched loss against a per-sample loop, ensemble independence, frozen mode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lit_svd.analysis.alignment import interference
from lit_svd.datamodules.toy import sample_sparse_features
from lit_svd.modules.toy import ToyAlignmentModule


def loop_losses(mod: ToyAlignmentModule, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model written out one instance and one sample at a time (no einsum, no batching)."""
    recon, attn = [], []
    for i in range(feats.shape[0]):
        W, b = mod.W[i], mod.b[i]
        W_Q, W_K = mod.W_Q[i, : mod.d_heads[i]], mod.W_K[i, : mod.d_heads[i]]
        r_sum, a_sum = 0.0, 0.0
        for sample in feats[i]:
            tokens = [W @ f for f in sample]
            for f, x in zip(sample, tokens):
                f_hat = torch.relu(W.T @ x + b)
                r_sum = r_sum + (mod.importance * (f_hat - f) ** 2).mean()
            logits = torch.stack([tokens[0] @ W_Q.T @ W_K @ s for s in tokens[1:]])
            target = torch.stack([sample[0] @ mod.template @ g for g in sample[1:]]) / mod.temperature
            a_sum = a_sum + F.cross_entropy(logits[None], torch.softmax(target, -1)[None])
        recon.append(r_sum / (feats.shape[1] * feats.shape[2]))
        attn.append(a_sum / feats.shape[1])
    return torch.stack(recon), torch.stack(attn)


def test_batched_losses_match_per_sample_loop():
    mod = ToyAlignmentModule(
        n_features=7,
        d_model=4,
        d_head=[3, 2],
        n_instances=2,
        importance_decay=0.8,
        template={"pairs": [[0, 1, 1.0], [2, 5, 0.5]]},
        init_scale=2.0,
    )
    with torch.no_grad():
        mod.b.normal_()
    feats = sample_sparse_features(torch.Generator().manual_seed(0), 5, 4, 7, torch.tensor([0.5, 0.8]))
    r, a = mod.losses(feats)
    r_ref, a_ref = loop_losses(mod, feats)
    assert torch.allclose(r, r_ref, atol=1e-6) and torch.allclose(a, a_ref, atol=1e-5)


def train(mod: ToyAlignmentModule, feats_per_step: list[torch.Tensor]) -> None:
    opt = mod.configure_optimizers()
    for feats in feats_per_step:
        r, a = mod.losses(feats)
        loss = (r + mod.lambda_attn * a).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_ensemble_member_trains_exactly_as_alone():
    g = torch.Generator().manual_seed(0)
    data = [sample_sparse_features(g, 32, 5, 12, torch.tensor([0.2, 0.2])) for _ in range(20)]
    kw = dict(n_features=12, d_model=6, template={"pair": [0, 1, 1.0]}, lr=1e-2, weight_decay=0.01)
    ens = ToyAlignmentModule(seeds=[3, 9], d_head=[6, 4], lambda_attn=[1.0, 5.0], **kw)
    alone = ToyAlignmentModule(seeds=[9], d_head=4, lambda_attn=5.0, **kw)
    assert torch.equal(ens.W_K[1, :4], alone.W_K[0])
    train(ens, data)
    train(alone, [d[1:] for d in data])
    for name in ("W", "b", "W_Q", "W_K"):
        got, ref = getattr(ens, name)[1], getattr(alone, name)[0]
        got = got[: ref.shape[0]] if name in ("W_Q", "W_K") else got
        assert torch.allclose(got, ref, atol=1e-5), name
    assert not torch.allclose(ens.W[0], ens.W[1])
    assert ens.W_Q[1, 4:].abs().max() == 0 and ens.W_K[1, 4:].abs().max() == 0  # masked heads stay zero


def test_frozen_features_keep_their_interference():
    mod = ToyAlignmentModule(n_features=8, d_model=8, d_head=8, frozen_features=True, interference=[0.0, 2.0, 6.0])
    assert mod.n_instances == 3
    W0 = mod.W.detach().clone()
    assert torch.allclose(interference(W0), torch.tensor([0.0, 2.0, 6.0]), atol=1e-3)
    g = torch.Generator().manual_seed(0)
    train(mod, [sample_sparse_features(g, 16, 5, 8, torch.full((3,), 0.3)) for _ in range(5)])
    assert torch.equal(mod.W, W0)
    assert mod.interference == pytest.approx([0.0, 2.0, 6.0], abs=1e-3)


def test_frozen_mode_needs_interference_and_vice_versa():
    with pytest.raises(ValueError, match="^interference=None: frozen_features=True needs interference"):
        ToyAlignmentModule(frozen_features=True)
    with pytest.raises(ValueError, match=r"^interference=2.0: only allowed with frozen_features=True"):
        ToyAlignmentModule(interference=2.0)


def test_batch_shape_mismatch_is_reported():
    mod = ToyAlignmentModule(n_instances=2)
    with pytest.raises(ValueError, match=r"batch shape \(1, 4, 9, 20\): expected \[n_instances=2"):
        mod.check_batch(torch.zeros(1, 4, 9, 20))


def test_instance_with_smaller_d_model_trains_exactly_as_alone():
    """Per-instance D (N/D sweeps): an instance of D = 4 in an ensemble allocated at D = 6 trains as a
    D = 4 model alone (1e-5), and its extra dimensions stay zero."""
    g = torch.Generator().manual_seed(0)
    data = [sample_sparse_features(g, 32, 5, 12, torch.tensor([0.2, 0.2])) for _ in range(20)]
    kw = dict(n_features=12, template={"pair": [0, 1, 1.0]}, lr=1e-2, weight_decay=0.01, d_head=None)
    ens = ToyAlignmentModule(seeds=[3, 9], d_model=[6, 4], **kw)
    alone = ToyAlignmentModule(seeds=[9], d_model=4, **kw)
    assert ens.d_heads == [6, 4]
    train(ens, data)
    train(alone, [d[1:] for d in data])
    torch.testing.assert_close(ens.features()[1, :4], alone.W[0], atol=1e-5, rtol=0)
    W_Q, W_K = ens.head_weights()
    torch.testing.assert_close(W_Q[1, :4, :4], alone.W_Q[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(W_K[1, :4, :4], alone.W_K[0], atol=1e-5, rtol=0)
    assert ens.feature_directions()[1, 4:].abs().max() == 0 and W_Q[1, :, 4:].abs().max() == 0


def test_grid_expands_every_combination_and_seed():
    mod = ToyAlignmentModule(
        n_features=8,
        d_head=None,
        frozen_features=True,
        seed=5,
        grid_seeds=2,
        grid={"d_model": [8, 4], "interference": [None, 5.0]},
    )
    assert mod.n_instances == 8 and mod.d_models == [8, 8, 8, 8, 4, 4, 4, 4]
    assert mod.interference_targets == [None, None, 5.0, 5.0] * 2 and mod.seeds == [5, 6] * 4
    assert mod.interference[0] == pytest.approx(0.0, abs=1e-6) and mod.interference[2] == pytest.approx(5.0, abs=1e-3)
    with pytest.raises(ValueError, match=r"grid keys \['p'\]: allowed are d_model, d_head, interference, lambda_attn"):
        ToyAlignmentModule(grid={"p": [0.1]})
    with pytest.raises(ValueError, match="d_model is given as a list and by grid"):
        ToyAlignmentModule(d_model=[4, 8], grid={"d_model": [4]})
