"""lit_svd.analysis.mounts against dense SVDs, brute-force loops over mounts and tokens, and scipy."""

import numpy as np
import pytest
import torch

from lit_svd.analysis import mounts as M


def _weights(d_out=24, d_in=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a few strong directions plus noise, so that strategies differ
    W = torch.randn(d_out, 3, generator=g, dtype=torch.float64) @ torch.randn(3, d_in, generator=g, dtype=torch.float64)
    return W + 0.3 * torch.randn(d_out, d_in, generator=g, dtype=torch.float64)


def _data(W, T=300, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, W.shape[1], generator=g, dtype=torch.float64) * torch.linspace(
        0.2, 2.0, W.shape[1], dtype=torch.float64
    )
    dh = x @ W.mT + 0.1 * torch.randn(T, W.shape[0], generator=g, dtype=torch.float64)
    return x, dh


@pytest.mark.parametrize("shape", [(24, 70), (70, 24), (16, 16)])
def test_top_svd_matches_dense(shape):
    W = _weights(*shape)
    k = 5
    top = M.top_svd(W, k)
    U, S, Vh = top.U, top.S, top.V.mT
    U0, S0, Vh0 = torch.linalg.svd(W, full_matrices=False)
    torch.testing.assert_close(S, S0[:k], rtol=1e-10, atol=1e-10)
    # same singular vectors up to sign
    torch.testing.assert_close((U * U0[:, :k]).sum(0).abs(), torch.ones(k, dtype=torch.float64), rtol=0, atol=1e-8)
    torch.testing.assert_close((Vh * Vh0[:k]).sum(1).abs(), torch.ones(k, dtype=torch.float64), rtol=0, atol=1e-8)


def test_mounts_reproduce_their_tile_write():
    """The SVD identity: with every mode of a tile kept, sum_j sigma_j u_j (v_j . x) equals B_t x_t."""
    W = _weights(24, 70)
    x, _ = _data(W, T=50)
    width = 16
    mounts = M.tiled_svd_mounts(W, width, 16)  # 16 = the full tile rank (last tile: 6 columns, rank 6)
    assert len(mounts) == 4 * 16 + 6
    for t, (s, e) in enumerate(M.tile_bounds(70, width)):
        j = mounts.tile == t
        recon = (x @ mounts.V[:, j] * mounts.S[j]) @ mounts.U[:, j].mT
        torch.testing.assert_close(recon, x[:, s:e] @ W[:, s:e].mT, rtol=1e-9, atol=1e-9)
        assert torch.all(mounts.V[:s, j] == 0) and torch.all(mounts.V[e:, j] == 0)  # triggers stay in the tile
    # with k < rank, each mount still satisfies B_t^T u_j = sigma_j v_j (what A3 measures on data)
    two = M.tiled_svd_mounts(W, width, 2)
    for j in range(len(two)):
        s, e = M.tile_bounds(70, width)[two.tile[j]]
        torch.testing.assert_close(W[:, s:e].mT @ two.U[:, j], two.S[j] * two.V[s:e, j], rtol=1e-9, atol=1e-9)


def test_whole_matrix_mounts_are_the_top_singular_vectors():
    W = _weights()
    m = M.whole_svd_mounts(W, 6)
    U0, S0, _ = torch.linalg.svd(W, full_matrices=False)
    torch.testing.assert_close(m.S, S0[:6], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close((m.U * U0[:, :6]).sum(0).abs(), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-8)


def test_baselines_are_seeded_and_reproducible():
    W = _weights()
    a, b, c = (
        M.column_sample_mounts(W, 8, seed=0),
        M.column_sample_mounts(W, 8, seed=0),
        M.column_sample_mounts(W, 8, seed=5),
    )
    assert torch.equal(a.U, b.U) and torch.equal(a.V, b.V)
    assert not torch.equal(a.V, c.V)
    # each column mount is its normalised column, triggered by that input axis, sorted by norm
    cols = a.V.argmax(0)
    torch.testing.assert_close(a.U, W[:, cols] / W[:, cols].norm(dim=0), rtol=1e-12, atol=1e-12)
    assert torch.all(a.S[:-1] >= a.S[1:])
    r1, r2, r3 = (
        M.random_mounts(24, 70, 5, seed=0),
        M.random_mounts(24, 70, 5, seed=0),
        M.random_mounts(24, 70, 5, seed=1),
    )
    assert torch.equal(r1.U, r2.U) and torch.equal(r1.V, r2.V) and not torch.equal(r1.U, r3.U)
    torch.testing.assert_close(r1.U.norm(dim=0), torch.ones(5, dtype=torch.float64))
    ref = M.reference_directions(24, 4)
    torch.testing.assert_close(ref[:, 3:4], M.random_units(24, 1, 10007 + 997 * 3))


def test_column_sampling_never_draws_zero_columns():
    W = _weights(24, 40)
    W[:, ::2] = 0.0
    m = M.column_sample_mounts(W, 10, seed=3)
    assert set(m.V.argmax(0).tolist()) <= set(range(1, 40, 2))


def test_strategies_share_the_tiled_budget():
    W = _weights(24, 70)
    strategies = M.strategy_mounts(W, 32, 3)
    assert {len(m) for m in strategies.values()} == {3 * 3}


def _brute(plan, x, dh, k_active):
    """Loops over mounts and tokens in numpy float64: the quantities summarize() reports."""
    X, D = x.numpy(), dh.numpy()
    n2 = (D**2).sum(1) + M.EPS
    ref = plan.ref.numpy()
    out = {}
    for s in M.STRATEGIES:
        U = plan.strategies[s].U.numpy()
        lifts = [
            np.mean([(D[t] @ U[:, j]) ** 2 / n2[t] for t in range(len(D))])
            - np.mean([(D[t] @ ref[:, j]) ** 2 / n2[t] for t in range(len(D))])
            for j in range(U.shape[1])
        ]
        out[f"lift_{s}"] = float(np.mean(lifts))
        Q, _ = np.linalg.qr(U)
        out[f"span_{s}"] = float(np.mean([np.sum((Q.T @ D[t]) ** 2) / n2[t] for t in range(len(D))]))
    cov = []
    for _, tiled, rand in plan.coverage:
        fr = []
        for cd in (tiled, rand):
            A = cd.D.numpy()
            resid = 0.0
            for t in range(len(D)):
                idx = np.argsort(-np.abs(D[t] @ A))[:k_active]
                coef, *_ = np.linalg.lstsq(A[:, idx], D[t], rcond=None)
                resid += np.sum((D[t] - A[:, idx] @ coef) ** 2)
            fr.append(1 - resid / np.sum(D**2))
        cov.append(fr[0] - fr[1])
    out["coverage_lift"] = cov
    tiled = plan.strategies["tiled"]
    tl = []
    for j in range(len(tiled)):
        s, e = plan.tiles[tiled.tile[j]]
        tw = X[:, s:e] @ plan.W.numpy()[:, s:e].T
        tn = (tw**2).sum(1) + M.EPS
        tl.append(np.mean((tw @ tiled.U[:, j].numpy()) ** 2 / tn) - np.mean((tw @ ref[:, j]) ** 2 / tn))
    out["tile_lift"] = tl
    return out


def test_streamed_sums_match_brute_force():
    W = _weights(24, 70)
    x, dh = _data(W, T=120)
    plan = M.plan_site(W, 16, 2, [1, 2, 4], k_active=3, seed=0)
    # streaming over two batches equals one pass
    sums = M.add_sums(M.site_sums(plan, x[:50], dh[:50]), M.site_sums(plan, x[50:], dh[50:]))
    one = M.site_sums(plan, x, dh)
    assert sums.keys() == one.keys() == M.sum_shapes(plan.n, 3, 24).keys()
    for name, shape in M.sum_shapes(plan.n, 3, 24).items():
        assert tuple(sums[name].shape) == shape, name
        torch.testing.assert_close(sums[name], one[name], rtol=1e-6, atol=1e-6)
    row = M.summarize(plan, sums)
    ref = _brute(plan, x, dh, 3)
    # float32 projections inside site_sums: agreement to ~1e-6 of quantities of order 0.1-1
    for s in M.STRATEGIES:
        assert row[f"lift_{s}"] == pytest.approx(ref[f"lift_{s}"], abs=2e-6)
        assert row[f"span_{s}"] == pytest.approx(ref[f"span_{s}"], abs=2e-6)
    np.testing.assert_allclose(row["coverage_lift"], ref["coverage_lift"], atol=2e-6)
    np.testing.assert_allclose(row["tile_lift"], ref["tile_lift"], atol=2e-6)
    assert row["identity_rel_err"] < 1e-5
    assert row["n_tokens"] == 120 and row["n_mounts"] == 10
    assert row["lift_tiled"] > row["lift_random"] + 0.05  # the planted structure is found


def test_sparse_fit_with_dependent_atoms_is_least_squares():
    g = torch.Generator().manual_seed(0)
    D = torch.randn(10, 6, generator=g, dtype=torch.float64)
    D = torch.cat([D, D[:, :2]], dim=1)  # duplicated atoms: singular Gram blocks
    cd = M.CoverageDict.of(D)
    dh = torch.randn(40, 10, generator=g, dtype=torch.float64)
    got = M.sparse_explained(dh @ cd.D, cd.G, 4).item()
    want = 0.0
    for t in range(40):
        idx = (dh[t] @ cd.D).abs().topk(4).indices
        A = cd.D[:, idx].numpy()
        coef, *_ = np.linalg.lstsq(A, dh[t].numpy(), rcond=None)
        want += float(np.sum((A @ coef) ** 2))
    assert got == pytest.approx(want, rel=1e-8)


def test_ridge_map_is_least_squares():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 8, generator=g, dtype=torch.float64)
    Wt = torch.randn(5, 8, generator=g, dtype=torch.float64)
    Z = X @ Wt.mT + 0.01 * torch.randn(200, 5, generator=g, dtype=torch.float64)
    W = M.ridge_map(X.mT @ X, X.mT @ Z, 0.0)
    sol, *_ = np.linalg.lstsq(X.numpy(), Z.numpy(), rcond=None)
    np.testing.assert_allclose(W.numpy(), sol.T, rtol=1e-8, atol=1e-10)
    lam = 0.1 * torch.trace(X.mT @ X) / 8
    W2 = M.ridge_map(X.mT @ X, X.mT @ Z, 0.1)
    np.testing.assert_allclose(
        W2.numpy(),
        np.linalg.solve((X.mT @ X + lam * torch.eye(8, dtype=torch.float64)).numpy(), (X.mT @ Z).numpy()).T,
        rtol=1e-10,
    )


def test_gate_weighted_scales_rows():
    W = torch.randn(6, 4, dtype=torch.float64)
    g = torch.rand(6, dtype=torch.float64)
    torch.testing.assert_close(M.gate_weighted(W, g), torch.diag(g) @ W)


def test_spearman_and_jaccard_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(500, generator=g, dtype=torch.float64)
    b = a + torch.randn(500, generator=g, dtype=torch.float64)
    assert M.spearman(a, b) == pytest.approx(stats.spearmanr(a.numpy(), b.numpy()).statistic, abs=1e-12)
    assert M.spearman(a, -a) == pytest.approx(-1.0)
    x = torch.arange(30.0)
    y = torch.cat([torch.arange(10.0) + 100, torch.arange(20.0)])  # top-20 of y: indices 0..9 and 20..29
    assert M.topk_jaccard(x, y, 20) == pytest.approx(10 / 30)  # top-20 of x: 10..29 -> overlap 20..29


def _row(**kw):
    row = {
        "layer": 10,
        "lift_tiled": 0.05,
        "lift_whole": 0.05,
        "lift_columns": 0.04,
        "lift_random": 0.0,
        "identity_rel_err": 1e-7,
        "coverage_lift": [0.30, 0.31, 0.32, 0.32, 0.31],
        "steer_rho": 0.2,
        "steer_jaccard": 0.0,
    }
    row.update(kw)
    return row


def test_pass_rules_follow_the_thresholds():
    rules = M.MountRules()
    assert M.judge(_row(), rules, residual=True, effective=False)["pass"]
    assert not M.judge(_row(lift_tiled=0.004), rules, residual=False, effective=False)["A1"]
    assert M.judge(_row(lift_tiled=0.004, lift_whole=0.004, lift_columns=0.0), rules, residual=False, effective=True)[
        "A1"
    ]
    assert not M.judge(_row(lift_columns=0.053), rules, residual=True, effective=False)["A2"]
    assert not M.judge(_row(identity_rel_err=1e-2), rules, residual=True, effective=False)["A3"]
    # A4: 0.05 vs whole 0.07 fails on residual writes (slack 0.002, ratio 0.71 < 0.80), passes elsewhere (0.71 >= 0.70)
    assert not M.judge(_row(lift_whole=0.07), rules, residual=True, effective=False)["A4"]
    assert M.judge(_row(lift_whole=0.07), rules, residual=False, effective=False)["A4"]
    # B1: peak floor, early saturation, no collapse
    assert not M.judge(_row(coverage_lift=[0.1, 0.1, 0.2, 0.2, 0.2]), rules, residual=True, effective=False)["B1"]
    assert not M.judge(_row(coverage_lift=[0.1, 0.15, 0.20, 0.30, 0.30]), rules, residual=True, effective=False)["B1"]
    assert not M.judge(_row(coverage_lift=[0.3, 0.3, 0.3, 0.3, 0.1]), rules, residual=True, effective=False)["B1"]
    assert M.judge(_row(coverage_lift=[0.10, 0.14, 0.16, 0.16, 0.16]), rules, residual=False, effective=False)["B1"]
    # C1 only on residual writes at layer >= c1_min_layer
    assert not M.judge(_row(steer_rho=0.01, steer_jaccard=0.01), rules, residual=True, effective=False)["C1"]
    assert (
        M.judge(_row(steer_rho=0.01, steer_jaccard=0.01, layer=3), rules, residual=True, effective=False)["C1"] is None
    )
    assert M.judge(_row(steer_rho=0.01), rules, residual=False, effective=False)["C1"] is None
    strict = M.MountRules.from_dict({"a1_margin": 0.06})
    assert not M.judge(_row(), strict, residual=True, effective=False)["pass"]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda W: M.tiled_svd_mounts(W, 0, 2), r"tile_width=0 .* 1\.\.70"),
        (lambda W: M.tiled_svd_mounts(W, 71, 2), r"tile_width=71 .* 1\.\.70"),
        (lambda W: M.tiled_svd_mounts(W, 8, 9), r"modes_per_tile=9 .* 1\.\.8"),
        (lambda W: M.plan_site(W, 16, 2, [1, 32], 8), r"modes_sweep=32"),
        (lambda W: M.plan_site(W, 16, 2, [1, 2], 0), r"k_active=0"),
        (lambda W: M.whole_svd_mounts(W, 30), r"mount budget 30 exceeds"),
        (lambda W: M.MountRules.from_dict({"a1_marign": 0.1}), r"rules key 'a1_marign' is unknown"),
        (lambda W: M.ridge_map(torch.eye(2), torch.eye(2), -1.0), r"v_ridge=-1.0"),
    ],
)
def test_bad_input_fails_with_one_clear_line(call, match):
    with pytest.raises(ValueError, match=match) as err:
        call(_weights(24, 70))
    assert "\n" not in str(err.value)


# --- data ceiling, scaled tile widths, structureless null -------------------------------------------
def test_span_ceiling_is_the_top_principal_subspace_and_bounds_every_strategy():
    W = _weights(24, 70)
    x, dh = _data(W, T=200)
    plan = M.plan_site(W, 16, 2, [1, 2, 4], k_active=3, seed=0)
    row = M.summarize(plan, M.site_sums(plan, x, dh))
    # independent: PCA (uncentred) of the normalised outputs in numpy, then the span figure of its top n
    D = dh.numpy()
    Y = D / np.sqrt((D**2).sum(1) + M.EPS)[:, None]
    _, _, Vt = np.linalg.svd(Y, full_matrices=False)
    top = Vt[: plan.n].T
    want = float(np.mean([np.sum((top.T @ D[t]) ** 2) / ((D[t] ** 2).sum() + M.EPS) for t in range(len(D))]))
    assert row["span_ceiling"] == pytest.approx(want, abs=2e-6)
    # no n-dimensional subspace does better on these tokens: random ones and every strategy's span
    g = np.random.default_rng(0)
    for _ in range(20):
        Q, _ = np.linalg.qr(g.standard_normal((24, plan.n)))
        assert np.mean(((D @ Q) ** 2).sum(1) / ((D**2).sum(1) + M.EPS)) <= want + 1e-9
    for s in M.STRATEGIES:
        assert row[f"span_{s}"] <= row["span_ceiling"] + 1e-6
    for s in ("tiled", "whole", "columns"):
        assert row[f"span_lift_{s}"] <= row["span_lift_ceiling"] + 1e-6
        assert row[f"ceiling_fraction_{s}"] == pytest.approx(row[f"span_lift_{s}"] / row["span_lift_ceiling"])
    assert row["ceiling_fraction_whole"] < 1  # dh is not W x alone (noise), so the weights' SVD falls short


def test_input_side_ceiling_and_own_writes_equal_the_direct_sums():
    """A linear site with d_in + 1 < d_out sums the ceiling on the input side ([x, 1] / ||dh||, mapped back
    by [W | b]); ``dh=None`` scores the plan's own writes x W^T. Both equal the direct computation."""
    g = torch.Generator().manual_seed(5)
    W, b = torch.randn(40, 12, generator=g, dtype=torch.float64), torch.randn(40, generator=g, dtype=torch.float64)
    x = torch.randn(150, 12, generator=g, dtype=torch.float64)
    out = M.plan_site(W, 4, 2, [1, 2], k_active=3)  # ceiling on the output side
    inp = M.plan_site(W, 4, 2, [1, 2], k_active=3, linear=True, bias=b)
    assert out.affine is None and (out.gram_dim, inp.gram_dim) == (40, 13)
    dh = x @ W.mT + b
    a, c = M.site_sums(inp, x, dh), M.site_sums(out, x, dh)
    assert tuple(a["gram"].shape) == M.sum_shapes(inp.n, 2, inp.gram_dim)["gram"]
    assert M.summarize(inp, a)["span_ceiling"] == pytest.approx(M.summarize(out, c)["span_ceiling"], abs=1e-6)
    own, direct = M.site_sums(out, x, None), M.site_sums(out, x, x @ W.mT)
    for name in direct:
        torch.testing.assert_close(own[name], direct[name], rtol=1e-5, atol=1e-5)


def test_scaled_tile_widths_give_the_papers_tile_counts():
    # the paper's own setting (Gemma-2-2B) is reproduced exactly
    for site, d_in in M.PAPER_D_IN.items():
        assert M.scaled_tile_width(site, d_in) == M.PAPER_TILE_WIDTHS[site]
    assert {s: M.paper_tiles(s) for s in M.PAPER_D_IN} == {
        "q": 18,
        "k": 9,
        "v": 9,
        "o": 4,
        "gate": 5,
        "up": 5,
        "down": 18,
    }
    # SmolLM2-135M (d_model 576, 9 x 64 heads, d_mlp 1536) and GPT-2 (768, 12 x 64, 3072): same tile counts
    for d_model, d_o, d_mlp in ((576, 576, 1536), (768, 768, 3072)):
        d_in = {"q": d_model, "k": d_model, "v": d_model, "o": d_o, "gate": d_model, "up": d_model, "down": d_mlp}
        for site, d in d_in.items():
            width = M.scaled_tile_width(site, d)
            assert len(M.tile_bounds(d, width)) == M.paper_tiles(site), (d_model, site, width)
    assert [
        M.scaled_tile_width(s, d) for s, d in (("q", 576), ("k", 576), ("o", 576), ("gate", 576), ("down", 1536))
    ] == [32, 64, 144, 128, 86]


def test_mount_count_matches_the_mounts_built():
    W = _weights(24, 70)
    for width, modes in ((16, 2), (16, 9), (70, 3), (7, 7)):
        assert M.mount_count(70, 24, width, modes) == len(M.tiled_svd_mounts(W, width, modes))


def test_haar_null_keeps_the_spectrum_and_loses_the_vectors():
    W = _weights(24, 70)
    N = M.haar_null(W, seed=3)
    torch.testing.assert_close(torch.linalg.svdvals(N), torch.linalg.svdvals(W), rtol=1e-10, atol=1e-10)
    assert torch.equal(N, M.haar_null(W, seed=3)) and not torch.equal(N, M.haar_null(W, seed=4))
    u_w = torch.linalg.svd(W)[0][:, 0]
    u_n = torch.linalg.svd(N)[0][:, 0]
    assert abs(float(u_w @ u_n)) < 0.6  # W's planted top direction is not the null's (|cos| ~ 1/sqrt(24))


def _judged(W, x, dh, seed=0):
    plan = M.plan_site(W, 16, 2, [1, 2, 4, 8], k_active=3, seed=seed)
    row = {"layer": 0, **M.summarize(plan, M.site_sums(plan, x, dh))}
    return M.judge(row, M.MountRules(), residual=False, effective=False)


def test_null_of_a_structureless_matrix_is_non_discriminating():
    """When the 'real' matrix is itself structureless (Haar singular vectors, decaying spectrum, Gaussian
    inputs), its null passes every check exactly as often: the comparison must call them non-discriminating."""
    from lit_svd.analysis.mounts_tables import discrimination

    rows = []
    for layer in range(6):
        g = torch.Generator().manual_seed(layer)
        spectrum = torch.exp(-torch.arange(24, dtype=torch.float64) / 4)
        from lit_svd.linalg import haar_orthogonal

        U = haar_orthogonal(24, generator=g, dtype=torch.float64)
        V = haar_orthogonal(70, columns=24, generator=g, dtype=torch.float64)
        W = (U * spectrum) @ V.mT
        x = torch.randn(400, 70, generator=g, dtype=torch.float64)
        N = M.haar_null(W, seed=100 + layer)
        real, null = _judged(W, x, x @ W.mT), _judged(N, x, x @ N.mT)
        rows.append({"site": "q", "checks": real, "pass": real["pass"], "null": {"checks": null, "pass": null["pass"]}})
    verdict = discrimination(rows)
    assert [rows[i]["checks"]["A1"] for i in range(6)] == [True] * 6  # tiled beats random on both ...
    assert not any(v for v in verdict["q"].values() if v is not None)  # ... so nothing discriminates


def test_discrimination_counts_real_against_null_per_site():
    from lit_svd.analysis.mounts_tables import discrimination, pass_table

    def row(site, real, null):
        def mk(p):
            return {c: p for c in ("A1", "A2", "A3", "A4", "B1")} | {"C1": None, "pass": p}

        return {"site": site, "checks": mk(real), "pass": real, "null": {"checks": mk(null), "pass": null}}

    rows = (
        [row("q", True, False)] * 9
        + [row("q", True, True)]  # q: 10/10 real against 1/10 null
        + [row("o", True, True)] * 9
        + [row("o", True, False)]
    )  # o: 10/10 against 9/10, no difference
    assert pass_table(rows)["q"]["A1"] == "10/10" and pass_table(rows, null=True)["q"]["A1"] == "1/10"
    assert pass_table(rows, null=True)["all"]["pass"] == "10/20"
    d = discrimination(rows)
    assert d["q"]["A1"] is True and d["o"]["A1"] is False and d["q"]["C1"] is None
    assert d["all"]["pass"] is True  # 20/20 against 10/20


def test_discriminates_is_a_one_sided_fisher_test():
    from scipy.stats import hypergeom

    from lit_svd.analysis.mounts_tables import discriminates

    def p_value(p, n, q, m):  # P(real passes >= p | p + q passes among n + m), by the hypergeometric tail
        return hypergeom.sf(p - 1, n + m, p + q, n)

    for real, null in [
        ((30, 30), (29, 30)),
        ((30, 30), (11, 30)),
        ((30, 30), (26, 30)),
        ((30, 30), (25, 30)),
        ((5, 30), (0, 30)),
        ((12, 30), (25, 30)),
    ]:
        assert discriminates(real, null) == (p_value(*real, *null) < 0.05), (real, null)
    assert not discriminates((30, 30), (29, 30)) and discriminates((30, 30), (11, 30))


def test_site_summary_counts_per_site_layer():
    from lit_svd.analysis.mounts_tables import site_summary

    def row(layer, tiled, whole, span_t, span_w, ceiling):
        r = {
            "site": "o",
            "layer": layer,
            "lift_tiled": tiled,
            "lift_whole": whole,
            "span_lift_tiled": span_t,
            "span_lift_whole": span_w,
            "span_lift_ceiling": ceiling,
        }
        for s in ("tiled", "whole", "columns"):
            r[f"ceiling_fraction_{s}"] = r.get(f"span_lift_{s}", 0.0) / ceiling
        return r

    out = site_summary([row(0, 0.2, 0.1, 0.3, 0.4, 0.5), row(1, 0.05, 0.1, 0.45, 0.4, 0.5)])["o"]
    assert out["tiled_beats_whole_lift"] == 1 and out["tiled_beats_whole_span"] == 1
    assert out["ceiling_fraction_tiled"] == {
        "mean": pytest.approx(0.75),
        "min": pytest.approx(0.6),
        "max": pytest.approx(0.9),
    }
