"""Following singular directions over steps (``lit_svd.analysis.tracking``) against a planted truth: a
sequence of matrices whose singular directions are known, two of whose singular values cross, with random
sign flips and a small rotation per step, decomposed by LAPACK (which sorts and signs as it likes)."""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.tracking import DirectionTrack, track_scalars
from lit_svd.linalg import SVD, haar_orthogonal, svd_dense


def small_rotation(d: int, angle: float, g: torch.Generator) -> torch.Tensor:
    A = torch.randn(d, d, generator=g, dtype=torch.float64)
    return torch.linalg.matrix_exp(angle * (A - A.T) / 2)


def planted_sequence(steps: int = 9, d: int = 12, k: int = 5, seed: int = 0):
    """Matrices ``U_t diag(s_t) V_t^T`` with planted directions 0..k-1: direction 1's value falls from 3.0 to
    1.4 while direction 2's rises from 1.6 to 3.2 (they cross between steps 4 and 5, never within 5 % at a
    logged step), the others stay put; U_t, V_t drift by a small rotation per step. Returns the matrices and
    the truth (values, vectors) per step."""
    g = torch.Generator().manual_seed(seed)
    U = haar_orthogonal(d, columns=k, generator=g, dtype=torch.float64)
    V = haar_orthogonal(d, columns=k, generator=g, dtype=torch.float64)
    out = []
    for t in range(steps):
        s = torch.tensor([4.0, 3.0 - 0.2 * t, 1.6 + 0.2 * t, 0.9, 0.5], dtype=torch.float64)
        if t:
            U, V = small_rotation(d, 0.02, g) @ U, small_rotation(d, 0.02, g) @ V
        out.append(((U * s) @ V.T, s, U, V))
    return out


def scrambled_svd(M: torch.Tensor, k: int, g: torch.Generator) -> SVD:
    svd = svd_dense(M)
    flip = torch.where(torch.rand(k, generator=g) < 0.5, -1.0, 1.0).double()
    return SVD(svd.U[:, :k] * flip, svd.S[:k], svd.V[:, :k] * flip)


def test_track_follows_a_crossing_pair_and_sign_flips():
    seq, g = planted_sequence(), torch.Generator().manual_seed(1)
    track, seen_swap = DirectionTrack(), False
    first = None
    for t, (M, s, U, V) in enumerate(seq):
        svd = scrambled_svd(M, 5, g)
        step = track.update(10 * t, svd)
        if first is None:
            first = svd
        # d1..d5 are planted directions 0..4 (sorted at step 0): their values follow the truth, not the sort
        assert step.sigma == pytest.approx(s.tolist(), rel=1e-9)
        assert step.state == ["kept"] * 5 and step.counts == {"n_kept": 5, "n_block": 0, "n_lost": 0}
        assert min(step.cos) > 0.99 and step.since == [0] * 5
        seen_swap |= step.position[1] == 2
        # the aligned vectors are the truth's, with the first step's orientation
        al = track.aligned()
        sign0 = torch.sign((first.U * U).sum(0))  # how step 0's SVD oriented the planted vectors
        assert (al.U * (U * sign0)).sum(0) == pytest.approx(torch.ones(5, dtype=torch.float64), abs=1e-9)
        assert (al.V * (V * sign0)).sum(0) == pytest.approx(torch.ones(5, dtype=torch.float64), abs=1e-9)
    assert seen_swap  # after the crossing d2 sits at sorted position 3 (0-based 2)
    scal = track_scalars("spectrum/ov/layer0/head1", step)
    assert scal["spectrum/ov/layer0/head1/d2/sigma"] == pytest.approx(1.4)
    assert scal["spectrum/ov/layer0/head1/directions_kept"] == 5


def test_sorted_position_would_have_swapped():
    """The control: reading sigma by sorted position (what tags did before) mislabels the crossing pair."""
    seq = planted_sequence()
    _, s_last, _, _ = seq[-1]
    sorted_vals = torch.linalg.svdvals(seq[-1][0])[:5]
    assert sorted_vals[1] == pytest.approx(s_last[2].item()) and sorted_vals[1] != pytest.approx(s_last[1].item())


def test_block_and_new_direction_are_flagged():
    """Two equal values form a block (only the block's range is reported); a direction replaced by an
    orthogonal one is 'lost' and its chain restarts."""
    g = torch.Generator().manual_seed(3)
    d = 10
    Q = haar_orthogonal(d, generator=g, dtype=torch.float64)
    P = haar_orthogonal(d, generator=g, dtype=torch.float64)
    s = torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=torch.float64)
    track = DirectionTrack(n_track=4)
    track.update(0, svd_dense((Q[:, :4] * s) @ P[:, :4].T))
    # step 1: the degenerate pair is rotated inside its block, direction 4 is replaced by a new one
    c, sn = 0.6, 0.8
    U1 = Q[:, :4].clone()
    U1[:, 1], U1[:, 2] = c * Q[:, 1] + sn * Q[:, 2], -sn * Q[:, 1] + c * Q[:, 2]
    V1 = P[:, :4].clone()
    V1[:, 1], V1[:, 2] = c * P[:, 1] + sn * P[:, 2], -sn * P[:, 1] + c * P[:, 2]
    U1[:, 3], V1[:, 3] = Q[:, 5], P[:, 5]
    step = track.update(7, svd_dense((U1 * s) @ V1.T))
    assert step.state == ["kept", "block", "block", "lost"]
    # the old d4 left for the null space (rank 4 of 10); the name restarts on the new direction at sigma 1
    assert step.block_size == [1, 2, 2, 1] and step.position[3] == 3 and step.sigma[3] == pytest.approx(1.0)
    assert abs(float(track.aligned().U[:, 3] @ Q[:, 5])) == pytest.approx(1.0)
    assert step.block_sigma_min[1] == pytest.approx(2.0) and step.block_sigma_max[2] == pytest.approx(2.0)
    # (a lost direction's |cos| is not asserted: its best partner may lie in the null space, where the SVD's
    # basis is arbitrary and differs between LAPACK builds)
    assert step.block_cos[1] == pytest.approx(1.0, abs=1e-9)
    assert step.since == [0, 0, 0, 7]
    scal = track_scalars("x", step)
    assert "x/d2/block_sigma_max" in scal and "x/d1/block_sigma_max" not in scal
    assert scal["x/directions_lost"] == 1 and scal["x/d2/match_cos"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="n_track=0"):
        DirectionTrack(n_track=0)


def test_the_callbacks_follow_the_planted_directions():
    """SpectrumCallback (per matrix) and SVDAlignmentCallback (per toy instance, batched) track the planted
    sequence as the truth says: d2's value is the falling direction's at every step, not the 2nd largest."""
    from lit_svd.callbacks.alignment import SVDAlignmentCallback
    from lit_svd.callbacks.spectrum import SpectrumCallback, scalars

    seq, g = planted_sequence(), torch.Generator().manual_seed(2)
    spec, toy = SpectrumCallback(track=3), SVDAlignmentCallback(spectrum_scalars=3)
    for t, (M, s, _, _) in enumerate(seq):
        svd = scrambled_svd(M, 5, g)
        other = scrambled_svd(M.T, 5, g)  # a second instance: the transposed sequence (U and V swap)
        rows = [{"matrix": "ov", "layer": 0, "head": 1, "effective_rank": 1.0, "top_k_energy": 1.0}]
        spec.follow(rows, {("ov", 0, 1): svd}, 10 * t)
        tags = scalars(rows, 4)
        assert [tags[f"spectrum/ov/layer0/head1/d{i}/sigma"] for i in (1, 2, 3)] == pytest.approx(s[:3].tolist())
        batched = SVD(torch.stack([svd.U, other.U]), torch.stack([svd.S, other.S]), torch.stack([svd.V, other.V]))
        for inst in toy.follow(10 * t, batched):
            assert inst.sigma == pytest.approx(s[:3].tolist()) and inst.state == ["kept"] * 3
    assert rows[0]["tracked"]["position"] == [0, 2, 1]  # the crossing happened; the tags did not swap


def test_compare_directions_between_two_models(tmp_path, tokenizer):
    """A model against itself keeps every top direction (cos 1, sigma ratio 1); against a copy whose layer-1
    o_proj is redrawn, layer 1's OV directions are lost and every other matrix is untouched. The tool's
    per-matrix rows equal compare_svds on the dense SVDs of the views' own matrices."""
    from lit_svd.analysis.tracking import compare_svds
    from lit_svd.cli_tools import run_tool
    from lit_svd.models import view as make_view
    from lit_svd.models.tiny import tiny_causal_lm

    model = tiny_causal_lm("llama")
    a, b = tmp_path / "a", tmp_path / "b"
    model.save_pretrained(a)
    tokenizer.save_pretrained(a)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.normal_(generator=torch.Generator().manual_seed(1))
    model.save_pretrained(b)
    tokenizer.save_pretrained(b)

    same = run_tool(["compare-directions", str(a), str(a), "--out", str(tmp_path / "same"), "--top", "4"]).summary
    assert all(s["lost"] == 0 and s["kept"] + s["block"] == s["directions"] > 0 for s in same["summary"].values())
    for row in same["rows"]:  # isolated directions find themselves; inside a block the order is arbitrary
        kept = [r for r, st in zip(row["sigma_ratio"], row["state"]) if st == "kept"]
        assert kept == pytest.approx([1.0] * len(kept), abs=1e-9)
    assert same["summary"]["ov"]["kept"] > 0
    res = run_tool(["compare-directions", str(a), str(b), "--out", str(tmp_path / "diff"), "--top", "4"]).summary
    for row in res["rows"]:
        if row["matrix"] == "ov" and row["layer"] == 1:
            assert row["n_lost"] >= 3, row  # a redrawn o_proj: new directions
        else:
            assert row["n_lost"] == 0
    # one row by hand: head 0 of layer 1's OV, dense SVD of the per-head matrices
    va, vb = (make_view(m) for m in (tiny_causal_lm("llama"), model))
    dense = [svd_dense(v.ov(1).dense()[0].double()) for v in (va, vb)]
    hand = compare_svds(*dense, n_track=4)
    row = next(r for r in res["rows"] if r["matrix"] == "ov" and r["layer"] == 1 and r["head"] == 0)
    assert row["state"] == hand.state
    # cosines of lost directions are left out: their partners can sit in the null space (rank 16 of 64), whose
    # basis each SVD routine picks as it likes
    held = [i for i, st in enumerate(hand.state) if st != "lost"]
    assert [row["cos"][i] for i in held] == pytest.approx([hand.cos[i] for i in held], abs=1e-6)
    assert (tmp_path / "diff" / "compare_directions.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="one architecture"):
        other = tmp_path / "gpt2"
        tiny_causal_lm("gpt2").save_pretrained(other)
        tokenizer.save_pretrained(other)
        run_tool(["compare-directions", str(a), str(other), "--out", str(tmp_path / "x")])
