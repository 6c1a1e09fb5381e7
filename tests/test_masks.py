"""Direction masks: kept counts against brute force, the module and callback end to end on tiny models,
configs instantiated with tiny random models, DDP against one process, and bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers import built_cli, quiet_trainer, run_lit_svd

from lit_svd.analysis.masks import hard_masks, kept_report, logit_receptors, mask_loss
from lit_svd.models import view as make_view
from lit_svd.models.hooks import Hook, hooks
from lit_svd.models.intervene import build_components
from lit_svd.models.tiny import tiny_causal_lm
from tests.helpers import fit_masks

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "masks"


def test_kept_counts_match_brute_force():
    view = make_view(tiny_causal_lm("llama"))
    comps = build_components(view)
    g = torch.Generator().manual_seed(0)
    lambdas = {c.name: torch.rand(c.shape, generator=g) ** 4 for c in comps}
    threshold = 0.05
    report = kept_report(comps, lambdas, threshold)
    total = kept = 0
    per_kind: dict[str, int] = {}
    for c in comps:  # brute force: one direction at a time
        G, K = c.shape
        for gi in range(G):
            n_group = 0
            for k in range(K):
                total += 1
                if float(lambdas[c.name][gi, k]) >= threshold:
                    kept += 1
                    n_group += 1
                    per_kind[c.kind] = per_kind.get(c.kind, 0) + 1
            rec = next(r for r in report["components"] if r["name"] == c.name)
            assert rec["kept_per_group"][gi] == n_group
    assert report["n_directions"] == total == sum(c.S.numel() for c in comps)
    assert report["kept"] == kept and 0 < kept < total
    assert {k: v["kept"] for k, v in report["per_kind"].items() if v["kept"]} == per_kind
    hard = hard_masks(lambdas, threshold)
    assert sum(int(h.sum()) for h in hard.values()) == kept
    # without the q / k maps: the OV and MLP directions only
    rest = [c for c in comps if c.kind not in ("q", "k")]
    assert report["without_qk"]["n_directions"] == sum(c.n_directions for c in rest) < total
    assert report["without_qk"]["kept"] == sum(int((lambdas[c.name] >= threshold).sum()) for c in rest)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "qwen3"])
def test_direction_count_matches_the_models_own_matrices(arch):
    """Directions per layer counted from the HF modules' weight shapes: one per singular value of each
    bias-augmented map (min of its two sides), per head / KV head / layer."""
    model = tiny_causal_lm(arch)
    cfg = model.config
    comps = build_components(make_view(model))
    total = 0
    if arch != "gpt2":  # the Llama layout (Qwen2 and Qwen3 too)
        for blk in model.model.layers:
            d = blk.self_attn.q_proj.weight.shape[1]
            dh = blk.self_attn.q_proj.weight.shape[0] // cfg.num_attention_heads
            n_kv = blk.self_attn.k_proj.weight.shape[0] // dh
            d_mlp = blk.mlp.up_proj.weight.shape[0]
            total += cfg.num_attention_heads * min(d + 1, dh)  # q per head
            total += n_kv * min(d + 1, dh)  # k per KV head
            total += cfg.num_attention_heads * min(d + 1, dh, d)  # OV per head: [1, x] -> d_head -> d_model
            total += 2 * min(d + 1, d_mlp) + min(d_mlp + 1, d)  # up, gate, down
    else:
        for blk in model.transformer.h:
            d = blk.attn.c_attn.weight.shape[0]
            dh = d // cfg.n_head
            d_mlp = blk.mlp.c_fc.weight.shape[1]
            total += cfg.n_head * min(d + 1, dh)  # joint QK per head: rank <= d_head
            total += cfg.n_head * min(d + 1, dh, d)  # OV per head
            total += min(d + 1, d_mlp) + min(d_mlp + 1, d)  # MLP in, out
    assert sum(c.n_directions for c in comps) == total


def test_mask_loss_is_kl_plus_alpha_l1():
    full, masked = torch.randn(3, 11), torch.randn(3, 11)
    lambdas = {"a": torch.rand(2, 4)}
    loss, kl, l1 = mask_loss(masked, full, lambdas, alpha=0.5)
    p = full.softmax(-1)
    want_kl = (p * (p.log() - masked.log_softmax(-1))).sum(-1).mean()
    assert torch.allclose(kl, want_kl, atol=1e-6)
    assert torch.allclose(loss, want_kl + 0.5 * lambdas["a"].sum(), atol=1e-6)


def test_logit_receptors_read_the_unembedding():
    model = tiny_causal_lm("llama")
    view = make_view(model)
    comp = build_components(view, ["ov"], layers=[1])[0]
    keep = torch.zeros(comp.shape, dtype=torch.bool)
    keep[2, 0] = True

    class Tok:
        def decode(self, ids):
            return str(ids[0])

    rows = logit_receptors(view, comp, keep, Tok(), top_k=5)
    assert len(rows) == 1 and rows[0]["head"] == 2
    # independent: RMS-normalise v, apply the final norm weight and the tied embedding by hand
    v = comp.V[2, :, 0]
    w = model.model.norm.weight
    logits = (v / v.pow(2).mean().sqrt() * w) @ model.lm_head.weight.T
    assert [int(t) for t in rows[0]["promotes"]] == logits.topk(5).indices.tolist()
    assert [int(t) for t in rows[0]["promotes_negative"]] == (-logits).topk(5).indices.tolist()


def test_swap_steer_matches_a_hand_patched_direction():
    from lit_svd.analysis.masks import swap_steer
    from lit_svd.models.intervene import Intervention

    model = tiny_causal_lm("llama")
    view = make_view(model)
    comp = build_components(view, ["ov"], layers=[1])[0]
    iv = Intervention(view, [comp])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (6, 8), generator=g)
    pos = torch.tensor([7, 6, 7, 5, 7, 6])
    rows = torch.arange(6)
    batch = {
        "answer_pos": pos,
        "correct_id": torch.tensor([5, 5, 5, 9, 9, 9]),
        "wrong_id": torch.tensor([9, 9, 9, 5, 5, 5]),
    }

    def answer(logits):
        return logits[rows, pos]

    with torch.no_grad(), iv.record(positions=pos) as coefs:
        base = answer(model(ids).logits)

    def run(scales, reference):
        with torch.no_grad():
            if scales is None:
                return answer(model(ids).logits)
            with iv.apply(scales, positions=pos, reference=reference):
                return answer(model(ids).logits)

    keep = torch.ones(comp.shape)
    res = swap_steer(run, batch, dict(coefs), {comp.name: keep}, counts=(1,), task="gp")
    # brute force: the most separating (head, direction), one at a time
    c = coefs[comp.name]
    best = max(
        (
            abs(float(c[:3, h, k].mean() - c[3:, h, k].mean()))
            / (float(((c[:3, h, k].var(unbiased=False) + c[3:, h, k].var(unbiased=False)) / 2).sqrt()) + 1e-6),
            h,
            k,
        )
        for h in range(comp.shape[0])
        for k in range(comp.shape[1])
    )
    top = res["directions"][0]
    assert (top["head"], top["direction"]) == best[1:] and top["separation"] == pytest.approx(best[0], rel=1e-4)
    # hand patch: move that coefficient to the other class's mean with a forward hook on o_proj
    h, k = best[1:]
    other = torch.where(rows < 3, c[3:, h, k].mean(), c[:3, h, k].mean())
    delta = (other - c[:, h, k])[:, None] * comp.V[h, :, k]

    def hook(mod, args, kwargs, out):
        out = out.clone()
        out[rows, pos] += delta
        return out

    with hooks(Hook(view.site_module(1, "o"), hook, "post")), torch.no_grad():
        want = answer(model(ids).logits)
    metric = (want[rows, batch["correct_id"]] - want[rows, batch["wrong_id"]]).mean()
    assert res["swaps"][0]["metric"] == pytest.approx(float(metric), abs=1e-4)
    assert (want - base).abs().max() > 1e-4  # the swap changed something
    assert swap_steer(run, {**batch, "correct_id": torch.arange(6)}, dict(coefs), {comp.name: keep}, task="gp") is None


@pytest.mark.parametrize(
    "arch,ablation,straight_through",
    [("llama", "zero", False), ("llama", "patch", True), ("qwen2", "patch", True), ("qwen3", "zero", False)],
)
def test_fit_writes_results_masks_and_figures(tiny_dirs, tokenizer, tmp_path, arch, ablation, straight_through):
    module, out = fit_masks(
        tiny_dirs[arch], tokenizer, tmp_path, ablation=ablation, steps_per_batch=2, straight_through=straight_through
    )
    res = json.loads((out / "results.json").read_text())
    for key in (
        "experiment",
        "task",
        "n_directions",
        "kept",
        "kept_fraction",
        "kl_soft",
        "kl_hard",
        "logit_diff_full",
        "logit_diff_hard",
        "accuracy_full",
        "accuracy_hard",
        "components",
    ):
        assert key in res, key
    assert res["experiment"] == "direction_mask" and res["task"] == "ioi"
    assert res["n_directions"] == sum(c.n_directions for c in module.components)
    assert res["kept"] == sum(r["kept"] for r in res["components"])
    assert res["kept"] < res["n_directions"]  # alpha, lr and threshold prune within 8 steps
    assert res["kl_hard"] >= 0 and res["steering"]["factors"]
    saved = torch.load(out / "masks.pt")
    for name, lam in module.lambdas().items():
        assert torch.equal(saved["lambdas"][name], lam.detach())
    assert (out / "masks_kept_ov.png").is_file() and (out / "masks_kept_mlp_out.png").is_file()


def test_soft_steps_train_soft_then_straight_through(tiny_dirs, tokenizer, tmp_path):
    """A warm-up longer than the run is soft training; a warm-up of 0 is straight-through from the start."""
    lam = {}
    for label, kwargs in {
        "soft": dict(straight_through=False),
        "warm": dict(straight_through=True, soft_steps=100),
        "st": dict(straight_through=True, soft_steps=0),
    }.items():
        torch.manual_seed(0)
        module, _ = fit_masks(tiny_dirs["llama"], tokenizer, tmp_path / label, ablation="zero", **kwargs)
        lam[label] = torch.cat([v.detach().flatten() for v in module.lambdas().values()])
    assert torch.equal(lam["soft"], lam["warm"])
    assert not torch.allclose(lam["soft"], lam["st"], atol=1e-4)


def test_training_seed_changes_the_masks_and_repeats_bitwise(tiny_dirs, tokenizer, tmp_path):
    """``order_seed`` (the training seed) gives another circuit on the same prompts; the same seed repeats."""

    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    def fit(order_seed, label):
        module = DirectionMaskModule(model=tiny_dirs["llama"], lr=0.5, alpha=1e-5, init=0.6, threshold=0.3)
        dm = TaskDataModule("ioi", tokenizer, n_train=16, n_val=4, n_test=0, batch_size=4, order_seed=order_seed)
        quiet_trainer(folder=tmp_path / label, max_steps=3, limit_val_batches=0, num_sanity_val_steps=0).fit(module, dm)
        return torch.cat([v.detach().flatten() for v in module.lambdas().values()])

    first, again, other = fit(None, "a"), fit(0, "b"), fit(1, "c")
    assert torch.equal(first, again)  # the default is the split seed, 0
    assert (first - other).abs().max() > 0.05  # measured 0.47


def test_lr_min_decays_the_learning_rate_over_max_steps(tiny_dirs, tokenizer, tmp_path):
    module, _ = fit_masks(tiny_dirs["llama"], tokenizer, tmp_path, lr_min=0.1)
    lrs = [g["lr"] for g in module.trainer.optimizers[0].param_groups]
    assert lrs == pytest.approx([0.1])  # cosine from lr 0.5 reaches lr_min after max_steps (4) steps
    assert module.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 4


def test_soft_and_hard_evaluation_match_a_rebuilt_weight_forward(tiny_dirs, tokenizer):
    """Masks on one MLP output map (all positions, zero ablation): the module's soft and hard evaluation
    equal the HF forward of a copy of the model whose down_proj weight is rebuilt densely as
    U diag(S * lambda) V^T from its own SVD (soft lambda, and the 0/1 hard mask)."""
    from transformers import AutoModelForCausalLM

    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import kl_divergence, logit_diff
    from lit_svd.modules import DirectionMaskModule

    module = DirectionMaskModule(
        model=tiny_dirs["llama"], components=["mlp_out"], layers=[1], positions="all", ablation="zero", threshold=0.05
    )
    g = torch.Generator().manual_seed(0)
    lam = torch.rand(module.components[0].shape, generator=g) ** 3  # about a third below the threshold
    module.theta["L1_mlp_out"].data = torch.logit(lam)
    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=12, batch_size=6)
    ev = module.evaluate(dm.test_dataloader())

    ref = AutoModelForCausalLM.from_pretrained(tiny_dirs["llama"]).eval()
    down = ref.model.layers[1].mlp.down_proj
    W = down.weight.data.clone().double()  # [d_model, d_mlp]
    U, S, Vh = torch.linalg.svd(W.mT, full_matrices=False)  # the map x @ W^T; directions by singular value
    keep = lam[0].double()
    out = {}
    for setting, scale in (("soft", keep), ("hard", (keep >= 0.05).double())):
        down.weight.data = ((U * (S * scale)) @ Vh).mT.float()
        full, masked = [], []
        for batch in dm.test_dataloader():
            rows = torch.arange(len(batch["answer_pos"]))
            with torch.no_grad():
                masked.append(
                    ref(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"]).logits[
                        rows, batch["answer_pos"]
                    ]
                )
        out[setting] = torch.cat(masked)
    down.weight.data = W.float()
    with torch.no_grad():
        full = torch.cat(
            [
                ref(input_ids=b["clean_ids"], attention_mask=b["attention_mask"]).logits[
                    torch.arange(len(b["answer_pos"])), b["answer_pos"]
                ]
                for b in dm.test_dataloader()
            ]
        )
    ids = {k: torch.cat([b[k] for b in dm.test_dataloader()]) for k in ("correct_id", "wrong_id")}
    for setting in ("soft", "hard"):
        assert ev[f"{setting}_kl"] == pytest.approx(float(kl_divergence(out[setting], full).mean()), rel=1e-3, abs=1e-6)
        assert ev[f"{setting}_metric"] == pytest.approx(
            float(logit_diff(out[setting], ids["correct_id"], ids["wrong_id"]).mean()), abs=1e-4
        )
    assert (
        ev["soft_kl"] > 1e-5 and ev["hard_kl"] > 1e-5 and abs(ev["soft_kl"] - ev["hard_kl"]) > 1e-5
    )  # both act, differently


def test_test_split_is_disjoint_and_leaves_train_and_val_as_without_it(tokenizer):
    from lit_svd.datamodules.tasks import TaskDataModule

    before = TaskDataModule("ioi", tokenizer, n_train=40, n_val=16, n_test=0, seed=3)
    after = TaskDataModule("ioi", tokenizer, n_train=40, n_val=16, n_test=32, seed=3, test_last=True)

    def text(dm, split):
        return [tuple(e.clean_ids) for e in dm.splits[split].examples]

    assert text(after, "train") == text(before, "train") and text(after, "val") == text(before, "val")
    test = set(text(after, "test"))
    assert len(test) == 32 and not test & (set(text(after, "train")) | set(text(after, "val")))
    first = TaskDataModule("ioi", tokenizer, n_train=40, n_val=16, n_test=32, seed=3)  # default: test drawn first
    assert text(first, "val") != text(before, "val")


def test_results_report_test_and_validation_and_stopped_early(tiny_dirs, tokenizer, tmp_path):
    import lightning.pytorch as pl

    from lit_svd.callbacks import DirectionMaskReport
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    results = {}
    for label, limit in (("steps", None), ("time", "00:00:00:01")):
        module = DirectionMaskModule(model=tiny_dirs["llama"], lr=0.5, alpha=1e-5, init=0.6, threshold=0.3)
        dm = TaskDataModule("ioi", tokenizer, n_train=16, n_val=8, n_test=12, batch_size=8, test_last=True)
        trainer = pl.Trainer(
            max_steps=200 if limit else 4,
            max_time=limit,
            accelerator="cpu",
            devices=1,
            default_root_dir=str(tmp_path / label),
            limit_val_batches=0,
            num_sanity_val_steps=0,
            enable_progress_bar=False,
            enable_checkpointing=False,
            callbacks=[
                DirectionMaskReport(eval_split="test", steer_component="L1.ov", steer_head=0, steer_direction=0)
            ],
        )
        trainer.fit(module, dm)
        results[label] = json.loads((Path(trainer.log_dir) / "results.json").read_text())
        res = results[label]
        assert res["splits"]["test"]["n_examples"] == 12 and res["splits"]["val"]["n_examples"] == 8
        assert res["eval_split"] == "test" and res["kl_hard"] == res["splits"]["test"]["kl_hard"]
        assert (res["data_seed"], res["order_seed"]) == (0, 0)  # the training order defaults to the split seed
        # an independent evaluation of the final masks on each split gives the same figures
        for split in ("val", "test"):
            ev = module.evaluate(getattr(dm, f"{split}_dataloader")())
            assert res["splits"][split]["kl_soft"] == pytest.approx(ev["soft_kl"], abs=1e-6)
            assert res["splits"][split]["accuracy_hard"] == pytest.approx(ev["hard_correct"], abs=1e-6)
        assert res["kept_without_qk"]["n_directions"] == sum(
            v["n_directions"] for k, v in res["per_kind"].items() if k not in ("q", "k")
        )
    assert results["steps"]["stopped_early"] is False and results["steps"]["steps"] == 4
    assert results["time"]["stopped_early"] is True and results["time"]["steps"] < 200


def test_eval_split_without_examples_fails_in_one_line(tiny_dirs, tokenizer, tmp_path):
    import lightning.pytorch as pl

    from lit_svd.callbacks import DirectionMaskReport
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    module = DirectionMaskModule(model=tiny_dirs["llama"])
    dm = TaskDataModule("ioi", tokenizer, n_train=8, n_val=8, n_test=0, batch_size=8)
    trainer = pl.Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(tmp_path),
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[DirectionMaskReport(eval_split="test")],
    )
    with pytest.raises(ValueError, match=r"eval_split='test' but the data module's test split is empty"):
        trainer.fit(module, dm)


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.yaml") if not p.stem.endswith("_directions")))
def test_configs_instantiate_with_tiny_models(config, tiny_dirs, tokenizer):
    """Every config parses and builds its module and data with a tiny random model of its architecture."""
    import yaml

    arch = (
        "gpt_neox"
        if "pythia" in config
        else "gpt2"
        if "gpt2" in config
        else "gemma3"
        if "gemma3" in config
        else "llama"
    )
    dirs = ["--model.init_args.model", tiny_dirs[arch], "--data.init_args.tokenizer", tiny_dirs[arch]]
    small = ["--data.init_args.n_train", "8", "--data.init_args.n_val", "4", "--trainer.logger", "false"]
    cli = built_cli("--config", str(CONFIGS / config), *dirs, *small)
    cfg = yaml.safe_load((CONFIGS / config).read_text())
    assert cli.model.alpha == cfg["model"]["init_args"]["alpha"]
    assert cli.datamodule.task.name == cfg["data"]["init_args"]["task"]
    kinds = {c.kind for c in cli.model.components}
    assert kinds == (
        {"qk", "ov", "mlp_in", "mlp_out"}
        if arch == "gpt2"
        else {"q", "k", "ov", "mlp_in", "mlp_out"} | ({"mlp_gate"} if arch in ("llama", "gemma3") else set())
    )


@pytest.mark.slow
def test_ddp_two_processes_match_one(tiny_dirs, tmp_path):
    """Same global batch (8 prompts: the whole train split) in 1 process x 8 and 2 processes x 4."""
    masks = {}
    for devices, batch in ((1, 8), (2, 4)):
        root = tmp_path / f"d{devices}"
        run_lit_svd(
            [
                "fit",
                "--config",
                str(CONFIGS / "smollm2_ioi.yaml"),
                "--model.init_args.model",
                tiny_dirs["llama"],
                "--model.init_args.lr",
                "0.3",
                "--model.init_args.alpha",
                "0.01",
                "--model.init_args.init",
                "0.5",
                "--data.init_args.tokenizer",
                tiny_dirs["llama"],
                "--data.init_args.n_train",
                "8",
                "--data.init_args.n_val",
                "8",
                "--data.init_args.batch_size",
                str(batch),
                "--trainer.max_steps",
                "3",
                "--trainer.devices",
                str(devices),
                "--trainer.strategy",
                "ddp" if devices > 1 else "auto",
                "--trainer.default_root_dir",
                str(root),
            ],
            cwd=ROOT,
        )
        masks[devices] = torch.load(next(root.rglob("masks.pt")))["lambdas"]
        res = json.loads(next(root.rglob("results.json")).read_text())
        masks[f"res{devices}"] = res
    moved = 0.0
    for name, lam in masks[1].items():
        assert torch.allclose(lam, masks[2][name], atol=1e-5), name
        moved = max(moved, float((lam - 0.95).abs().max()))
    assert moved > 0.1  # the masks trained
    assert abs(masks["res1"]["kl_soft"] - masks["res2"]["kl_soft"]) < 1e-5


def test_bad_inputs_fail_in_one_line(tiny_dirs, tokenizer):
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    with pytest.raises(ValueError, match=r"alpha=-0.1 is invalid"):
        DirectionMaskModule(model=tiny_dirs["llama"], alpha=-0.1)
    with pytest.raises(ValueError, match="components='heads' is unknown; choose one of "):
        DirectionMaskModule(model=tiny_dirs["llama"], components=["heads"])
    with pytest.raises(ValueError, match="ablation='mean' is unknown"):
        DirectionMaskModule(model=tiny_dirs["llama"], ablation="mean")
    with pytest.raises(ValueError, match="lr_min=0.9 is invalid"):
        DirectionMaskModule(model=tiny_dirs["llama"], lr=0.5, lr_min=0.9)
    with pytest.raises(ValueError, match="soft_steps=-1 is invalid"):
        DirectionMaskModule(model=tiny_dirs["llama"], straight_through=True, soft_steps=-1)
    # a task the tokenizer cannot express: a byte-level tokenizer without merges (" he" is three tokens)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    raw = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="!")
    assert len(tok.encode(" he")) == 3
    with pytest.raises(ValueError, match=r"task gp: .* single tokens? in this tokenizer"):
        TaskDataModule("gp", tok, n_train=4, n_val=0, n_test=0)


def test_mask_curve_reads_runs_in_alpha_order(tmp_path):
    from lit_svd.cli_tools import load_runs, run_tool
    from lit_svd.results import MaskCurveResult, MaskResult

    required = {  # a direction_mask results.json needs every field without a default
        MaskResult.json_key(f): 0
        for f in MaskResult.content_fields()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }

    for name, alpha, kept, kl in (("b", 2e-4, 0.05, 0.4), ("a", 5e-5, 0.12, 0.1)):
        run = tmp_path / name / "version_0"
        run.mkdir(parents=True)
        traj = [{"step": 8, "kept_fraction": 0.3, "kl_soft": 0.2, "kl_hard": 0.5}]
        (run / "results.json").write_text(
            json.dumps(
                {
                    **required,
                    "experiment": "direction_mask",
                    "task": "ioi",
                    "model": "m",
                    "alpha": alpha,
                    "kept_fraction": kept,
                    "kl_hard": kl,
                    "kl_soft": kl,
                    "trajectory": traj,
                }
            )
        )
    runs = load_runs([tmp_path / "b", tmp_path / "a"])
    assert [r["alpha"] for r in runs] == [5e-5, 2e-4] and [r["kl_hard"] for r in runs] == [0.1, 0.4]
    run_tool(["mask-curve", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "curve.png")])
    assert (tmp_path / "curve.png").stat().st_size > 1000
    curve = MaskCurveResult.from_json(tmp_path / "curve.json")  # the results beside the figure
    assert [r["alpha"] for r in curve.runs] == [5e-5, 2e-4]
    run_tool(["mask-curve", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "curve")])
    assert MaskCurveResult.from_json(tmp_path / "curve" / "results.json").runs == curve.runs
    assert (tmp_path / "curve" / "mask_curve.png").stat().st_size > 1000
    assert (tmp_path / "curve" / "mask_curve.csv").read_text().splitlines()[0].startswith("label,alpha")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "results.json").write_text(json.dumps({"experiment": "sad"}))
    with pytest.raises(ValueError, match="not 'direction_mask'"):
        load_runs([tmp_path / "c"])
    with pytest.raises(FileNotFoundError, match="no results.json"):
        load_runs([tmp_path / "missing"])


def test_evaluate_tool_prints_the_metrics_of_evaluate_task(tiny_dirs, tmp_path, capsys):
    """``python -m lit_svd.cli_tools evaluate`` reports what ``evaluate_task`` computes on the same prompts."""
    from lit_svd.cli_tools import run_tool
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import evaluate_task
    from lit_svd.models.loading import load_causal_lm
    from lit_svd.results import EvaluateResult

    got = run_tool(
        [
            "evaluate",
            "--task",
            "ioi",
            "--model",
            tiny_dirs["llama"],
            "--n-test",
            "6",
            "--batch-size",
            "3",
            "--figure",
            str(tmp_path / "tasks.png"),
            "--out",
            str(tmp_path / "eval"),
        ]
    )
    model, tok = load_causal_lm(tiny_dirs["llama"])
    dm = TaskDataModule("ioi", tok, n_train=0, n_val=0, n_test=6, batch_size=6, seed=0)
    want = evaluate_task(model, dm.test_dataloader(), "ioi", progress=False)
    assert json.loads(capsys.readouterr().out)["logit_diff"] == pytest.approx(want["logit_diff"], abs=1e-5)
    assert got.tasks[0]["kl_clean_corrupt"] == pytest.approx(want["kl_clean_corrupt"], abs=1e-5)
    assert (tmp_path / "tasks.png").stat().st_size > 1000
    saved = EvaluateResult.from_json(tmp_path / "eval" / "results.json")
    assert saved.tasks[0]["logit_diff"] == got.tasks[0]["logit_diff"] and len(saved.tasks[0]["values"]["clean"]) == 6
    assert (tmp_path / "eval" / "tasks.png").stat().st_size > 1000


def test_mask_thresholds_recuts_a_finished_run_and_chooses_on_validation(tiny_dirs, tokenizer, tmp_path):
    """The tool reloads masks.pt: at the run's own threshold it reproduces the run's test figures; below every
    lambda it keeps everything at KL 0; kept fractions equal a recount of masks.pt; the choice reads
    validation only."""
    import lightning.pytorch as pl
    import yaml

    from lit_svd.callbacks import DirectionMaskReport
    from lit_svd.cli_tools import choose_threshold, run_tool
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    model_kw = dict(model=tiny_dirs["llama"], lr=0.5, alpha=1e-5, init=0.6, threshold=0.3)
    data_kw = dict(task="ioi", tokenizer=tiny_dirs["llama"], n_train=8, n_val=8, n_test=8, batch_size=8)
    trainer = pl.Trainer(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        default_root_dir=str(tmp_path / "run"),
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[DirectionMaskReport(eval_split="test", steer_component="L1.ov", steer_head=0, steer_direction=0)],
    )
    trainer.fit(DirectionMaskModule(**model_kw), TaskDataModule(**data_kw))
    run = Path(trainer.log_dir)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"init_args": model_kw}, "data": {"init_args": data_kw}}))
    res = json.loads((run / "results.json").read_text())
    lam = torch.cat([v.flatten() for v in torch.load(run / "masks.pt")["lambdas"].values()])
    low = float(lam.min()) / 2
    tool = run_tool(
        [
            "mask-thresholds",
            str(run),
            "--out",
            str(tmp_path / "cut"),
            "--thresholds",
            str(low),
            "0.3",
            "0.9",
            "--max-kl",
            "1e9",
        ]
    ).summary
    rows = {r["threshold"]: r for r in tool["rows"]}
    for t, row in rows.items():
        assert row["kept_fraction"] == pytest.approx(float((lam >= t).double().mean()), abs=1e-12)
    assert 0 < rows[0.3]["kept_fraction"] < 1  # the run pruned something
    for split in ("val", "test"):
        assert rows[0.3][split]["kl_hard"] == pytest.approx(res["splits"][split]["kl_hard"], rel=1e-4, abs=1e-7)
        # the soft KL comes by another path in the run than in the tool: float32 KL of near-equal distributions
        # (7e-4 here) carries ~1e-7 of absolute noise (0.9e-7 measured; 1.05e-7 after a rounding-level change)
        assert rows[0.3][split]["kl_soft"] == pytest.approx(res["splits"][split]["kl_soft"], rel=1e-4, abs=3e-7)
        assert rows[low][split]["kl_hard"] == pytest.approx(0.0, abs=1e-6)
    assert tool["chosen"]["threshold"] == 0.9  # every threshold qualifies: the sparsest
    assert (tmp_path / "cut" / "mask_thresholds.png").stat().st_size > 1000
    # the choice reads validation only: a threshold that is better on test but over the line on val loses
    synthetic = [
        {"threshold": 0.1, "val": {"kl_hard": 0.20}, "test": {"kl_hard": 0.40}},
        {"threshold": 0.5, "val": {"kl_hard": 0.30}, "test": {"kl_hard": 0.10}},
    ]
    assert choose_threshold(synthetic, 0.25)["threshold"] == 0.1 and choose_threshold(synthetic, 0.05) is None
    with pytest.raises(ValueError, match="must lie in"):
        run_tool(["mask-thresholds", str(run), "--out", str(tmp_path / "x"), "--thresholds", "1.5"])
