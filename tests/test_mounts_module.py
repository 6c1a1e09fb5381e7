"""MountsAnalysisModule and its model-facing helpers against the HF forward pass of tiny models.

The references here name Hugging Face modules on purpose: they are the independent computation the
view-based code must agree with.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_svd.analysis import mounts as M
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, capture, hooks
from lit_svd.models.tiny import ARCHITECTURES, tiny_causal_lm
from lit_svd.modules.mounts import READING_SLICE, MountsAnalysisModule, last_logits, steering, unembed_reading
from tests.helpers import quiet_trainer, run_test

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEERED = ARCHITECTURES + ("qwen3",)  # Gemma-3's post norms are Gemma-2's, checked there
TINY_TILES = {"q": 32, "k": 16, "v": 16, "o": 32, "gate": 32, "up": 32, "down": 64}


def _hf_parts(model, arch, layer):
    """(attention write module, MLP write module, final norm) by HF name, per architecture."""
    if arch in (
        "llama",
        "qwen2",
        "qwen3",
        "gemma2",
    ):  # Gemma-2: the outputs pass through the post norms, as a steer does
        blk = model.model.layers[layer]
        return blk.self_attn.o_proj, blk.mlp.down_proj, model.model.norm
    if arch == "gpt2":
        blk = model.transformer.h[layer]
        return blk.attn.c_proj, blk.mlp.c_proj, model.transformer.ln_f
    blk = model.gpt_neox.layers[layer]
    return blk.attention.dense, blk.mlp.dense_4h_to_h, model.gpt_neox.final_layer_norm


def _add_output(module, add):
    return Hook(module, lambda mod, args, kwargs, out: out + add, "post")


@pytest.mark.parametrize("arch", STEERED)
@pytest.mark.parametrize("site", ["o", "down"])
def test_steering_adds_alpha_u_to_the_sublayers_write(arch, site):
    model = tiny_causal_lm(arch, seed=0)
    view = make_view(model)
    ids = torch.randint(0, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    u = torch.randn(view.d_model, generator=torch.Generator().manual_seed(1))
    alpha = 2.0
    layer = 0
    attn_w, mlp_w, _ = _hf_parts(model, arch, layer)
    with torch.no_grad():
        with hooks(_add_output(attn_w if site == "o" else mlp_w, alpha * u)):  # what enters the residual sum
            want = model(ids).logits
        with steering(view, layer, site, alpha * u):
            got = model(ids).logits
        base = model(ids).logits
    assert (got - base).abs().max() > 1e-3  # the steer does something
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # and the block output moves by exactly alpha * u for the MLP write (no post norm in between)
    if site == "down" and arch != "gemma2":
        with torch.no_grad():
            with capture({0: view.block(layer)}, "post") as before:
                model(ids)
            with steering(view, layer, site, alpha * u), capture({0: view.block(layer)}, "post") as after:
                model(ids)  # the capture runs after the steering hook
        torch.testing.assert_close(after[0] - before[0], (alpha * u).expand_as(before[0]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", STEERED)
def test_last_position_steering_with_cached_prefix_matches_a_full_forward(arch):
    model = tiny_causal_lm(arch, seed=0)
    view = make_view(model)
    ids = torch.randint(0, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    add = 2.0 * torch.randn(view.d_model, generator=torch.Generator().manual_seed(1))
    _, mlp_w, _ = _hf_parts(model, arch, 0)

    def last_only(mod, args, kwargs, out):  # the reference: full forward, alpha * u at the last position only
        out = out.clone()
        out[:, -1] += add
        return out

    with torch.no_grad():
        with hooks(Hook(mlp_w, last_only, "post")):
            want = model(ids).logits[:, -1]
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        torch.testing.assert_close(last_logits(model, ids, cache), model(ids).logits[:, -1], rtol=1e-5, atol=1e-5)
        with steering(view, 0, "down", add):
            got = last_logits(model, ids, cache)
        again = last_logits(model, ids, cache)  # the cache is not consumed
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, model(ids).logits[:, -1], rtol=1e-5, atol=1e-5)


def test_steering_refuses_non_residual_sites():
    view = make_view(tiny_causal_lm("llama"))
    with pytest.raises(
        ValueError, match="^site='q' is unknown as a residual write \\(steering\\); choose one of o, down$"
    ):
        with steering(view, 0, "q", torch.zeros(view.d_model)):
            pass


@pytest.mark.parametrize("arch", STEERED)
def test_unembedding_reading_matches_the_models_own_final_norm(arch):
    model = tiny_causal_lm(arch, seed=0)
    view = make_view(model)  # folded norms, as the module uses
    U = torch.randn(5, view.d_model, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = unembed_reading(view, U.float())
    _, _, norm = _hf_parts(model, arch, 0)
    head = model.get_output_embeddings()
    with torch.no_grad():
        want = head(norm(U.float())) - head(norm(torch.zeros(1, view.d_model)))
    torch.testing.assert_close(got.float(), want, rtol=1e-4, atol=1e-4)
    # float64 directions: the vocabulary taken a slice at a time equals one whole product
    W_U = view.unembed()[0]
    assert W_U.shape[1] > READING_SLICE  # several slices
    whole = (view.normalized("final", None, U) - view.normalized("final", None, torch.zeros_like(U[:1]))) @ W_U.double()
    torch.testing.assert_close(unembed_reading(view, U, W_U), whole, rtol=1e-12, atol=1e-12)


# --- the module on a tiny Llama saved to disk ---------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llama_dir(tiny_dirs):
    return tiny_dirs["llama"]


def _batches(n=4, b=4, L=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 2000, (b, L), generator=g)} for _ in range(n)]


def _run(module, batches):
    run_test(module, batches)
    return {(r["site"], r["layer"]): r for r in module.rows}


def _capture(model, batches, modules):
    """Inputs and outputs of the given HF modules over all batches, batch by batch (independent hooks)."""
    got = {name: [] for name in modules}
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    for b in batches:
        with torch.no_grad(), capture(modules, "pre") as ins, capture(modules, "post") as outs:
            model(**b)
        for name in modules:
            got[name].append((flat(ins[name]), flat(outs[name])))
    return got


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])  # Qwen2: biased q / k / v sites
def test_module_fits_effective_paths_on_held_out_batches_only(tiny_dirs, arch):
    batches = _batches()
    module = MountsAnalysisModule(
        model=tiny_dirs[arch],
        tile_widths=TINY_TILES,
        modes_sweep=[1, 2, 4],
        layers=[1],
        fit_fraction=0.5,
        steer_texts=2,
        steer_mounts=2,
    )
    rows = _run(module, batches)
    blk = module.lm.model.layers[1]
    cap = _capture(
        module.lm,
        batches,
        {
            "v": blk.self_attn.v_proj,
            "o": blk.self_attn.o_proj,
            "gate": blk.mlp.gate_proj,
            "up": blk.mlp.up_proj,
            "down": blk.mlp.down_proj,
            "q": blk.self_attn.q_proj,
        },
    )
    fit, score = slice(0, 2), slice(2, 4)  # 4 batches, fit_fraction 0.5
    X = torch.cat([x for x, _ in cap["v"][fit]]).double()
    Z = torch.cat([z for z, _ in cap["o"][fit]]).double()
    W_v = M.ridge_map(X.mT @ X, X.mT @ Z, module.hparams.v_ridge)
    torch.testing.assert_close(module.plans["L1_v"].W, W_v.float(), rtol=1e-6, atol=1e-7)  # plans hold float32
    gate = torch.cat([module.view.mlp(1).act(g) for _, g in cap["gate"][fit]]).double().mean(0)
    W_up = M.gate_weighted(blk.mlp.up_proj.weight.double(), gate)
    torch.testing.assert_close(module.plans["L1_up"].W, W_up.float(), rtol=1e-6, atol=1e-7)
    # the effective paths are scored on the other half only, the module sites on everything
    n_tok = sum(b["input_ids"].numel() for b in batches)
    assert rows[("v", 1)]["n_tokens"] == rows[("up", 1)]["n_tokens"] == n_tok // 2
    assert rows[("q", 1)]["n_tokens"] == n_tok
    # and their sums are exactly those of the held-out activations
    xs = torch.cat([x for x, _ in cap["v"][score]])
    zs = torch.cat([z for z, _ in cap["o"][score]])
    want = M.summarize(module.plans["L1_v"], M.site_sums(module.plans["L1_v"], xs, zs))
    assert rows[("v", 1)]["lift_tiled"] == pytest.approx(want["lift_tiled"], abs=1e-6)
    xq = torch.cat([x for x, _ in cap["q"]])
    yq = torch.cat([y for _, y in cap["q"]])
    want_q = M.summarize(module.plans["L1_q"], M.site_sums(module.plans["L1_q"], xq, yq))
    for key in ("lift_tiled", "lift_whole", "lift_columns", "lift_random", "span_tiled"):
        assert rows[("q", 1)][key] == pytest.approx(want_q[key], abs=1e-6)
    assert rows[("q", 1)]["coverage_lift"] == pytest.approx(want_q["coverage_lift"], abs=1e-6)
    # every row is judged and steering ran on the residual writes
    assert {r["site"] for r in module.rows} == {"q", "k", "v", "o", "gate", "up", "down"}
    assert all("pass" in r for r in module.rows)
    assert -1 <= rows[("o", 1)]["steer_rho"] <= 1 and "steer_rho" not in rows[("q", 1)]


@pytest.mark.parametrize("arch,site", [("llama", "gate"), ("gpt2", "up")])
def test_input_side_ceiling_equals_the_output_pca(tiny_dirs, arch, site):
    """Wide module sites (d_in + 1 < d_out) sum the ceiling's Gram on the input side ([x, 1], mapped back by
    [W | b]; GPT-2's c_fc has a bias): the same figure as a numpy PCA of the site's real outputs."""
    batches = _batches(n=2)
    module = MountsAnalysisModule(
        model=tiny_dirs[arch],
        tile_widths=TINY_TILES,
        modes_sweep=[1, 2, 4],
        layers=[1],
        sites=[site],
        effective_paths=False,
        null_control=False,
    )
    rows = _run(module, batches)
    plan = module.plans[f"L1_{site}"]
    assert plan.affine is not None and plan.gram_dim == plan.W.shape[1] + 1 < plan.d_out
    hf = module.lm.model.layers[1].mlp.gate_proj if arch == "llama" else module.lm.transformer.h[1].mlp.c_fc
    y = torch.cat([out for _, out in _capture(module.lm, batches, {"w": hf})["w"]]).double()
    Y = (y / y.norm(dim=1, keepdim=True)).numpy()
    evals = np.linalg.eigvalsh(Y.T @ Y)[::-1]
    assert rows[(site, 1)]["span_ceiling"] == pytest.approx(evals[: plan.n].sum() / len(Y), abs=1e-5)


def test_module_scores_the_null_and_the_ceiling_on_the_same_tokens(tiny_llama_dir):
    batches = _batches(n=2)
    module = MountsAnalysisModule(
        model=tiny_llama_dir,
        tile_widths=TINY_TILES,
        modes_sweep=[1, 2, 4],
        layers=[1],
        sites=["q", "o"],
        effective_paths=False,
        null_stride=3,
        steer_texts=2,
        steer_mounts=2,
        rules={"c1_min_layer": 0},
    )
    rows = _run(module, batches)
    blk = module.lm.model.layers[1]
    cap = _capture(module.lm, batches, {"q": blk.self_attn.q_proj})
    x, y = (torch.cat([c[i] for c in cap["q"]]) for i in (0, 1))
    plan, null = module.plans["L1_q"], module.null_plans["L1_q"]
    # the null: the real matrix's singular values, other singular vectors, scored on every 3rd token of each batch
    torch.testing.assert_close(
        torch.linalg.svdvals(null.W.double()), torch.linalg.svdvals(plan.W.double()), rtol=1e-5, atol=1e-6
    )  # float32 storage
    assert abs(float(torch.linalg.svd(null.W)[0][:, 0] @ torch.linalg.svd(plan.W)[0][:, 0])) < 0.9
    xs = torch.cat([c[0][::3] for c in cap["q"]])
    want = M.summarize(null, M.site_sums(null, xs, xs @ null.W.mT, ceiling=False))
    got = rows[("q", 1)]["null"]
    assert got["n_tokens"] == len(xs) and got["lift_tiled"] == pytest.approx(want["lift_tiled"], abs=1e-6)
    assert got["coverage_lift"] == pytest.approx(want["coverage_lift"], abs=1e-6)
    # the ceiling: the top-n uncentred principal directions of the normalised outputs, by numpy
    Y = (y / y.norm(dim=1, keepdim=True)).double().numpy()
    evals = np.linalg.eigvalsh(Y.T @ Y)[::-1]
    assert rows[("q", 1)]["span_ceiling"] == pytest.approx(evals[: plan.n].sum() / len(Y), abs=1e-5)
    # judged by the same rules, steering included on the residual write
    for site in ("q", "o"):
        assert set(rows[(site, 1)]["null"]["checks"]) == set(rows[(site, 1)]["checks"])
    assert -1 <= rows[("o", 1)]["null"]["steer_rho"] <= 1 and rows[("o", 1)]["null"]["checks"]["C1"] is not None


def test_scaled_tile_widths_on_the_models_own_sizes(tiny_llama_dir):
    module = MountsAnalysisModule(
        model=tiny_llama_dir, tile_widths="scaled", modes_per_tile=1, modes_sweep=[1], layers=[0]
    )
    v = module.view
    d_in = {
        "q": v.d_model,
        "k": v.d_model,
        "v": v.d_model,
        "o": v.n_heads * v.d_head,
        "gate": v.d_model,
        "up": v.d_model,
        "down": v.d_mlp,
    }
    assert module.tile_widths == {s: M.scaled_tile_width(s, d) for s, d in d_in.items()}
    fixed = MountsAnalysisModule(model=tiny_llama_dir, tile_widths={**TINY_TILES, "q": 16}, layers=[0])
    assert fixed.tile_widths["q"] == 16 and fixed.tile_widths["down"] == TINY_TILES["down"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tile_widths": {**TINY_TILES, "q": 0}}, r"tile_widths\.q=0 is not allowed"),
        ({"tile_widths": {**TINY_TILES, "k": 65}}, r"tile_widths\.k=65 is not allowed"),
        ({"tile_widths": {**TINY_TILES, "qq": 8}}, r"tile_widths key 'qq' is unknown"),
        ({"modes_per_tile": 33}, r"modes_per_tile=33 is not allowed"),
        ({"modes_sweep": [1, 2, 40]}, r"modes_sweep=40 is not allowed"),
        ({"sites": ["q", "attn"]}, r"sites='attn' is unknown; choose one of q, k, v, o, gate, up, down"),
        ({"layers": [5]}, r"layers: layer 5 is out of range; the model has 2 layers \(0..1\)"),
        ({"fit_fraction": 1.0}, r"fit_fraction=1.0 is not allowed"),
        ({"rules": {"a9": 1}}, r"rules key 'a9' is unknown"),
        ({"tile_widths": "wide"}, r"tile_widths='wide' is not allowed"),
        ({"null_stride": 0}, r"null_stride=0 is not allowed"),
    ],
)
def test_module_bad_config_fails_at_construction(tiny_llama_dir, kwargs, match):
    with pytest.raises((ValueError, IndexError), match=match) as err:
        MountsAnalysisModule(model=tiny_llama_dir, **{"tile_widths": TINY_TILES, **kwargs})
    assert "\n" not in str(err.value)


def test_token_budget_larger_than_the_corpus_fails_with_one_line(tiny_llama_dir, tmp_path):
    from lit_svd.datamodules.text import TextDataModule

    text = tmp_path / "tiny.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n" * 20)
    with pytest.raises(ValueError, match=r"\(test 16384\) need 128 windows of seq_len=128") as err:
        TextDataModule(tokenizer=tiny_llama_dir, path=str(text), seq_len=128, n_tokens=0, test_tokens=16384)
    assert "\n" not in str(err.value)


DDP_KW = dict(tile_widths=TINY_TILES, modes_sweep=[1, 2, 4], steer_texts=4, steer_mounts=2, rules={"c1_min_layer": 0})
DDP_SCRIPT = textwrap.dedent(
    f"""
    import json, sys, torch
    import lightning.pytorch as pl
    from lit_svd.cli import end_process_group
    from lit_svd.modules.mounts import MountsAnalysisModule
    model_dir, out = sys.argv[1], sys.argv[2]
    g = torch.Generator().manual_seed(0)
    data = [{{"input_ids": w}} for w in torch.randint(0, 2000, (16, 16), generator=g)]
    module = MountsAnalysisModule(model=model_dir, layers_per_pass=1, **{DDP_KW!r})
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.test(module, dataloaders=torch.utils.data.DataLoader(data, batch_size=4), verbose=False)
        if trainer.is_global_zero:
            json.dump(module.rows, open(out, "w"))
    finally:
        end_process_group()  # before exit: a live gloo group can abort a finished run
"""
)


@pytest.mark.slow
def test_ddp_two_processes_give_the_same_table_as_one(tiny_llama_dir, tmp_path):
    # two DDP processes in a subprocess (pytest itself is not forked), a layer per pass, against one process
    # scoring both layers in one pass
    script = tmp_path / "ddp_mounts.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "rows_ddp.json"
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), tiny_llama_dir, str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads(out.read_text())
    # one process, here, on the same 16 windows in batches of 4
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": w} for w in torch.randint(0, 2000, (16, 16), generator=g)]
    module = MountsAnalysisModule(model=tiny_llama_dir, **DDP_KW)
    trainer = quiet_trainer()
    trainer.test(module, dataloaders=torch.utils.data.DataLoader(data, batch_size=4), verbose=False)
    one = json.loads(json.dumps(module.rows))
    assert len(one) == len(two) == 14
    for a, b in zip(one, two):
        assert (a["site"], a["layer"], a["n_tokens"]) == (b["site"], b["layer"], b["n_tokens"])
        assert a["checks"] == b["checks"]
        for key, value in a.items():
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, abs=1e-6), (a["site"], a["layer"], key)
            elif isinstance(value, list) and value and isinstance(value[0], float):
                assert b[key] == pytest.approx(value, abs=1e-6), (a["site"], a["layer"], key)


# --- bounded memory: a group of layers per pass over the tokens ---------------------------------
@pytest.fixture(scope="module")
def deep_tiny_dirs(tmp_path_factory, tokenizer):
    """4-layer tiny Llama, Gemma-3 and Qwen2 (sliding-window and global layers) saved like any local model."""
    out = {}
    deeper = {
        "llama": dict(num_hidden_layers=4),
        "gemma3": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2),
        "qwen2": dict(num_hidden_layers=4, layer_types=["full_attention"] + ["sliding_attention"] * 3),
    }
    for arch, overrides in deeper.items():
        folder = tmp_path_factory.mktemp(f"tiny4_{arch}")
        tiny_causal_lm(arch, **overrides).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        out[arch] = str(folder)
    return out


PASS_KW = dict(tile_widths=TINY_TILES, modes_sweep=[1, 2, 4], steer_texts=2, steer_mounts=2, null_stride=2)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2"])
@pytest.mark.parametrize("layers, per_pass", [(None, 1), ([0, 2, 3], 2), ([3, 1], 1)])
def test_layers_per_pass_gives_exactly_the_table_of_one_pass(deep_tiny_dirs, arch, layers, per_pass):
    """Each later pass starts from the recorded residual stream and stops after its layers: every figure,
    effective paths, ceiling, null and steering included, is bit-identical to scoring all layers at once."""
    batches = _batches(n=4, L=20)
    kw = dict(model=deep_tiny_dirs[arch], layers=layers, rules={"c1_min_layer": 0}, **PASS_KW)
    one = MountsAnalysisModule(**kw)
    split = MountsAnalysisModule(**kw, layers_per_pass=per_pass)
    assert len(one.passes) == 1 and len(split.passes) > 1
    want, got = _run(one, batches), _run(split, batches)
    assert list(got) == list(want)  # same rows in the same (layer-sorted) order
    assert json.dumps(split.rows) == json.dumps(one.rows)
    assert split._batches == [] and split._resume == {}  # the stored ids and boundaries are dropped
    assert set(split.plans) == {f"L{l}_{s}" for l in split.passes[-1] for s in split.sites}  # the last pass's only


def _reported_run(module, batches, folder) -> Path:
    """A test run with the mounts report, logging nowhere but ``folder``; returns its results.json."""
    from lit_svd.callbacks.mounts import MountsReport

    run_test(module, batches, folder, [MountsReport()])
    return Path(folder) / "results.json"


def test_mounts_merge_joins_parts_into_the_whole_runs_results(deep_tiny_dirs, tmp_path, capsys):
    """A site-layer's row depends on its own layer only: ``cli_tools mounts-merge`` of two runs over disjoint layers
    (e.g. a large model scored in parts) writes the whole run's results, bit for bit: the same rows, pass tables,
    null pass count and real-against-null test; parts that overlap or differ in a setting fail in one line."""
    from lit_svd.cli_tools import main as tools

    batches = _batches(n=4, L=20)
    kw = dict(model=deep_tiny_dirs["llama"], rules={"c1_min_layer": 0}, layers_per_pass=1, **PASS_KW)
    whole = json.loads(_reported_run(MountsAnalysisModule(**kw), batches, tmp_path / "whole").read_text())
    for name, layers in (("b", [2, 3]), ("a", [0, 1])):
        _reported_run(MountsAnalysisModule(**kw, layers=layers), batches, tmp_path / name)
    merged = tools(["mounts-merge", str(tmp_path / "b"), str(tmp_path / "a"), "--out", str(tmp_path / "m")])
    got = json.loads((tmp_path / "m" / "results.json").read_text())
    for key in ("sites", "pass_table", "n_pass", "pass_table_null", "n_pass_null", "discriminating", "site_summary"):
        assert json.dumps(got[key]) == json.dumps(whole[key]), key
    assert got["n_site_layers"] == len(whole["sites"]) and got["config"]["layers"] == [0, 1, 2, 3]
    assert merged.n_pass == whole["n_pass"] and (tmp_path / "m" / "sites.csv").is_file()
    with pytest.raises(SystemExit):
        tools(["mounts-merge", str(tmp_path / "b"), str(tmp_path / "b" / "results.json"), "--out", str(tmp_path / "x")])
    assert "layer 2 q is also in" in capsys.readouterr().err
    other = json.loads((tmp_path / "a" / "results.json").read_text())
    other["config"]["null_stride"] = 1
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "results.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit):
        tools(["mounts-merge", str(tmp_path / "b"), str(tmp_path / "d"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert "settings differ from" in err and "in null_stride;" in err


def test_run_blocks_resumes_from_a_recorded_boundary_and_stops(deep_tiny_dirs):
    from lit_svd.models.hooks import capture
    from lit_svd.models.layer_passes import layer_groups, pass_bounds, run_blocks

    module = MountsAnalysisModule(model=deep_tiny_dirs["gemma3"], tile_widths=TINY_TILES)
    lm, view = module.lm, module.view
    ids = _batches(n=1)[0]["input_ids"]
    calls = []
    counting = hooks(*[Hook(view.block(l), lambda *a, l=l: calls.append(l)) for l in range(4)])
    with torch.no_grad(), capture({l: view.block(l) for l in range(4)}, "post") as full:
        lm(input_ids=ids)
        with counting:
            boundary = run_blocks(view, lambda: lm(input_ids=ids), stop=1, record=1)
    assert calls == [0, 1]  # stopped after block 1
    torch.testing.assert_close(boundary, full[1], rtol=0, atol=0)
    calls.clear()
    counting = hooks(
        *[Hook(view.block(l), lambda *a, l=l: calls.append(l)) for l in range(4)],
        *[Hook(view.site_module(l, "q"), lambda *a, l=l: calls.append(f"q{l}")) for l in range(4)],
    )
    with torch.no_grad(), counting, capture({3: view.block(3)}, "post") as late:
        run_blocks(view, lambda: lm(input_ids=ids), start=2, resume=boundary)
    torch.testing.assert_close(late[3], full[3], rtol=0, atol=0)  # blocks 2-3 see exactly the full model's input
    assert calls == [0, 1, "q2", 2, "q3", 3]  # blocks 0-1 compute nothing; hooks on them still run
    assert "forward" not in view.block(0).__dict__  # the replay is undone
    with pytest.raises(ValueError, match="needs the recorded output of block 1"):
        run_blocks(view, lambda: lm(input_ids=ids), start=2)
    assert layer_groups([3, 1, 3, 0], 2) == [[0, 1], [3]]
    assert [pass_bounds([[0, 1], [3]], p) for p in (0, 1)] == [(0, 2, 2), (3, 3, None)]
    with pytest.raises(ValueError, match="layers_per_pass=0 is not allowed"):
        layer_groups([0], 0)
