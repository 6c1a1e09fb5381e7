"""Pure alignment analysis, each against an independent computation (numpy / scipy / brute-force loops)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from lit_svd.analysis.alignment import (
    alignment_report,
    attended_orthogonality,
    interference,
    least_squares_omega,
    match_pairs,
    omega_svd,
    spearman,
    theorem1_report,
    whitened_feature,
)
from lit_svd.modules.toy_features import features_with_interference

TOL = 1e-5


def brute_interference(W: np.ndarray) -> float:
    n = W.shape[1]
    cos = np.array(
        [[W[:, a] @ W[:, b] / np.linalg.norm(W[:, a]) / np.linalg.norm(W[:, b]) for b in range(n)] for a in range(n)]
    )
    return float(np.abs(np.linalg.eigvalsh(cos - np.eye(n))).max())


def test_interference_matches_brute_force():
    W = torch.randn(3, 7, 12, dtype=torch.float64)
    got = interference(W)
    for n in range(3):
        assert got[n].item() == pytest.approx(brute_interference(W[n].numpy()), abs=1e-10)


@pytest.mark.parametrize("n,d,target", [(8, 8, 0.0), (8, 8, 1.0), (16, 16, 7.5), (64, 64, 50.0), (30, 10, 8.0)])
def test_features_reach_requested_interference(n, d, target):
    X, reached = features_with_interference(n, d, target, torch.Generator().manual_seed(3))
    assert X.shape == (d, n)
    assert torch.allclose(X.norm(dim=0), torch.ones(n), atol=1e-5)
    assert brute_interference(X.double().numpy()) == pytest.approx(target, abs=1e-3 * max(1, target))
    assert reached == pytest.approx(target, abs=1e-3 * max(1, target))


def test_orthonormal_base_gives_equicorrelated_features():
    X, _ = features_with_interference(10, 12, 4.5, torch.Generator().manual_seed(0))
    G = (X.double().T @ X.double()).numpy()
    off = G[~np.eye(10, dtype=bool)]
    assert np.allclose(off, 4.5 / 9, atol=1e-5)  # ||E||_2 = rho (N - 1)


def test_unreachable_interference_fails_with_one_line():
    with pytest.raises(ValueError, match=r"^interference=60.0: must lie in \[0, 9\) for n_features=10") as err:
        features_with_interference(10, 10, 60.0, torch.Generator().manual_seed(0))
    assert "\n" not in str(err.value)


def test_omega_svd_matches_dense_svd():
    W_Q, W_K = torch.randn(4, 5, 9, dtype=torch.float64), torch.randn(4, 5, 9, dtype=torch.float64)
    svd = omega_svd(W_Q, W_K)
    dense = W_Q.mT @ W_K
    S_ref = torch.linalg.svdvals(dense)[:, :5]
    assert torch.allclose(svd.S, S_ref, atol=1e-10)
    assert torch.allclose(svd.dense(), dense, atol=1e-10)


def test_match_pairs_finds_the_planted_singular_index():
    # orthonormal features; Omega = sum_p target_p w_i w_j^T with distinct targets -> known SVD order
    W = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64))[0]
    pairs = [(0, 5, 0.5), (1, 6, 2.0), (2, 7, 1.0)]
    omega = sum(t * torch.outer(W[:, i], W[:, j]) for i, j, t in pairs)
    U, S, Vh = torch.linalg.svd(omega)
    cos_u = (W.T @ U).abs()
    cos_v = (W.T @ Vh.T).abs()
    matched = match_pairs(cos_u, cos_v, pairs)
    assert [m["singular_index"] for m in matched] == [2, 0, 1]
    for m in matched:
        assert m["cos_query"] == pytest.approx(1.0, abs=1e-8) and m["cos_key"] == pytest.approx(1.0, abs=1e-8)


def test_match_pairs_brute_force_on_random_cosines():
    g = torch.Generator().manual_seed(1)
    cos_u, cos_v = torch.rand(10, 6, generator=g), torch.rand(10, 6, generator=g)
    pairs = [(a, b, 1.0) for a, b in [(0, 1), (3, 9), (4, 4)]]
    for m in match_pairs(cos_u, cos_v, pairs):
        i, j = m["query_feature"], m["key_feature"]
        best = max(range(6), key=lambda k: float(cos_u[i, k]) * float(cos_v[j, k]))
        assert m["singular_index"] == best


def test_spearman_matches_scipy_with_ties():
    x = torch.tensor([3.0, 1.0, 2.0, 2.0, 5.0, 4.0])
    y = torch.tensor([10.0, 1.0, 4.0, 3.0, 9.0, 9.0])
    assert spearman(x, y) == pytest.approx(spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12)


def test_whitened_feature_matches_solve():
    X = torch.randn(6, 6, dtype=torch.float64)
    ref = np.linalg.solve(X.numpy() @ X.numpy().T, X[:, 2].numpy())
    assert np.allclose(whitened_feature(X, 2).numpy(), ref, atol=1e-8)


def test_least_squares_omega_matches_a_direct_regression():
    """Fit Omega by ordinary least squares over random feature pairs (kron design) and compare."""
    g = torch.Generator().manual_seed(0)
    D, N = 4, 4
    X = torch.randn(D, N, generator=g, dtype=torch.float64)
    T = torch.zeros(N, N, dtype=torch.float64)
    T[0, 1] = 1.0
    F, G = torch.rand(400, N, generator=g, dtype=torch.float64), torch.rand(400, N, generator=g, dtype=torch.float64)
    r, s = F @ X.T, G @ X.T  # tokens
    design = torch.einsum("bi,bj->bij", r, s).reshape(400, D * D)  # logit = vec(r s^T) . vec(Omega)
    target = torch.einsum("bn,nm,bm->b", F, T, G)
    omega_ols = torch.linalg.lstsq(design, target[:, None]).solution.reshape(D, D)
    assert torch.allclose(least_squares_omega(X, X, T), omega_ols, atol=1e-8)


def test_theorem1_prediction_is_exact_for_the_least_squares_optimum():
    X, _ = features_with_interference(8, 8, 5.0, torch.Generator().manual_seed(2))
    X = X.double()
    T = torch.zeros(8, 8, dtype=torch.float64)
    T[0, 1] = 1.0
    omega = least_squares_omega(X, X, T)
    U, S, Vh = torch.linalg.svd(omega)
    # factor the optimum as W_Q^T W_K with H = D and check through the report
    from lit_svd.linalg import SVD

    rep = theorem1_report(SVD(U, S, Vh.T), X, X, 0, 1)
    assert rep["cos_u1_prediction"] == pytest.approx(1.0, abs=1e-8)
    assert rep["cos_v1_prediction"] == pytest.approx(1.0, abs=1e-8)
    assert rep["cos_u1_raw"] < 0.9  # at ||E_X|| = 5 the raw feature is clearly off


def test_attended_orthogonality_brute_force():
    W = torch.randn(5, 9, dtype=torch.float64)
    attended = [0, 3, 3, 7]
    rep = attended_orthogonality(W, attended)
    Wn = (W / W.norm(dim=0)).numpy()
    others = [k for k in range(9) if k not in attended]
    ref_att = np.mean([max(abs(Wn[:, a] @ Wn[:, o]) for o in others) for a in (0, 3, 7)])
    ref_un = np.mean([max(abs(Wn[:, a] @ Wn[:, o]) for o in others if o != a) for a in others])
    assert rep["attended_max_cos_to_others"] == pytest.approx(ref_att, abs=1e-10)
    assert rep["unattended_max_cos_to_unattended"] == pytest.approx(ref_un, abs=1e-10)


def test_alignment_report_on_a_planted_solution():
    """Head weights built so that Omega = 3 w_0 w_1^T + w_2 w_3^T exactly: cos 1, indices 0 and 1."""
    W = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))[0][None]  # [1, D, N]
    W_Q = torch.stack([3 * W[0, :, 0], W[0, :, 2], torch.zeros(6, dtype=torch.float64)])[None]
    W_K = torch.stack([W[0, :, 1], W[0, :, 3], torch.zeros(6, dtype=torch.float64)])[None]
    T = torch.zeros(6, 6, dtype=torch.float64)
    T[0, 1], T[2, 3] = 3.0, 1.0
    rep = alignment_report(W, W_Q, W_K, T, [(0, 1, 3.0), (2, 3, 1.0)], frozen=True)[0]
    assert [m["singular_index"] for m in rep["pairs"]] == [0, 1]
    assert rep["mean_abs_cos"] == pytest.approx(1.0, abs=TOL)
    assert rep["sigma_ratio"] == pytest.approx(3.0, abs=TOL)
    assert rep["spearman_sigma_target"] == pytest.approx(1.0)
    assert rep["theorem1"]["cos_u1_prediction"] == pytest.approx(1.0, abs=TOL)
    assert all(m["cos_query_prediction"] == pytest.approx(1.0, abs=TOL) for m in rep["pairs"])
