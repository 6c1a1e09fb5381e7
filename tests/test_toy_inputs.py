"""Templates, the sparse feature stream, and bad input failing at construction with one clear line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_svd.datamodules.toy import SparseFeatureDataModule, SparseFeatureStream, sample_sparse_features, stream_seed
from lit_svd.modules.toy import ToyAlignmentModule
from lit_svd.modules.toy_templates import build_template, template_pairs


def one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


# ---- templates ---------------------------------------------------------------------------------------
def test_single_pair_and_pairs():
    T = build_template({"pair": [0, 1, 1.0]}, 5)
    ref = np.zeros((5, 5))
    ref[0, 1] = 1.0
    assert np.array_equal(T.numpy(), ref)
    T = build_template({"pairs": [[0, 1, 0.5], [3, 2, 2.0]]}, 5)
    assert template_pairs(T) == [(3, 2, 2.0), (0, 1, 0.5)]


def test_ramp_values_fall_linearly():
    T = build_template({"ramp": {"count": 5, "offset": 20, "start": 1, "high": 1.0, "low": 0.2}}, 30)
    pairs = template_pairs(T)
    assert [(i, j) for i, j, _ in pairs] == [(1 + n, 21 + n) for n in range(5)]
    assert np.allclose([v for *_, v in pairs], [1.0, 0.8, 0.6, 0.4, 0.2], atol=1e-6)


@pytest.mark.parametrize("suffix", [".npy", ".pt", ".csv", ".txt"])
def test_template_from_file(tmp_path, suffix):
    M = np.zeros((4, 4), dtype=np.float32)
    M[1, 2], M[3, 0] = 0.7, -0.25
    path = tmp_path / f"t{suffix}"
    if suffix == ".npy":
        np.save(path, M)
    elif suffix == ".pt":
        torch.save(torch.from_numpy(M), path)
    else:
        np.savetxt(path, M, delimiter="," if suffix == ".csv" else " ")
    assert np.allclose(build_template({"file": str(path)}, 4).numpy(), M)


# ---- bad input: one clear line, before any training ------------------------------------------------------
def test_template_index_out_of_range():
    with pytest.raises(IndexError) as err:
        ToyAlignmentModule(n_features=20, template={"pair": [0, 20, 1.0]})
    assert one_line(err) == "template.pair entry [0, 20, 1.0]: key_feature=20 is outside [0, n_features=20)"
    with pytest.raises(IndexError, match=r"template.ramp entry \[25, 30, 0.5\]: key_feature=30"):
        build_template({"ramp": {"count": 10, "offset": 5, "start": 20}}, 30)


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"n_features": 0}, "n_features=0"),
        ({"d_model": -3}, "d_model=-3"),
        ({"d_head": 0}, "d_head=0"),
        ({"d_head": [4, 0], "n_instances": 2}, "d_head=0"),
        ({"n_instances": 0}, "n_instances=0"),
    ],
)
def test_non_positive_model_sizes(kwargs, key):
    with pytest.raises(ValueError) as err:
        ToyAlignmentModule(**kwargs)
    assert one_line(err).startswith(key) and "positive integer" in str(err.value)


@pytest.mark.parametrize(
    "kwargs,key",
    [({"n_features": 0}, "n_features=0"), ({"n_keys": -1}, "n_keys=-1"), ({"batch_size": 0}, "batch_size=0")],
)
def test_non_positive_data_sizes(kwargs, key):
    with pytest.raises(ValueError) as err:
        SparseFeatureDataModule(**kwargs)
    assert one_line(err).startswith(key)


def test_negative_lambda():
    with pytest.raises(ValueError) as err:
        ToyAlignmentModule(lambda_attn=-0.5)
    assert one_line(err) == "lambda_attn=-0.5: must be >= 0"
    with pytest.raises(ValueError, match=r"lambda_attn=\[1.0, -2.0\]: must be >= 0"):
        ToyAlignmentModule(lambda_attn=[1.0, -2.0])


@pytest.mark.parametrize(
    "content,match",
    [
        ("1 2 3\n4 5\n", "cannot be read as a numeric matrix"),
        ("a b\nc d\n", "cannot be read as a numeric matrix"),
        ("1 0\n0 1\n", r"shape \(2, 2\), must be \(n_features, n_features\) = \(3, 3\)"),
        ("0 0 0\n0 nan 0\n0 0 0\n", "NaN or infinite"),
        ("0 0 0\n0 0 0\n0 0 0\n", "all zeros"),
    ],
)
def test_malformed_template_file(tmp_path, content, match):
    path = tmp_path / "template.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=match) as err:
        ToyAlignmentModule(n_features=3, d_model=2, d_head=2, template={"file": str(path)})
    assert one_line(err).startswith(f"template.file='{path}'")


def test_malformed_template_specs():
    for spec in (
        {"pair": [0, 1]},
        {"pairs": []},
        {"ramp": {"count": 3}},
        {"pair": [0, 1, 1], "file": "x"},
        {"matrix": 1},
        {"file": "/nonexistent/t.npy"},
    ):
        with pytest.raises(ValueError) as err:
            build_template(spec, 10)
        one_line(err)


def test_mismatched_per_instance_lists():
    with pytest.raises(ValueError, match="lambda_attn has 2 values but n_instances=3"):
        ToyAlignmentModule(n_instances=3, lambda_attn=[1.0, 2.0])
    with pytest.raises(ValueError, match="p has 2 values but n_instances=3"):
        SparseFeatureDataModule(p=[0.1, 0.2], n_instances=3)
    with pytest.raises(ValueError, match=r"p=1.5: every activation probability must lie in \(0, 1\]"):
        SparseFeatureDataModule(p=1.5)


# ---- the stream -------------------------------------------------------------------------------------------
def test_stream_statistics_per_instance_p():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.5])
    x = sample_sparse_features(g, 2000, 3, 50, p)
    assert x.shape == (2, 2000, 3, 50)
    assert x.min() >= 0 and x.max() <= 1
    rate = (x > 0).float().mean(dim=(1, 2, 3))
    assert torch.allclose(rate, p, atol=0.01)  # 300k draws per instance: 5 sigma < 0.005
    active = x[x > 0]
    assert active.mean().item() == pytest.approx(0.5, abs=0.01)  # U[0, 1] when active


def test_stream_is_reproducible_and_rank_dependent():
    def first(rank, seed=7):
        return next(iter(SparseFeatureStream(10, 4, torch.tensor([0.3]), 16, seed, rank)))

    assert torch.equal(first(0), first(0))
    assert not torch.equal(first(0), first(1))
    assert not torch.equal(first(0), first(0, seed=8))
    assert len({stream_seed(s, r, w) for s in range(4) for r in range(4) for w in range(4)}) == 64


def test_callback_and_thread_settings_are_checked():
    from lit_svd.callbacks.alignment import SVDAlignmentCallback

    with pytest.raises(ValueError) as err:
        SVDAlignmentCallback(every_n_steps=0)
    assert one_line(err) == "every_n_steps=0: must be a positive integer"
    with pytest.raises(ValueError, match=r"^heatmap_instances=-1: must be an integer >= 0$"):
        SVDAlignmentCallback(heatmap_instances=-1)
    with pytest.raises(TypeError, match="num_threads"):  # threads are set by the CLI (--threads), not a module
        ToyAlignmentModule(num_threads=1)
