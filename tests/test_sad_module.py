"""SADAnalysisModule and SADCallback: per-head accumulation against a direct recomputation, DDP over two
CPU processes against one, bad inputs, and the callback on the toy model and a tiny LM."""

import json
import re
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers import only_results, run_lit_svd

from lit_svd.analysis.sad import attention_inputs, decompose_layer, layer_bases, null_head_means
from lit_svd.callbacks.sad import SADReport
from lit_svd.modules.sad import SADAnalysisModule

ROOT = Path(__file__).resolve().parents[1]


def word_tokenizer(words):
    """A whitespace word-level tokenizer over ``words`` (no hub, no SmolLM2 needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", *sorted(set(words))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory):
    """A tiny random Llama (rotary, GQA) saved as a local HF folder with a tokenizer covering the IOI words."""
    from lit_svd.datamodules import task_words as tw
    from lit_svd.models.tiny import tiny_causal_lm

    text = " ".join([*tw.MALE_NAMES, *tw.FEMALE_NAMES, *tw.PLACES, *tw.OBJECTS, *tw.IOI_TEMPLATES])
    tok = word_tokenizer(re.findall(r"\w+|[^\w\s]", text))
    model = tiny_causal_lm("llama", vocab_size=len(tok))
    folder = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def make_module(tiny_lm_dir, **kw):
    return SADAnalysisModule(model=tiny_lm_dir, **{"dtype": "float64", **kw})


def test_accumulated_heads_equal_direct_recomputation(tiny_lm_dir):
    mod = make_module(tiny_lm_dir, min_pairs=1, heads=[[1, 0], [1, 3], [0, 2]])
    tok = mod.tokenizer
    enc = tok(
        ["When Mary and John went to the store , John gave a drink to", "Then , Anna and Tom went to the garden"],
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        mod.analyse_batch(enc["input_ids"], enc["attention_mask"])
    res = mod.results()
    assert res["experiment"] == "sad" and res["n_prompts"] == 2
    assert [(r["layer"], r["head"]) for r in res["heads"]] == [(0, 2), (1, 0), (1, 3)]
    view = mod.view
    X = attention_inputs(view, enc["input_ids"], enc["attention_mask"], [0, 1])
    for row in res["heads"]:
        full = decompose_layer(
            layer_bases(view, row["layer"], dtype=torch.float64, null_draws=16),
            X[row["layer"]],
            enc["attention_mask"],
            unattended=True,
        )
        mine = full.head == row["head"]
        assert row["n_pairs"] == int(mine.sum()) > 0
        assert row["sparsity"] == pytest.approx(full.sparsity[mine].mean().item(), rel=1e-12)
        assert row["sparsity_rotated"] == pytest.approx(full.sparsity_rotated[mine].mean().item(), rel=1e-12)
        assert row["n_recon_median"] == float(np.median(full.n_recon[mine].numpy()))
        assert (
            row["n_recon_hist"]
            == np.bincount(full.n_recon[mine].numpy(), minlength=len(row["n_recon_hist"]) + 1)[1:].tolist()
        )
        # the matched null of this head (frames from (seed, layer, head) alone: the same in the full layer)
        draws = null_head_means(full.null, view.n_heads, 16)[row["head"]]
        assert row["sparsity_null_draws"] == pytest.approx(draws.tolist(), rel=1e-12)
        assert row["sparsity_null_p05"] == pytest.approx(float(np.quantile(draws.numpy(), 0.05)), rel=1e-12)
        assert row["sparser_than_null"] == (row["sparsity"] < row["sparsity_null_p05"])
        un = full.unattended.head == row["head"]
        assert row["n_unattended"] == int(un.sum()) > 0
        assert row["sparsity_unattended"] == pytest.approx(full.unattended.sparsity[un].mean().item(), rel=1e-12)


def test_null_stride_scores_the_null_on_every_kth_prompt_only(tiny_lm_dir):
    """null_stride 2: the matched null's draws equal a full decomposition of the prompts whose split index is
    even (here rows 1 and 3) alone, while the head itself is scored on all four prompts."""
    mod = make_module(tiny_lm_dir, min_pairs=1, layers=[1], null_stride=2, pair_null=False)
    enc = mod.tokenizer(
        [
            "When Mary and John went to the store , John gave a drink to",
            "Then , Anna and Tom went to the garden",
            "The cat sat on the mat and looked at",
            "After the game , Lisa and Mark walked home ; Mark said hello to",
        ],
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        mod.analyse_batch(enc["input_ids"], enc["attention_mask"], index=torch.tensor([7, 8, 9, 10]))
    res = mod.results()
    assert res["null_stride"] == 2
    X = attention_inputs(mod.view, enc["input_ids"], enc["attention_mask"], [1])[1]
    bases = layer_bases(mod.view, 1, dtype=torch.float64, null_draws=16)
    every = decompose_layer(bases, X, enc["attention_mask"])
    even = decompose_layer(bases, X[1::2], enc["attention_mask"][1::2])
    for row in res["heads"]:
        mine = every.head == row["head"]
        assert row["sparsity"] == pytest.approx(every.sparsity[mine].mean().item(), rel=1e-12)
        assert row["sparsity_null_draws"] == pytest.approx(
            null_head_means(even.null, mod.view.n_heads, 16)[row["head"]].tolist(), rel=1e-12
        )
        assert row["sparsity_null_draws"] != pytest.approx(
            null_head_means(every.null, mod.view.n_heads, 16)[row["head"]].tolist(), rel=1e-6
        )


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        (dict(threshold=1.5), ValueError, r"model.threshold=1.5 is outside \[0, 1\]"),
        (dict(threshold=-0.01), ValueError, r"model.threshold=-0.01 is outside \[0, 1\]"),
        (dict(layers=[0, 2]), IndexError, r"layer 2 out of range: llama has layers 0..1"),
        (dict(heads=[[0, 4]]), IndexError, r"head 4 out of range: llama has heads 0..3"),
        (dict(heads=[[-1, 0]]), IndexError, r"layer -1 out of range"),
        (dict(recon_tol=2.0), ValueError, r"model.recon_tol=2.0 is outside \[0, 1\)"),
        (dict(dtype="int8"), ValueError, r"model.dtype='int8' is not supported; choose one of float32"),
        (dict(layers=[0], heads=[[0, 0]]), ValueError, r"give model.layers or model.heads, not both"),
        (dict(null_draws=1), ValueError, r"model.null_draws=1: must be 0 \(no matched null\) or an integer >= 2"),
        (dict(null_stride=0), ValueError, r"model.null_stride=0: must be a positive integer"),
    ],
)
def test_bad_configuration_fails_at_construction(tiny_lm_dir, kw, exc, match):
    with pytest.raises(exc, match=match):
        make_module(tiny_lm_dir, **kw)


def test_empty_prompt_set_fails(tiny_lm_dir, tmp_path):
    from lit_svd.datamodules.tasks import TaskDataModule

    mod = make_module(tiny_lm_dir, layers=[0])
    dm = TaskDataModule(task="ioi", tokenizer=mod.tokenizer, n_train=0, n_val=0, n_test=0, batch_size=2)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, default_root_dir=tmp_path
    )
    with pytest.raises(ValueError, match="prompt set is empty"):
        trainer.test(mod, datamodule=dm)
    with pytest.raises(ValueError, match="empty batch"):
        mod.analyse_batch(torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, 5, dtype=torch.long))


def run_cli(args, cwd):
    run_lit_svd(args, cwd)
    return only_results(cwd)


def assert_same_results(a, b, rel=1e-9, top=True):
    if top:  # what produced the two runs differs (command, config, time), not what they measured
        a, b = ({k: v for k, v in r.items() if k != "provenance"} for r in (a, b))
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_results(a[k], b[k], rel, top=False)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_results(x, y, rel, top=False)
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=rel, abs=1e-12)
    else:
        assert a == b


@pytest.mark.slow
def test_ddp_two_processes_equal_one(tiny_lm_dir, tmp_path):
    """The CLI split over two CPU processes (DDP, gloo), one layer per pass, writes the results.json of one
    in-process run over all layers at once."""
    from lit_svd.datamodules.tasks import TaskDataModule

    mod = make_module(tiny_lm_dir, min_pairs=5, null_stride=4)  # as the config
    dm = TaskDataModule(task="ioi", tokenizer=tiny_lm_dir, n_train=0, n_val=0, n_test=10, batch_size=2, seed=0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        default_root_dir=tmp_path / "one",
        callbacks=[SADReport()],
    )
    trainer.test(mod, datamodule=dm)
    folder = Path(trainer.log_dir)
    one = json.loads((folder / "results.json").read_text())
    two, _ = run_cli(
        [
            "test",
            "--config",
            str(ROOT / "configs/sad/smollm2_ioi.yaml"),
            "--model.init_args.model",
            tiny_lm_dir,
            "--model.init_args.dtype",
            "float64",
            "--model.init_args.min_pairs",
            "5",
            "--data.init_args.tokenizer",
            tiny_lm_dir,
            "--data.init_args.n_test",
            "10",
            "--data.init_args.batch_size",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--model.init_args.layers_per_pass",
            "1",  # and a layer per pass over the prompts
            "--trainer.devices",
            "2",
            "--trainer.strategy",
            "ddp",
            "--trainer.default_root_dir",
            str(tmp_path / "two"),
        ],
        tmp_path / "two",
    )
    assert one["n_prompts"] == 10 and one["summary"]["n_pairs"] > 0
    assert_same_results(one, two)
    assert (folder / "sad_heatmap.png").is_file() and (folder / "sad_n_recon.png").is_file()


@pytest.mark.parametrize("name", ["smollm2_ioi", "gpt2_ioi", "pythia160m_ioi", "qwen2_5_0_5b_ioi", "train_tiny_lm"])
def test_configs_parse(name, capsys):
    """Every SAD config parses against the classes' signatures (nothing is loaded)."""
    from lit_svd.cli import main

    sub = "fit" if name == "train_tiny_lm" else "test"
    with pytest.raises(SystemExit) as stop:
        main([sub, "--config", str(ROOT / "configs" / "sad" / f"{name}.yaml"), "--print_config"])
    assert stop.value.code in (0, None)
    out = capsys.readouterr().out
    assert "lit_svd.modules.sad.SADAnalysisModule" in out or "LanguageModelModule" in out


def test_report_annotates_each_head_with_the_blocks_of_its_omega0(tiny_lm_dir):
    """Each head row's ``basis`` lists the singular values of the dense ``Omega(0) = A_q A_k^T`` built from
    the model's own q / k weights (the rotary offset 0 is the identity), with their blocks."""
    from lit_svd.linalg import direction_blocks

    mod = make_module(tiny_lm_dir, min_pairs=1, heads=[[1, 0], [0, 3]])
    enc = mod.tokenizer(["When Mary and John went to the store , John gave a drink to"], return_tensors="pt")
    mod.analyse_batch(enc["input_ids"], enc["attention_mask"])
    res = mod.results(rel_gap=0.05, top_terms=3)
    assert res["rel_gap"] == 0.05
    attn = mod.lm.model.layers
    for row in res["heads"]:
        a = attn[row["layer"]].self_attn
        dh = a.head_dim
        n_rep = a.config.num_attention_heads // a.config.num_key_value_heads
        W_q = a.q_proj.weight[row["head"] * dh : (row["head"] + 1) * dh].double()  # [dh, d]
        kv = row["head"] // n_rep
        W_k = a.k_proj.weight[kv * dh : (kv + 1) * dh].double()
        g = mod.lm.model.layers[row["layer"]].input_layernorm.weight.double()
        omega = (W_q * g).mT @ (W_k * g) / dh**0.5  # folded norm gain on both sides, score scale 1/sqrt(dh)
        S = torch.linalg.svdvals(omega)[:dh]
        want = direction_blocks(S, 0.05, size=omega.shape[-1] + 1)
        terms = row["basis"]["top_terms"]
        assert [t["sigma"] for t in terms] == pytest.approx(S[:3].tolist(), rel=1e-5)
        assert [t["block"]["size"] for t in terms] == want.size[:3].tolist()
        assert row["basis"]["n_isolated"] == int(want.isolated.sum()) and row["basis"]["rank"] == dh


@pytest.fixture(scope="module")
def deep_lm_dir(tiny_lm_dir, tmp_path_factory):
    """The tiny Llama's tokenizer with a 4-layer model."""
    from transformers import AutoTokenizer

    from lit_svd.models.tiny import tiny_causal_lm

    tok = AutoTokenizer.from_pretrained(tiny_lm_dir)
    folder = tmp_path_factory.mktemp("tiny_llama4")
    tiny_causal_lm("llama", vocab_size=len(tok), num_hidden_layers=4).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("layers, per_pass", [(None, 1), ([0, 2, 3], 2)])
def test_layers_per_pass_gives_exactly_the_results_of_one_pass(deep_lm_dir, tmp_path, layers, per_pass):
    """Each later pass starts from the recorded residual stream: every figure is bit-identical (the report
    callback calls results() before the module's epoch end, and still sees every pass)."""
    from lit_svd.datamodules.tasks import TaskDataModule

    def run(name, **kw):
        mod = make_module(deep_lm_dir, min_pairs=1, null_stride=2, layers=layers, **kw)
        dm = TaskDataModule(task="ioi", tokenizer=deep_lm_dir, n_train=0, n_val=0, n_test=6, batch_size=2, seed=0)
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            enable_progress_bar=False,
            default_root_dir=tmp_path / name,
            callbacks=[SADReport()],
        )
        trainer.test(mod, datamodule=dm, verbose=False)
        return mod, json.loads((Path(trainer.log_dir) / "results.json").read_text())

    one, want = run("one")
    split, got = run("split", layers_per_pass=per_pass)
    assert len(one.passes) == 1 and len(split.passes) > 1
    assert got["n_prompts"] == 6 and got["summary"]["n_pairs"] > 0
    for r in (got, want):  # what produced them differs by the option and the time; every measured figure may not
        r.pop("provenance")
        r.get("config", {}).pop("layers_per_pass", None)
    assert json.dumps(got) == json.dumps(want)
    assert list(split.bases) == split.passes[-1] and split._batches == []  # only the last pass's bases are left
