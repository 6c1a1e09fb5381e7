"""lit_svd.linalg against independent dense computations."""
import math

import pytest
import torch

from lit_svd.linalg import (FactoredMatrix, abs_cosine, average_ranks, haar_orthogonal, orthogonality_to_others,
                            rolls_tovee_sparsity, spearman, svd_dense, svd_factored)


@pytest.mark.parametrize("m,n,r", [(33, 20, 5), (10, 40, 12), (7, 7, 7)])
def test_factored_svd_matches_dense(m, n, r):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, m, r, generator=g, dtype=torch.float64)
    B = torch.randn(3, n, r, generator=g, dtype=torch.float64)
    M = A @ B.mT
    fac = FactoredMatrix(A, B).svd()
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
        FactoredMatrix(torch.randn(4, 3), torch.randn(5, 2))


def test_abs_cosine_brute_force():
    X, Y = torch.randn(6, 3), torch.randn(6, 4)
    brute = torch.tensor([[abs(torch.dot(X[:, i], Y[:, j]).item()) / (X[:, i].norm() * Y[:, j].norm()).item()
                           for j in range(4)] for i in range(3)])
    torch.testing.assert_close(abs_cosine(X, Y), brute, atol=1e-6, rtol=1e-6)


def test_rolls_tovee_bounds():
    n = 8
    one_hot = torch.zeros(n); one_hot[3] = 2.0
    assert math.isclose(rolls_tovee_sparsity(one_hot).item(), 1 / n, rel_tol=1e-6)
    assert math.isclose(rolls_tovee_sparsity(torch.full((n,), -1.5)).item(), 1.0, rel_tol=1e-6)
    c = torch.randn(100, n)
    s = rolls_tovee_sparsity(c)
    brute = torch.stack([(row.abs().mean() ** 2) / (row ** 2).mean() for row in c])
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
    torch.testing.assert_close(out, torch.tensor([2 ** -0.5, 0.0]))


@pytest.mark.parametrize("n, levels", [(50, 6), (200, 1000), (7, 2)])
def test_spearman_and_average_ranks_match_scipy_with_ties(n, levels):
    from scipy import stats

    g = torch.Generator().manual_seed(n)
    x = torch.randint(0, levels, (n,), generator=g).float()  # few levels: many ties
    y = x + torch.randint(0, levels, (n,), generator=g).float()
    torch.testing.assert_close(average_ranks(x), torch.from_numpy(stats.rankdata(x.numpy()) - 1).double(),
                               rtol=0, atol=0)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert spearman(x.reshape(-1, 1), -x) == pytest.approx(-1.0)


def test_spearman_is_nan_where_undefined():
    x = torch.arange(5.0)
    assert math.isnan(spearman(torch.ones(5), x))  # a constant side
    assert math.isnan(spearman(x, torch.tensor([0.0, 1.0, float("nan"), 3.0, 4.0])))
    with pytest.raises(ValueError, match="one size; got 5 and 4"):
        spearman(x, x[:4])
