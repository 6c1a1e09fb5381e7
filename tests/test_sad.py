"""SAD analysis on synthetic factors, against brute-force per-pair loops (float64, tolerance 1e-10)."""

import math

import pytest
import torch

from lit_svd.analysis.sad import (
    QKHeads,
    augment_inputs,
    causal_visibility,
    direction_terms,
    n_recon,
    relative,
    rotated_bases,
    sad_pairs,
    scores,
    select_pairs,
)
from lit_svd.linalg import haar_orthogonal, rolls_tovee_sparsity

TOL = dict(rtol=1e-10, atol=1e-10)


def toy_rope(x, positions, base=10.0):
    """A rotary embedding written independently of any model (pairs (i, i + d/2))."""
    half = x.shape[-1] // 2
    inv = base ** (-torch.arange(half, dtype=x.dtype) / half)
    ang = positions[:, None].to(x.dtype) * inv[None]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], dim=-1)


def rope_matrix(delta, d_head):
    """``R(delta)`` with ``rope(q, i) . rope(k, i + delta) = q^T R(delta) k``, built from toy_rope."""
    eye = torch.eye(d_head, dtype=torch.float64)
    Ri = toy_rope(eye[:, None, :], torch.tensor([0]))[:, 0]
    Rj = toy_rope(eye[:, None, :], torch.tensor([delta]))[:, 0]
    return Ri @ Rj.T


def make_case(rotary: bool, seed=0, B=3, T=8, d=10, h=2, dh=4):
    g = torch.Generator().manual_seed(seed)
    qk = QKHeads(
        torch.randn(h, d + 1, dh, generator=g, dtype=torch.float64),
        torch.randn(h, d + 1, dh, generator=g, dtype=torch.float64),
        toy_rope if rotary else None,
    )
    x = augment_inputs(torch.randn(B, T, d, generator=g, dtype=torch.float64))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    mask[2, :2] = 0  # left padding
    return qk, x, mask


def brute_omega(qk, head, delta):
    """Dense ``Omega(delta) = A_q R(delta) A_k^T`` of one head."""
    R = rope_matrix(delta, qk.A_q.shape[-1]) if qk.rotate else torch.eye(qk.A_q.shape[-1], dtype=torch.float64)
    return qk.A_q[head] @ R @ qk.A_k[head].T


def brute_pair(qk, U, x, mask, b, head, d, s):
    """Score, relative attention and contributions of one pair by explicit loops over sources."""
    srcs = [j for j in range(d + 1) if mask[b, j] and mask[b, d]]
    pos = {j: j - srcs[0] for j in srcs}  # real tokens are numbered from 0, as the model sees them

    def terms(j):
        om = brute_omega(qk, head, pos[j] - pos[d])
        return (x[b, d] @ U[head]) * (U[head].T @ om @ x[b, j])

    t = {j: terms(j) for j in srcs}
    l = {j: float(x[b, d] @ brute_omega(qk, head, pos[j] - pos[d]) @ x[b, j]) for j in srcs}
    others = [j for j in srcs if j != s]
    rel = l[s] - sum(l[j] for j in others) / len(others)
    c = t[s] - sum(t[j] for j in others) / len(others)
    return l[s], rel, c


@pytest.mark.parametrize("rotary", [False, True])
def test_terms_sum_to_scores_and_contributions_to_relative(rotary):
    qk, x, mask = make_case(rotary)
    U = qk.basis()
    vis = causal_visibility(mask)
    t = direction_terms(x, x, qk, U)  # [B, h, T, k, T]
    l = scores(x, x, qk)
    torch.testing.assert_close(t.sum(-2), l, **TOL)
    c = relative(t, vis)
    rel = relative(l, vis)
    torch.testing.assert_close(c.sum(-2), rel, **TOL)
    for b, head, d, s in [(0, 0, 5, 2), (1, 1, 5, 0), (2, 0, 7, 2), (2, 1, 4, 4), (0, 1, 7, 7)]:
        l_bf, rel_bf, c_bf = brute_pair(qk, U, x, mask, b, head, d, s)
        assert math.isclose(l[b, head, d, s].item(), l_bf, rel_tol=1e-10, abs_tol=1e-10)
        assert math.isclose(rel[b, head, d, s].item(), rel_bf, rel_tol=1e-10, abs_tol=1e-10)
        torch.testing.assert_close(c[b, head, d, :, s], c_bf, **TOL)


def test_rotary_uses_one_basis_from_query_side():
    qk, x, mask = make_case(True)
    U = qk.basis()
    # U spans A_q's column space: projecting A_q on it changes nothing
    torch.testing.assert_close(U @ (U.mT @ qk.A_q), qk.A_q, **TOL)
    # with rope the basis is not the SVD of one Omega(delta) for delta != 0, yet terms still sum exactly
    om = brute_omega(qk, 0, -3)
    assert not torch.allclose(torch.linalg.svd(om).U[:, :4].abs(), U[0].abs(), atol=1e-3)


@pytest.mark.parametrize("rotary", [False, True])
def test_rotated_control_sums_exactly_and_differs(rotary):
    qk, x, mask = make_case(rotary)
    U = qk.basis()
    U_rot = rotated_bases(U, seed=3)
    torch.testing.assert_close(
        U_rot.mT @ U_rot, torch.eye(U.shape[-1], dtype=torch.float64).expand_as(U_rot.mT @ U_rot), **TOL
    )
    vis = causal_visibility(mask)
    c_rot = relative(direction_terms(x, x, qk, U_rot), vis)
    torch.testing.assert_close(c_rot.sum(-2), relative(scores(x, x, qk), vis), **TOL)
    c = relative(direction_terms(x, x, qk, U), vis)
    assert (c - c_rot).abs().max() > 1e-3
    torch.testing.assert_close(rotated_bases(U, seed=3), U_rot, rtol=0, atol=0)  # seeded: same on every rank
    # another orthonormal basis of the same span (signs flipped, columns mixed: what another BLAS build may return)
    P = haar_orthogonal(U.shape[-1], U.shape[0], generator=torch.Generator().manual_seed(1), dtype=U.dtype)
    torch.testing.assert_close(rotated_bases(U @ P, seed=3), U_rot, **TOL)
    assert (rotated_bases(U, seed=4) - U_rot).abs().max() > 1e-3  # the seed matters


def test_visibility_rule():
    mask = torch.tensor([[0, 1, 1, 1, 0]])
    vis = causal_visibility(mask)[0]
    expected = torch.tensor([[j <= i and 1 <= j and i <= 3 for j in range(5)] for i in range(5)])
    assert torch.equal(vis, expected)
    win = causal_visibility(torch.ones(1, 5, dtype=torch.long), window=2)[0]
    assert torch.equal(win, torch.tensor([[0 <= i - j < 2 for j in range(5)] for i in range(5)]))


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_pair_selection_matches_rule(threshold):
    qk, x, mask = make_case(False, seed=1)
    vis = causal_visibility(mask)
    l = scores(x, x, qk)
    rel = relative(l, vis)
    probs = torch.softmax(l.masked_fill(~vis[:, None], float("-inf")), -1).nan_to_num(0.0)
    sel = select_pairs(probs, rel, vis, threshold)
    B, h, T, _ = l.shape
    for b in range(B):
        for hd in range(h):
            for d in range(T):
                n = int(vis[b, d].sum())
                for s in range(T):
                    level = 1 / max(n, 1) if threshold is None else threshold
                    want = bool(vis[b, d, s]) and n >= 2 and rel[b, hd, d, s] > 0 and probs[b, hd, d, s] >= level
                    assert bool(sel[b, hd, d, s]) == want


def test_n_recon_brute_force():
    g = torch.Generator().manual_seed(0)
    c = torch.randn(200, 12, generator=g, dtype=torch.float64)
    c[:50, 3] += 20.0  # some pairs dominated by one direction
    rel = c.sum(-1)
    keep = rel > 0
    c, rel = c[keep], rel[keep]
    got = n_recon(c, rel, tol=0.0)
    for i in range(len(c)):
        srt = sorted(c[i].tolist(), reverse=True)
        run, want = 0.0, len(srt)
        for m, v in enumerate(srt, 1):
            run += v
            if run >= rel[i].item() - 1e-12 * sum(abs(u) for u in srt):
                want = m
                break
        assert got[i].item() == want
    one_hot = torch.zeros(1, 12, dtype=torch.float64)
    one_hot[0, 5] = 2.0
    assert n_recon(one_hot, one_hot.sum(-1)).item() == 1


def test_sad_pairs_statistics_match_recomputation():
    qk, x, mask = make_case(True, seed=2, B=4, T=9)
    U = qk.basis()
    U_rot = rotated_bases(U, seed=0)
    st = sad_pairs(x, x, causal_visibility(mask), qk, U, U_rot, keep_contributions=True)
    assert len(st) > 10
    for i in range(0, len(st), 7):
        b, hd, d, s = (int(v[i]) for v in (st.batch, st.head, st.dest, st.src))
        _, rel_bf, c_bf = brute_pair(qk, U, x, mask, b, hd, d, s)
        assert rel_bf > 0
        torch.testing.assert_close(st.contributions[i], c_bf, **TOL)
        assert math.isclose(st.sparsity[i].item(), rolls_tovee_sparsity(c_bf).item(), rel_tol=1e-9)
        _, _, c_rot = brute_pair(qk, U_rot, x, mask, b, hd, d, s)
        assert math.isclose(st.sparsity_rotated[i].item(), rolls_tovee_sparsity(c_rot).item(), rel_tol=1e-9)
    k = U.shape[-1]
    assert ((st.sparsity >= 1 / k - 1e-12) & (st.sparsity <= 1 + 1e-12)).all()
    assert ((st.n_recon >= 1) & (st.n_recon <= k)).all()


def test_sparse_head_is_sparser_than_its_rotation():
    """A head whose inputs live on its singular directions decomposes sparsely; the rotation does not."""
    g = torch.Generator().manual_seed(0)
    d, dh = 32, 8
    Q, _ = torch.linalg.qr(torch.randn(d + 1, d + 1, generator=g, dtype=torch.float64))
    sigma = torch.linspace(4.0, 1.0, dh, dtype=torch.float64)  # distinct: the singular basis is unique
    A_q, A_k = Q[:, :dh] * sigma, Q[:, :dh]
    qk = QKHeads(A_q[None], A_k[None])
    feats = torch.randint(0, dh, (16, 10), generator=g)
    x = Q[:, :dh].T[feats] + 0.01 * torch.randn(16, 10, d + 1, generator=g, dtype=torch.float64)
    U = qk.basis()
    st = sad_pairs(x, x, causal_visibility(torch.ones(16, 10, dtype=torch.long)), qk, U, rotated_bases(U))
    assert st.sparsity.mean() < 0.5 * st.sparsity_rotated.mean()
    assert st.n_recon.float().median() <= 2


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.5"])
def test_threshold_outside_unit_interval_fails(bad):
    qk, x, mask = make_case(False)
    U = qk.basis()
    with pytest.raises(ValueError, match=r"threshold=.* is outside \[0, 1\]"):
        sad_pairs(x, x, causal_visibility(mask), qk, U, U, threshold=bad)


def test_empty_batch_fails():
    qk, x, mask = make_case(False)
    U = qk.basis()
    with pytest.raises(ValueError, match="empty batch"):
        sad_pairs(x[:0], x[:0], causal_visibility(mask[:0]), qk, U, U)
