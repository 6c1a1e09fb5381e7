"""lit_svd.linalg against independent dense computations."""

import math

import pytest
import torch

from lit_svd.linalg import (
    SVD,
    FactoredABt,
    abs_cosine,
    align_directions,
    average_ranks,
    direction_blocks,
    haar_orthogonal,
    match_directions,
    orthogonality_to_others,
    rolls_tovee_sparsity,
    sign_fixed,
    spearman,
    svd_dense,
    svd_factored,
)


@pytest.mark.parametrize("m,n,r", [(33, 20, 5), (10, 40, 12), (7, 7, 7)])
def test_factored_svd_matches_dense(m, n, r):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, m, r, generator=g, dtype=torch.float64)
    B = torch.randn(3, n, r, generator=g, dtype=torch.float64)
    M = A @ B.mT
    fac = FactoredABt(A, B).svd()
    dense = torch.linalg.svdvals(M)
    k = min(m, n, r)
    assert fac.S.shape == (3, k)
    torch.testing.assert_close(fac.S, dense[:, :k], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fac.dense(), M, rtol=1e-10, atol=1e-10)
    eye = torch.eye(k, dtype=torch.float64).expand(3, k, k)
    torch.testing.assert_close(fac.U.mT @ fac.U, eye, atol=1e-10, rtol=0)
    torch.testing.assert_close(fac.V.mT @ fac.V, eye, atol=1e-10, rtol=0)


def test_factored_svd_float32_tolerance():
    A, B = torch.randn(769, 64), torch.randn(769, 64)
    fac = svd_factored(A, B)
    dense = svd_dense(A @ B.T)
    rel = ((fac.S - dense.S[:64]).abs() / dense.S[:64]).max()
    assert rel < 1e-4


def test_factored_matrix_rejects_mismatched_factors():
    with pytest.raises(ValueError, match="factors do not match"):
        FactoredABt(torch.randn(4, 3), torch.randn(5, 2))


def test_abs_cosine_brute_force():
    X, Y = torch.randn(6, 3), torch.randn(6, 4)
    brute = torch.tensor(
        [
            [abs(torch.dot(X[:, i], Y[:, j]).item()) / (X[:, i].norm() * Y[:, j].norm()).item() for j in range(4)]
            for i in range(3)
        ]
    )
    torch.testing.assert_close(abs_cosine(X, Y), brute, atol=1e-6, rtol=1e-6)


def test_rolls_tovee_bounds():
    n = 8
    one_hot = torch.zeros(n)
    one_hot[3] = 2.0
    assert math.isclose(rolls_tovee_sparsity(one_hot).item(), 1 / n, rel_tol=1e-6)
    assert math.isclose(rolls_tovee_sparsity(torch.full((n,), -1.5)).item(), 1.0, rel_tol=1e-6)
    c = torch.randn(100, n)
    s = rolls_tovee_sparsity(c)
    brute = torch.stack([(row.abs().mean() ** 2) / (row**2).mean() for row in c])
    torch.testing.assert_close(s, brute)


def test_haar_orthogonal_is_orthogonal_and_seeded():
    Q = haar_orthogonal(16, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(Q @ Q.mT, torch.eye(16, dtype=torch.float64).expand(4, 16, 16), atol=1e-12, rtol=0)
    Q2 = haar_orthogonal(16, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.equal(Q, Q2)
    # Haar: the distribution of the top-left entry has mean ~0 (a sign-biased QR would not)
    many = haar_orthogonal(8, 4000, generator=torch.Generator().manual_seed(2))
    assert abs(many[:, 0, 0].mean().item()) < 0.05


def test_orthogonality_to_others():
    W = torch.eye(4)
    W[:, 3] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    out = orthogonality_to_others(W, torch.tensor([0, 2]))
    torch.testing.assert_close(out, torch.tensor([2**-0.5, 0.0]))


@pytest.mark.parametrize("n, levels", [(50, 6), (200, 1000), (7, 2)])
def test_spearman_and_average_ranks_match_scipy_with_ties(n, levels):
    from scipy import stats

    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, levels, (n,), generator=g).float()  # few levels: many ties
    y = x + torch.randint(0, levels, (n,), generator=g).float()
    torch.testing.assert_close(
        average_ranks(x), torch.from_numpy(stats.rankdata(x.numpy()) - 1).double(), rtol=0, atol=0
    )
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert spearman(x.reshape(-1, 1), -x) == pytest.approx(-1.0)


def test_spearman_is_nan_where_undefined():
    x = torch.arange(5.0)
    assert math.isnan(spearman(torch.ones(5), x))  # a constant side
    assert math.isnan(spearman(x, torch.tensor([0.0, 1.0, float("nan"), 3.0, 4.0])))
    with pytest.raises(ValueError, match="one size; got 5 and 4"):
        spearman(x, x[:4])


# --- blocks, rank, matching ------------------------------------------------------------------------------


def _with_spectrum(S, m=12, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    U = haar_orthogonal(m, columns=len(S), generator=g, dtype=torch.float64)
    V = haar_orthogonal(n, columns=len(S), generator=g, dtype=torch.float64)
    return SVD(U, torch.tensor(S, dtype=torch.float64), V)


def test_direction_blocks_against_a_hand_count():
    # gaps: 10->9.9 (1 %) joins, 9.9->5 splits, 5->4.9 joins, 4.9->4.8 joins (chain), 4.8->1 splits, then 0s
    S = torch.tensor([10.0, 9.9, 5.0, 4.9, 4.8, 1.0, 0.0, 0.0], dtype=torch.float64)
    b = direction_blocks(S, rel_gap=0.05)
    assert b.block.tolist() == [0, 0, 1, 1, 1, 2, 3, 3]
    assert b.size.tolist() == [2, 2, 3, 3, 3, 1, 2, 2]
    assert b.isolated.tolist() == [False] * 5 + [True, False, False]
    assert int(b.rank) == 6
    expect = [min(1.0, (9.9 - 5) / 9.9)] * 2 + [min((9.9 - 5) / 9.9, (4.8 - 1) / 4.8)] * 3 + [min((4.8 - 1) / 4.8, 1.0)]
    assert torch.allclose(b.gap[:6], torch.tensor(expect, dtype=torch.float64), atol=1e-12)
    # batched == one at a time
    SS = torch.stack([S, torch.tensor([3.0, 2.0, 1.99, 1.0, 0.5, 0.2, 0.1, 0.05], dtype=torch.float64)])
    bb = direction_blocks(SS)
    for i in range(2):
        one = direction_blocks(SS[i])
        assert torch.equal(bb.block[i], one.block) and torch.allclose(bb.gap[i], one.gap)


def test_rank_matches_torch_matrix_rank():
    g = torch.Generator().manual_seed(1)
    M = torch.randn(20, 5, generator=g, dtype=torch.float64) @ torch.randn(5, 16, generator=g, dtype=torch.float64)
    assert int(direction_blocks(svd_dense(M).S, size=20).rank) == int(torch.linalg.matrix_rank(M)) == 5


def test_sign_fixed_keeps_the_product():
    s = _with_spectrum([5.0, 3.0, 1.0])
    f = sign_fixed(SVD(-s.U, s.S, -s.V))
    assert torch.allclose(f.dense(), s.dense(), atol=1e-12)
    assert torch.equal(sign_fixed(s).U, f.U)


def test_matching_recovers_sign_flips_permutation_and_block_rotation():
    S = [9.0, 6.0, 4.0, 3.99, 3.98, 2.0, 1.0]  # one block of three (3 % gaps) between isolated directions
    ref = _with_spectrum(S)
    g = torch.Generator().manual_seed(3)
    R = haar_orthogonal(3, generator=g, dtype=torch.float64)
    U, V = ref.U.clone(), ref.V.clone()
    U[:, 2:5], V[:, 2:5] = U[:, 2:5] @ R, V[:, 2:5] @ R  # another valid SVD of (nearly) the same matrix
    flip = torch.tensor([1, -1, 1, 1, -1, -1, 1], dtype=torch.float64)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])  # new[j] = old[perm[j]]
    new = SVD((U * flip)[:, perm], ref.S[perm], (V * flip)[:, perm])
    m = match_directions(ref, new)
    inv = perm.argsort()
    iso = torch.tensor([0, 1, 5, 6])
    assert torch.equal(m.index[iso], inv[iso])
    assert torch.equal(m.sign[iso], flip[iso])
    assert torch.allclose(m.cos[iso], torch.ones(4, dtype=torch.float64), atol=1e-10)
    assert sorted(m.index[2:5].tolist()) == sorted(inv[2:5].tolist())
    assert torch.allclose(m.block_cos, torch.ones(7, dtype=torch.float64), atol=1e-10)
    aligned, _ = align_directions(ref, new)
    assert torch.allclose(aligned.U[:, iso], ref.U[:, iso], atol=1e-10)
    assert torch.allclose(aligned.V[:, 2:5] @ aligned.V[:, 2:5].mT, ref.V[:, 2:5] @ ref.V[:, 2:5].mT, atol=1e-10)


def test_matching_reports_a_changed_direction():
    ref = _with_spectrum([5.0, 3.0, 1.0])
    other = _with_spectrum([5.0, 3.0, 1.0], seed=7)  # unrelated vectors: cosines far below 1
    m = match_directions(ref, other)
    assert m.cos.abs().max() < 0.9 and m.block_cos.max() < 0.9
