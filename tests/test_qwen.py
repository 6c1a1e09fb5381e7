"""Qwen2 / Qwen2.5 (biased q / k / v projections) and Qwen3 (per-head q / k RMSNorms) against the HF forward.

* Views exact in float64 (every architecture, not only Qwen): the view's scores, per-head outputs, attention
  and MLP outputs and logits equal the HF forward's own to <= 1e-10 relative, with HF's float32 upcasts (norm
  statistics, rotary tables) kept in float64 (``float64_throughout``: the same HF code, no float32
  rounding). Without it, HF's float32 steps alone put the two ~1e-9 (norms) to ~1e-7 (head norms) apart.
* The bias rows of the augmented QK matrix of tiny Qwen2 against a dense computation from the module's own
  biases and HF's ``apply_rotary_pos_emb``: the bias is added before RoPE, so ``qk(delta)[0, 0]`` is
  ``s (b_Q R_i) . (b_K R_j)`` (``s b_Q . b_K`` at ``delta = 0``), and the four blocks of ``[1, x_i] M [1, x_j]^T``
  add up to the model's score at every causal pair.
* Every method's Lightning module runs on tiny Qwen2 and Qwen3 saved to disk (SAD, masks, mounts, causal checks).
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from test_views import assert_close, check_layer_exact, run_captured
from torch.overrides import TorchFunctionMode

from lit_svd.models import view as make_view
from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES, tiny_causal_lm

ALL = ARCHITECTURES + HEAD_NORM_ARCHITECTURES
EXACT = 1e-10
_SOFTMAX = torch.nn.functional.softmax  # the real one: a spy that records scores (test_views.capture) stands in later


class _Float64Throughout(TorchFunctionMode):
    """Turns every float64 -> float32 cast (``.float()``, ``.to(torch.float32)``) into a no-op: HF's own forward,
    with the precision its float32 upcasts of norm statistics and rotary tables would lose kept. (Its softmax
    stays float32: the checks use HF's own attention weights, so their rounding is on both sides.)"""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if func is torch.nn.functional.softmax and func is not _SOFTMAX:  # the spy recorded the call already
            return _SOFTMAX(*args, **kwargs)
        if isinstance(first, torch.Tensor) and first.dtype == torch.float64:
            if name == "float":
                return first
            if name == "to":
                args = tuple(torch.float64 if a is torch.float32 else a for a in args)
                if kwargs.get("dtype") is torch.float32:
                    kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


@contextmanager
def float64_throughout():
    with _Float64Throughout():
        yield


def _ids(vocab: int, T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (1, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fold_norms", [True, False])
@pytest.mark.parametrize("arch", ALL)
def test_views_exact_to_the_hf_forward_in_float64(arch, fold_norms):
    v = make_view(tiny_causal_lm(arch, seed=1).double(), fold_norms=fold_norms)
    ids = _ids(v.vocab_size)
    with float64_throughout():
        rec = run_captured(v, ids)
        assert rec["logits"].dtype == torch.float64
        for layer in range(v.n_layers):
            check_layer_exact(v, rec, layer, tol=EXACT)
        if fold_norms:
            W_U, b_U = v.unembed()
            pre_cap = v.normalized("final", None, rec["final_in"]) @ W_U + b_U
            logits = v.final_softcap * torch.tanh(pre_cap / v.final_softcap) if v.final_softcap else pre_cap
            assert_close(logits, rec["logits"], f"{arch} logits", EXACT)


def test_float32_steps_inside_hf_are_what_the_exact_mode_removes():
    """The control: the same float64 check against HF's unmodified forward fails at 1e-10 (its head norms
    run in float32) and passes at 1e-6."""
    v = make_view(tiny_causal_lm("qwen3", seed=1).double())
    rec = run_captured(v, _ids(v.vocab_size))
    with pytest.raises(AssertionError, match="scores"):
        check_layer_exact(v, rec, 0, tol=EXACT)
    check_layer_exact(v, rec, 0, tol=1e-6)


# --- Qwen2: the bias rows of the rotary QK -----------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen2():
    return tiny_causal_lm("qwen2", seed=3).double()


def _rope(model, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """HF's own rotation of ``x: [heads, d_head]`` at each position -> ``[heads, len(positions), d_head]``."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    rows = x[:, None, :].expand(-1, len(positions), -1)[None]  # [1, heads, P, d_head]
    cos, sin = model.model.rotary_emb(rows, torch.tensor([positions]))
    return apply_rotary_pos_emb(rows, rows, cos, sin)[0][0]


@torch.no_grad()
def test_qwen2_bias_rows_are_the_rotated_biases(qwen2):
    v = make_view(qwen2)
    at = qwen2.model.layers[1].self_attn
    h, kv, dh = v.n_heads, v.n_kv_heads, v.d_head
    b_Q = at.q_proj.bias.reshape(h, dh)
    b_K = at.k_proj.bias.reshape(kv, dh).repeat_interleave(h // kv, 0)
    assert b_Q.abs().max() > 0.3 and b_K.abs().max() > 0.3  # the tiny model's biases weigh
    torch.testing.assert_close(v.q_map(1)[:, 0], b_Q, rtol=0, atol=0)  # RMSNorm has no bias: row 0 is b_Q as is
    torch.testing.assert_close(v.k_map(1)[:, 0], b_K, rtol=0, atol=0)
    s = at.scaling
    with float64_throughout():
        torch.testing.assert_close(v.qk(1, 0).dense()[:, 0, 0], s * (b_Q * b_K).sum(-1), rtol=1e-13, atol=1e-13)
        W_K = at.k_proj.weight.reshape(kv, dh, v.d_model).repeat_interleave(h // kv, 0)  # [h, d_head, d_model]
        g = qwen2.model.layers[1].input_layernorm.weight
        for delta in (-1, -4, -9):
            i, j = -delta, 0  # qk(delta) is built at query position max(0, -delta)
            M = v.qk(1, delta).dense()  # [h, d+1, d+1]
            q_i, k_j = _rope(qwen2, b_Q, [i])[:, 0], _rope(qwen2, b_K, [j])[:, 0]
            torch.testing.assert_close(M[:, 0, 0], s * (q_i * k_j).sum(-1), rtol=1e-12, atol=1e-12)
            # row 0 beyond [0, 0]: the rotated query bias against each (gain-folded) key feature, rotated at j
            keys = torch.stack([_rope(qwen2, W_K[:, :, c], [j])[:, 0] for c in range(v.d_model)], -1)  # [h, dh, d]
            want_row = s * torch.einsum("he,hed->hd", q_i, keys) * g
            torch.testing.assert_close(M[:, 0, 1:], want_row, rtol=1e-12, atol=1e-12)
        # the bias-bias term depends on the offset (RoPE rotates the bias rows like the token rows)
        assert (v.qk(1, -1).dense()[:, 0, 0] - v.qk(1, -9).dense()[:, 0, 0]).abs().max() > 1e-2


@torch.no_grad()
def test_qwen2_scores_are_the_sum_of_the_four_bias_blocks(qwen2):
    """``[1, x_i] M [1, x_j]^T`` split into bias-bias, bias-key, query-bias and token-token blocks: their sum is
    HF's own score on every visible pair of both layers (the sliding layer too) to 1e-10, and the bias blocks
    matter (dropping them moves the scores)."""
    v = make_view(qwen2)
    ids = _ids(v.vocab_size, T=10, seed=2)
    with float64_throughout():
        rec = run_captured(v, ids)
        for layer in range(v.n_layers):
            x = v.normalized("attn", layer, rec[("attn_in", layer)][0])
            ref = rec["softmax_in"][layer][0]  # [h, T, T]
            got = torch.zeros_like(ref)
            no_bias = torch.zeros_like(ref)
            for i in range(x.shape[0]):
                for j in v.visible_keys(layer, i):
                    M = v.qk(layer, j - i).dense()  # [h, d+1, d+1]
                    blocks = (
                        M[:, 0, 0],
                        M[:, 0, 1:] @ x[j],
                        M[:, 1:, 0] @ x[i],
                        torch.einsum("d,hde,e->h", x[i], M[:, 1:, 1:], x[j]),
                    )
                    got[:, i, j] = sum(blocks)
                    no_bias[:, i, j] = blocks[3]
            T = x.shape[0]
            seen = torch.zeros(T, T, dtype=torch.bool)
            for i in range(T):
                seen[i, list(v.visible_keys(layer, i))] = True
            assert_close(got[:, seen], ref[:, seen], f"qwen2 L{layer} four blocks", EXACT)
            assert (no_bias[:, seen] - ref[:, seen]).abs().max() > 1e-2
    assert v.window(1) == 4 and v.window(0) is None


# --- every method's module on tiny Qwen2 / Qwen3 saved to disk --------------------------------------------
QWEN = ("qwen2", "qwen3")  # masks: tests/test_masks.py, mounts: tests/test_mounts_module.py run them too


@pytest.mark.parametrize("arch", QWEN)
def test_sad_module_runs(arch, tiny_dirs, tokenizer):
    """The SAD module runs over two prompts, every head with pairs, its null and controls (the exactness of the
    decomposition it sums is checked against HF in tests/test_sad_models.py, Qwen2, and tests/test_gemma3.py, Qwen3)."""
    from lit_svd.modules.sad import SADAnalysisModule

    module = SADAnalysisModule(model=tiny_dirs[arch], null_draws=2, null_stride=1, min_pairs=1)
    module.on_test_start()
    enc = tokenizer(["When Mary and John went to the store, John gave", "Then Anna and Tom went"], padding=True)
    with torch.no_grad():
        module.analyse_batch(torch.tensor(enc["input_ids"]), torch.tensor(enc["attention_mask"]), torch.tensor([0, 1]))
    res = module.results()
    summary = res["summary"]
    assert res["model_type"] == arch and res["n_prompts"] == 2 and summary["n_heads_eligible"] == 8
    assert summary["n_pairs"] == sum(h["n_pairs"] for h in res["heads"]) > 0
    assert all(0 <= h["sparsity"] <= 1 and 0 <= h["sparsity_null"] <= 1 for h in res["heads"])


@pytest.mark.parametrize("arch", QWEN)
def test_direction_check_runs(arch, tiny_dirs, tmp_path):
    """The causal check of kept OV / MLP directions (the directions config) on a mask run of the model."""
    from test_direction_report import _mask_run, _test

    run = _mask_run(tmp_path / "run", tiny_dirs[arch], {"L0.ov": [(0, 0), (2, 1)], "L1.mlp_out": [(0, 2)]}, arch=arch)
    res = _test("smollm2_ioi_directions.yaml", run, tiny_dirs[arch], tmp_path / "out")
    assert {(r["component"], r["head"], r["direction"]) for r in res["directions"]} == {
        ("L0.ov", 0, 0),
        ("L0.ov", 2, 1),
    }
    assert all(r["z"] == r["z"] for r in res["directions"])  # finite, not NaN
