"""Blocks of near-equal singular values in direction masks: reports against hand counts and a brute-force
loop, ``mask_unit="block"`` against a hand-rebuilt weight, the results.json fields, the ``mask-blocks``
tool on a finished run, and SAD's basis blocks."""

from __future__ import annotations

import json

import pytest
import torch

from lit_svd.analysis.blocks import block_report, kept_blocks, mask_units
from lit_svd.linalg import haar_orthogonal
from lit_svd.models import view as make_view
from lit_svd.models.intervene import Component, build_components
from lit_svd.models.tiny import tiny_causal_lm
from tests.helpers import fit_masks

PAIR = (1, 2)  # the planted near-degenerate pair


def planted_spectrum(K: int) -> torch.Tensor:
    """Geometric with ratio 0.9 (every relative gap 0.1), directions 1 and 2 within 0.1 % of each other."""
    S = 10 * 0.9 ** torch.arange(K, dtype=torch.float64)
    S[2] = S[1] * 0.999
    return S


def test_planted_pair_is_one_block_with_hand_gaps():
    S = torch.tensor([[5.0, 3.0, 2.99, 1.0], [4.0, 2.0, 1.0, 0.5]])
    g = torch.Generator().manual_seed(0)
    U, V = haar_orthogonal(6, 2, generator=g, columns=4), haar_orthogonal(5, 2, generator=g, columns=4)
    comp = Component("ov", 3, U, S, V)
    rep = block_report([comp], rel_gap=0.05)["components"][0]
    gap01, gap23 = (5 - 3) / 5, (2.99 - 1) / 2.99
    assert rep["blocks"][0] == [
        [0, 0, 1, pytest.approx(gap01)],
        [1, 2, 2, pytest.approx(gap01)],
        [3, 3, 1, pytest.approx(gap23)],
    ]
    assert [b[:3] for b in rep["blocks"][1]] == [[0, 0, 1], [1, 1, 1], [2, 2, 1], [3, 3, 1]]
    assert rep["gap"][0] == pytest.approx([gap01, gap01, gap01, gap23])
    assert rep["rank"] == [4, 4] and rep["isolated"] == 6 and rep["in_blocks"] == 2 and rep["n_blocks"] == 7
    keep = {comp.name: torch.tensor([[False, True, False, True], [True, False, False, False]])}
    kb = kept_blocks([comp], keep, rel_gap=0.05)
    rows = {(r["group"], r["direction"]): r for r in kb["directions"]}
    assert rows[0, 1]["claim"] == "block" and rows[0, 1]["statement"] == "1 of 2 kept in block 1 (directions 1-2)"
    assert rows[0, 1]["block"] == {"id": 1, "size": 2, "first": 1, "last": 2} and rows[0, 1]["kept_in_block"] == 1
    assert rows[0, 3]["claim"] == rows[1, 0]["claim"] == "direction"
    assert kb["per_kind"]["ov"] == {
        "kept": 3,
        "isolated": 2,
        "in_blocks": 1,
        "past_rank": 0,
        "blocks_touched": 3,
        "blocks_whole": 2,
        "isolated_fraction": pytest.approx(2 / 3),
    }
    assert [b["statement"] for b in kb["blocks"]] == ["1 of 2 kept in block 1 (directions 1-2)"]
    assert mask_units([comp], "block", 0.05)[comp.name].tolist() == [[0, 1, 1, 2], [3, 4, 5, 6]]
    assert mask_units([comp], "direction", 0.05) is None
    # a gap of 0.0033 is a block at rel_gap 0.05 and isolated at 0.001
    assert block_report([comp], rel_gap=0.001)["components"][0]["isolated"] == 8


@pytest.mark.parametrize("rel_gap", [0.01, 0.05])
def test_isolated_counts_match_a_brute_force_loop(rel_gap):
    """Isolated = both neighbours at a relative gap >= rel_gap (``(s_i - s_{i+1}) / s_i``) and within the
    rank (sigma > max(m, n) * eps(float32) * sigma_1); counted one direction at a time in Python floats."""
    comps = build_components(make_view(tiny_causal_lm("llama")))
    g = torch.Generator().manual_seed(1)
    keep = {c.name: torch.rand(c.shape, generator=g) < 0.4 for c in comps}
    report, kb = block_report(comps, rel_gap), kept_blocks(comps, keep, rel_gap)
    eps = torch.finfo(torch.float32).eps
    want, want_kept = {}, {}
    for c in comps:
        size = max(c.U.shape[-2], c.V.shape[-2])
        for gi, row in enumerate(c.S.tolist()):
            for k, s in enumerate(row):
                above = k == 0 or (row[k - 1] - s) / row[k - 1] >= rel_gap
                below = k == len(row) - 1 or (s - row[k + 1]) / s >= rel_gap
                iso = above and below and s > size * eps * row[0]
                want[c.kind] = want.get(c.kind, 0) + iso
                want_kept[c.kind] = want_kept.get(c.kind, 0) + (iso and bool(keep[c.name][gi, k]))
    assert {k: v["isolated"] for k, v in report["per_kind"].items()} == want
    assert {k: v["isolated"] for k, v in kb["per_kind"].items()} == want_kept
    assert sum(v["kept"] for v in kb["per_kind"].values()) == sum(int(m.sum()) for m in keep.values())
    assert 0 < sum(want.values()) < sum(c.n_directions for c in comps)


@pytest.fixture(scope="module")
def planted_dir(tmp_path_factory, tokenizer):
    """The tiny llama with layer 1's down_proj rebuilt on the planted spectrum (same singular vectors)."""
    model = tiny_causal_lm("llama")
    down = model.model.layers[1].mlp.down_proj
    U, S, Vh = torch.linalg.svd(down.weight.data.double().mT, full_matrices=False)  # the map x @ W^T
    down.weight.data = ((U * planted_spectrum(len(S))) @ Vh).mT.float()
    folder = tmp_path_factory.mktemp("tiny_planted")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_mask_unit_block_masks_a_planted_pair_as_one(planted_dir, tokenizer):
    """One mask value for the planted pair (and one per other direction): the module's soft and hard
    evaluation equal the HF forward of the model whose down_proj is rebuilt as U diag(S * lambda) V^T, with
    lambda spread over the pair by hand."""
    from transformers import AutoModelForCausalLM

    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import kl_divergence
    from lit_svd.modules import DirectionMaskModule

    module = DirectionMaskModule(
        model=planted_dir,
        components=["mlp_out"],
        layers=[1],
        positions="all",
        ablation="zero",
        threshold=0.3,
        mask_unit="block",
    )
    comp = module.components[0]
    K = comp.shape[1]
    assert torch.allclose(comp.S[0].double(), planted_spectrum(K), rtol=1e-5)  # the component sees the plant
    theta = module.theta["L1_mlp_out"]
    assert theta.shape == (K - 1,)  # one logit for the pair
    g = torch.Generator().manual_seed(0)
    theta.data = torch.logit(torch.rand(K - 1, generator=g) * 0.9 + 0.05)
    theta.data[PAIR[0]] = torch.logit(torch.tensor(0.1))  # below the threshold: the pair is dropped together
    lam = module.lambdas()["L1.mlp_out"][0]
    by_hand = theta.detach().sigmoid()[[k if k < 2 else k - 1 for k in range(K)]]  # the pair shares unit 1
    assert torch.equal(lam.detach(), by_hand) and lam[PAIR[0]] == lam[PAIR[1]]
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=8, batch_size=8)
    ev = module.evaluate(dm.test_dataloader())

    ref = AutoModelForCausalLM.from_pretrained(planted_dir).eval()
    down = ref.model.layers[1].mlp.down_proj
    W = down.weight.data.clone().double()
    U, S, Vh = torch.linalg.svd(W.mT, full_matrices=False)
    batch = next(iter(dm.test_dataloader()))
    rows = torch.arange(len(batch["answer_pos"]))

    def answer_logits():
        with torch.no_grad():
            out = ref(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"]).logits
        return out[rows, batch["answer_pos"]]

    full = answer_logits()
    for setting, scale in (("soft", by_hand.double()), ("hard", (by_hand >= 0.3).double())):
        down.weight.data = ((U * (S * scale)) @ Vh).mT.float()
        assert ev[f"{setting}_kl"] == pytest.approx(
            float(kl_divergence(answer_logits(), full).mean()), rel=1e-3, abs=1e-6
        )
    assert ev["hard_kl"] > 1e-5  # the dropped directions act


def test_block_training_keeps_the_pair_together_and_reports_blocks(planted_dir, tokenizer, tmp_path):
    """Trained with mask_unit=block the pair's two lambdas stay equal (with mask_unit=direction they part);
    results.json carries the block fields, counts equal to a recount from masks.pt, and blocks.json; the
    mask-blocks tool on the finished run reproduces the counts."""
    from lit_svd.cli_tools import run_tool

    lam = {}
    for unit in ("direction", "block"):
        torch.manual_seed(0)
        module, out = fit_masks(
            planted_dir,
            tokenizer,
            tmp_path / unit,
            components=["ov", "mlp_out"],
            mask_unit=unit,
            lr=0.2,
            init=0.6,
            threshold=0.5,
            alpha=1e-4,
        )
        lam[unit] = module.lambdas()["L1.mlp_out"][0].detach()
    assert lam["block"][PAIR[0]] == lam["block"][PAIR[1]]
    assert lam["direction"][PAIR[0]] != lam["direction"][PAIR[1]]
    res = json.loads((out / "results.json").read_text())
    assert res["mask_unit"] == "block" and res["rel_gap"] == 0.05 and 0 < res["kept"] < res["n_directions"]
    saved = torch.load(out / "masks.pt")
    assert saved["mask_unit"] == "block"
    keep = {n: l >= saved["threshold"] for n, l in saved["lambdas"].items()}
    recount = kept_blocks(module.components, keep, 0.05)
    assert res["kept_isolated"]["per_kind"] == recount["per_kind"]
    assert res["kept_isolated"]["kept"] == res["kept"] == len(res["kept_directions"]) > 0 and res["receptors"]
    for row in res["kept_directions"] + res["receptors"] + [res["steering"]]:
        assert {"block", "gap", "isolated"} <= set(row) and 0 <= row["gap"] <= 1
    for row in res["kept_directions"]:  # block masks: a kept block is kept whole
        assert row["kept_in_block"] == row["block"]["size"]
    assert (out / "masks_blocks.png").stat().st_size > 1000
    blocks = json.loads((out / "blocks.json").read_text())
    assert blocks["per_kind"] == res["blocks_per_kind"]

    (out / "config.yaml").write_text(
        json.dumps({"model": {"init_args": {"model": planted_dir, "components": ["ov", "mlp_out"], "layers": None}}})
    )
    tool = run_tool(["mask-blocks", str(out), "--out", str(tmp_path / "annotated"), "--rel-gaps", "0.05", "0.01"])
    tool = tool.summary
    assert tool["per_gap"][0]["per_kind"] == recount["per_kind"]
    assert tool["per_gap"][1]["per_kind"] == kept_blocks(module.components, keep, 0.01)["per_kind"]
    assert [r["gap"] for r in tool["per_gap"][0]["receptors"]] == [r["gap"] for r in res["receptors"]]
    assert (tmp_path / "annotated" / "mask_blocks.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="is the run folder"):
        run_tool(["mask-blocks", str(out), "--out", str(out)])


def test_bad_block_options_fail_in_one_line(tiny_dirs):
    from lit_svd.callbacks.sad import SADReport
    from lit_svd.modules import DirectionMaskModule

    with pytest.raises(ValueError, match="mask_unit='head' is unknown; choose one of direction, block"):
        DirectionMaskModule(model=tiny_dirs["llama"], mask_unit="head")
    with pytest.raises(ValueError, match=r"rel_gap=1.5 is invalid"):
        DirectionMaskModule(model=tiny_dirs["llama"], rel_gap=1.5)
    with pytest.raises(ValueError, match=r"rel_gap=-0.1 is invalid"):
        SADReport(rel_gap=-0.1)


def test_sad_basis_blocks_read_the_planted_spectrum_of_omega0():
    """A head with Omega(0) = A_q A_k^T = U diag(S) V^T: its basis blocks are those of S."""
    from lit_svd.analysis.sad import QKHeads, basis_blocks

    g = torch.Generator().manual_seed(0)
    D, d_head = 9, 6
    S = planted_spectrum(d_head)
    U = haar_orthogonal(D, 2, generator=g, dtype=torch.float64, columns=d_head)
    V = haar_orthogonal(D, 2, generator=g, dtype=torch.float64, columns=d_head)
    M = torch.randn(d_head, d_head, generator=g, dtype=torch.float64)  # any invertible mixing of the head dim
    A_q = (U * S) @ M
    A_k = V @ torch.linalg.inv(M).mT
    rows = basis_blocks(QKHeads(A_q, A_k), rel_gap=0.05, top=4)
    assert len(rows) == 2 and rows[0]["rank"] == d_head and rows[0]["n_isolated"] == d_head - 2
    terms = rows[0]["top_terms"]
    assert [t["direction"] for t in terms] == [0, 1, 2, 3]
    assert [t["sigma"] for t in terms] == pytest.approx(S[:4].tolist(), rel=1e-9)
    assert [t["block"]["size"] for t in terms] == [1, 2, 2, 1] and not terms[1]["isolated"] and terms[0]["isolated"]
