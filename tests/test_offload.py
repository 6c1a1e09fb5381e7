"""Models larger than memory: a device map with some layers offloaded to disk (accelerate) gives the in-memory
results. The offloaded layers' weights are ``meta`` tensors until a forward or the view's ``materialized`` loads
them; the view's weight reads, SAD, mounts and the circuit decomposition are compared with the same model held
in memory (exactly: the same float32 values, the same operations)."""

from __future__ import annotations

import pytest
import torch

from lit_svd.analysis.decompose import Decomposer, mlp_reads, qk_reads
from lit_svd.models import view as make_view
from lit_svd.models.loading import layer_offload_map, load_causal_lm
from lit_svd.models.tiny import tiny_causal_lm
from tests.helpers import run_test

ON_DISK = [1, 2]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def deep_dir(request, tmp_path_factory, tokenizer):
    """A 4-layer tiny model saved as a local HF folder (gemma3: per-head query / key norms read by the view)."""
    folder = tmp_path_factory.mktemp(f"deep_{request.param}")
    extra = {"layer_types": ["sliding_attention", "full_attention"] * 2} if request.param == "gemma3" else {}
    tiny_causal_lm(request.param, num_hidden_layers=4, **extra).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def placed(deep_dir, tmp_path_factory):
    """``(offloaded model, in-memory model)``: layers 1 and 2 on disk."""
    offload = tmp_path_factory.mktemp("offload")
    off, _ = load_causal_lm(deep_dir, device_map=layer_offload_map(deep_dir, ON_DISK), offload_folder=str(offload))
    mem, _ = load_causal_lm(deep_dir)
    return off, mem


def _meta(model, layer):
    return [n for n, p in model.named_parameters() if f"layers.{layer}." in n and p.device.type == "meta"]


def test_offload_map_puts_the_listed_blocks_on_disk(deep_dir, placed):
    off, _ = placed
    assert all(_meta(off, l) for l in ON_DISK) and not _meta(off, 0) and not _meta(off, 3)
    with pytest.raises(ValueError, match=r"on_disk=\[7\]: layers must lie in 0..3"):
        layer_offload_map(deep_dir, [7])
    with pytest.raises(ValueError, match="give offload_folder"):
        load_causal_lm(deep_dir, device_map=layer_offload_map(deep_dir, ON_DISK))


def test_view_reads_offloaded_weights_as_the_in_memory_ones(placed):
    off, mem = placed
    vo, vm = make_view(off), make_view(mem)
    assert vo._device == torch.device("cpu")
    for layer in range(vo.n_layers):
        pairs = [
            (vo.qk(layer, -1).A, vm.qk(layer, -1).A),
            (vo.ov(layer).B, vm.ov(layer).B),
            (vo.mlp_in(layer), vm.mlp_in(layer)),
            (vo.mlp_out(layer), vm.mlp_out(layer)),
            (vo.site_weight(layer, "down")[0], vm.site_weight(layer, "down")[0]),
            (vo.norm_affine("mlp", layer).scale, vm.norm_affine("mlp", layer).scale),
        ]
        maps = vo.head_norm_maps(layer)
        if maps is not None:
            pairs.append((maps[0], vm.head_norm_maps(layer)[0]))
        for a, b in pairs:
            assert a.device.type == "cpu" and torch.equal(a, b)
    assert torch.equal(vo.unembed()[0], vm.unembed()[0]) and torch.equal(vo.W_E, vm.W_E)
    assert all(_meta(off, l) for l in ON_DISK)  # loaded for the read only


def test_decomposition_of_a_read_in_an_offloaded_layer_equals_in_memory(placed):
    off, mem = placed
    ids = torch.randint(0, 2000, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    got = []
    for model in (off, mem):
        v = make_view(model)
        dec = Decomposer(v)
        cache = v.run_with_cache(dec.points(mix=True), ids, mask)
        b, d, s = torch.tensor([0, 1]), torch.tensor([5, 7]), torch.tensor([3, 6])  # within a sliding window of 4
        qk = dec.split(cache, qk_reads(dec, cache, 2, 1, b, d, s, mask, side="query"))
        mlp = dec.split(cache, mlp_reads(dec, cache, 1, b, d))
        got.append((qk.values, qk.total, mlp.values))
    for a, b in zip(*got):
        assert torch.equal(a, b)
    assert got[0][0].abs().sum() > 0


def test_sad_and_mounts_modules_on_an_offloaded_model_equal_in_memory(deep_dir, tmp_path):
    from lit_svd.modules.mounts import MountsAnalysisModule
    from lit_svd.modules.sad import SADAnalysisModule

    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 2000, (3, 16), generator=g)} for _ in range(2)]
    place = {"device_map": layer_offload_map(deep_dir, ON_DISK), "offload_folder": str(tmp_path / "off")}
    sad = [
        run_test(SADAnalysisModule(model=deep_dir, min_pairs=1, input_key="input_ids", null_draws=4, **kw), batches)
        for kw in (place, {})
    ]
    assert sad[0].placed and not sad[1].placed and _meta(sad[0].lm, 1)  # Lightning left the placed model alone
    heads = [m.results()["heads"] for m in sad]
    assert len(heads[0]) == len(heads[1]) > 0
    for a, b in zip(*heads):
        assert (a["layer"], a["head"], a["n_pairs"]) == (b["layer"], b["head"], b["n_pairs"])
        assert a["sparsity"] == b["sparsity"] and a["sparsity_null_draws"] == b["sparsity_null_draws"]
    tiles = {"q": 32, "k": 16, "v": 16, "o": 32, "gate": 32, "up": 32, "down": 64}
    kw = dict(model=deep_dir, tile_widths=tiles, modes_sweep=[1, 2], layers=[1, 3], sites=["q", "down"], steer_texts=2)
    rows = [run_test(MountsAnalysisModule(**kw, **p), batches).rows for p in (place, {})]
    assert len(rows[0]) == len(rows[1]) == 4
    for a, b in zip(*rows):
        assert (a["site"], a["layer"]) == (b["site"], b["layer"])
        assert a["lift_tiled"] == b["lift_tiled"] and a["coverage_lift"] == b["coverage_lift"]


@pytest.mark.slow
def test_smollm2_with_ten_layers_on_disk_gives_the_in_memory_sad(tmp_path, smollm2):
    """SmolLM2-135M with layers 10-19 offloaded to disk: SAD of two layers (one on disk) on 8 IOI prompts equals
    the in-memory run exactly."""
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules.sad import SADAnalysisModule

    model, tokenizer = smollm2
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=8, batch_size=8)
    batches = [next(iter(dm.test_dataloader()))]
    place = {"device_map": layer_offload_map("smollm2-135m", range(10, 20)), "offload_folder": str(tmp_path)}
    kw = dict(model="smollm2-135m", layers=[5, 15], null_draws=4, min_pairs=1)
    off = run_test(SADAnalysisModule(**kw, **place), batches)
    assert len(_meta(off.lm, 15)) == 9  # every weight of block 15 stays on disk between reads
    mem = run_test(SADAnalysisModule(**kw), batches)
    got, want = off.results()["heads"], mem.results()["heads"]
    assert len(got) == len(want) == 18
    for a, b in zip(got, want):
        assert a["sparsity"] == b["sparsity"] and a["sparsity_null_p05"] == b["sparsity_null_p05"]
