"""SAD during training: SADCallback on the toy fit (against a brute-force per-sample loop) and on a
LanguageModelModule trained on real text; the compacted vocabulary against a plain count."""

import json
import math
import re
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lit_svd.analysis.sad import QKHeads, rotated_bases, sad_pairs, toy_head_sparsity
from lit_svd.callbacks.sad import SADCallback
from lit_svd.linalg import rolls_tovee_sparsity, svd_factored
from lit_svd.modules.language_model import LanguageModelModule, top_k_id_map


def brute_toy_sparsity(module, feats, instance, seed=0):
    """Mean sparsity over analysed (sample, key) pairs of one toy instance, one pair at a time."""
    W_Q, W_K = module.head_weights()
    H = module.d_heads[instance]
    A_q, A_k = W_Q[instance, :H].T.double(), W_K[instance, :H].T.double()  # [D, H]
    U = svd_factored(A_q, A_k).U
    U_rot = rotated_bases(U[None], seed + instance)[0]
    omega = A_q @ A_k.T
    sp, sp_rot = [], []
    for b in range(feats.shape[1]):
        x = feats[instance, b].double() @ module.W[instance].detach().double().T  # [1 + m, D]
        r, keys = x[0], x[1:]
        l = torch.stack([r @ omega @ s for s in keys])
        p = torch.softmax(l, 0)
        m = len(keys)
        for j in range(m):
            rel = l[j] - (l.sum() - l[j]) / (m - 1)
            if rel <= 0 or p[j] < 1 / m:
                continue
            for basis, out in ((U, sp), (U_rot, sp_rot)):
                t = torch.stack([(r @ basis) * (basis.T @ omega @ s) for s in keys])  # [m, k]
                c = t[j] - (t.sum(0) - t[j]) / (m - 1)
                out.append(rolls_tovee_sparsity(c).item())
    return sum(sp) / len(sp), sum(sp_rot) / len(sp_rot), len(sp)


def test_toy_callback_tracks_sparsity_and_matches_brute_force(tmp_path):
    from lit_svd.datamodules.toy import SparseFeatureDataModule
    from lit_svd.modules.toy import ToyAlignmentModule

    torch.manual_seed(0)
    model = ToyAlignmentModule(n_features=12, d_model=8, d_head=[4, 8], template={"pair": [0, 1, 1.0]}, lr=1e-2)
    dm = SparseFeatureDataModule(n_features=12, n_keys=6, p=[0.3, 0.3], batch_size=64, seed=0)
    cb = SADCallback(every_n_steps=20, n_probe=32, log_spaced=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=40,
        default_root_dir=tmp_path,
        callbacks=[cb],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    assert [h["step"] for h in cb.history] == [0, 20, 40]
    assert cb.history[-1]["name"] == ["instance0", "instance1"]
    # the last measurement, recomputed pair by pair on the same probe samples
    feats = next(iter(dm.train_dataloader()))[:, :32]
    W_Q, W_K = model.head_weights()
    got = toy_head_sparsity(model.W.detach(), W_Q, W_K, model.d_heads, feats, None, 1e-4, 0, null_draws=4)
    for i in range(2):
        sp, sp_rot, n = brute_toy_sparsity(model, feats, i)
        assert got["n_pairs"][i] == n > 0
        assert got["sparsity"][i] == pytest.approx(sp, rel=1e-4)
        assert got["sparsity_rotated"][i] == pytest.approx(sp_rot, rel=1e-4)
    # contributions of the toy head sum to its relative attention, computed here key by key
    W_Q, W_K = model.head_weights()
    x = feats[0] @ model.W[0].detach().T  # [B, 1 + m, D]
    qk = QKHeads(W_Q[0, :4].T[None], W_K[0, :4].T[None])
    U = qk.basis()
    st = sad_pairs(
        x[:, :1], x[:, 1:], torch.ones(32, 1, 6, dtype=torch.bool), qk, U, rotated_bases(U), keep_contributions=True
    )
    omega = W_Q[0, :4].T @ W_K[0, :4]
    for i in range(0, len(st), 5):
        b, j = int(st.batch[i]), int(st.src[i])
        l = torch.stack([x[b, 0] @ omega @ x[b, 1 + s] for s in range(6)])
        rel = l[j] - (l.sum() - l[j]) / 5
        assert st.contributions[i].sum().item() == pytest.approx(rel.item(), rel=1e-4, abs=1e-6)
    assert len(got["sparsity_null"]) == 2 and len(got["sparsity_null_p05"]) == 2
    assert all(p <= m for p, m in zip(got["sparsity_null_p05"], got["sparsity_null"]))
    assert got["sparser_than_null"] == [s < p for s, p in zip(got["sparsity"], got["sparsity_null_p05"])]
    res = json.loads((Path(trainer.log_dir) / "sad_results.json").read_text())
    assert res["experiment"] == "sad_training" and len(res["history"]) == 3
    assert res["null_draws"] == 16 and "mean_sparsity_null_last" in res["summary"]
    assert (Path(trainer.log_dir) / "sad_training.png").is_file()


def test_top_k_id_map_matches_counter():
    g = torch.Generator().manual_seed(0)
    batches = [
        {
            "input_ids": torch.randint(0, 50, (4, 9), generator=g) ** 2 % 97,
            "attention_mask": (torch.rand(4, 9, generator=g) > 0.2).long(),
        }
        for _ in range(3)
    ]
    counts = Counter()
    for b in batches:
        counts.update(b["input_ids"][b["attention_mask"].bool()].tolist())
    top = [i for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]]
    id_map = top_k_id_map(batches, 97, 10)
    assert [int(id_map[i]) for i in top] == list(range(10))
    assert all(int(id_map[i]) == 10 for i in range(97) if i not in top)


def test_language_model_rejects_bad_config():
    with pytest.raises(ValueError, match="^model.arch='llama' is unknown; choose one of gpt2, gpt_neox$"):
        LanguageModelModule(arch="llama")
    with pytest.raises(ValueError, match="model.d_model=30 is not divisible by model.n_heads=4"):
        LanguageModelModule(d_model=30)
    with pytest.raises(ValueError, match="model.vocab_top_k=0"):
        LanguageModelModule(vocab_top_k=0)


@pytest.mark.parametrize("arch", ["gpt2", "gpt_neox"])
def test_language_model_trains_on_text_with_callback(arch, wikitext_valid, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from lit_svd.datamodules.text import TextDataModule

    words = re.findall(r"\S+", Path(wikitext_valid).read_text(encoding="utf-8")[:200_000])
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", *sorted(set(words))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    dm = TextDataModule(tokenizer=tok, path=wikitext_valid, seq_len=16, n_tokens=4096, val_tokens=512, batch_size=16)
    model = LanguageModelModule(
        arch=arch, n_layers=2, d_model=32, n_heads=2, max_positions=16, vocab_top_k=300, lr=5e-3, warmup_steps=5
    )
    cb = SADCallback(every_n_steps=15, n_probe=8, log_spaced=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=30,
        default_root_dir=tmp_path,
        limit_val_batches=2,
        callbacks=[cb],
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    assert model.lm.config.vocab_size == 301
    assert [h["step"] for h in cb.history] == [0, 1, 2, 4, 8, 15, 16, 30]
    last = cb.history[-1]
    assert last["name"] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert all(n > 0 for n in last["n_pairs"]) and all(math.isfinite(v) for v in last["sparsity"])
    assert all(math.isfinite(v) for v in last["sparsity_null"]) and 0 <= last["fraction_sparser_than_null"] <= 1
    # the probe is the data module's 8 held-out probe windows (outside every split), in the tokenizer's ids
    probe_ids, _ = cb.probe
    assert torch.equal(probe_ids, dm.probe(8)[0])
    seen = {tuple(w.tolist()) for split in dm.splits.values() for w in split.windows}
    assert not seen & {tuple(w.tolist()) for w in probe_ids}
    res = json.loads((Path(trainer.log_dir) / "results.json").read_text())
    assert res["summary"]["last_step"] == 30
    assert trainer.callback_metrics["val/loss"] < math.log(301)  # it learned something
