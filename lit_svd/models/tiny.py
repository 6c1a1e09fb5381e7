"""Tiny random-initialised models of each supported architecture, built locally (no hub).

They cover each architecture's code path exactly (biases, rotary conventions, GQA, fused qkv,
norm conventions) at a size that runs in milliseconds on a CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lit_svd.choices import check_choice
from lit_svd.model_names import (  # noqa: F401  (the architectures, named where names are checked without torch)
    ARCHITECTURES,
    HEAD_NORM_ARCHITECTURES,
    Architecture,
    HeadNormArchitecture,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

BIAS_STD = {"qwen2": 0.5}
# what each gated (Llama-layout) family sets beyond the shared tiny shape
GATED: dict[str, dict] = {
    "llama": dict(rms_norm_eps=1e-5, tie_word_embeddings=True),
    "gemma2": dict(query_pre_attn_scalar=16, sliding_window=64),
    # layer 0 slides over 4 keys with the local rotary base, layer 1 is global
    "gemma3": dict(
        num_key_value_heads=1,
        query_pre_attn_scalar=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    # q / k / v biases; layer 1 slides over 4 keys (use_sliding_window from max_window_layers on)
    "qwen2": dict(
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=True, sliding_window=4, max_window_layers=1
    ),
    # per-head q / k RMSNorms (the weight as gain), no biases, untied unembedding
    "qwen3": dict(rms_norm_eps=1e-6, tie_word_embeddings=False),
}  # Qwen2's q / k / v biases are large in the real models: let them weigh here too


def _neox_rope(rotary_pct: float) -> dict:
    """GPT-NeoX's rotary on the first ``rotary_pct`` of each head's features (transformers 5's rope_parameters)."""
    return {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": rotary_pct}


def tiny_config(arch: str, vocab_size: int = 49152, **overrides: Any) -> PretrainedConfig:
    """A small HF config of ``arch`` (2 layers, d_model 64, 4 heads of 16). The default vocabulary
    size is SmolLM2's, so its offline tokenizer drives tiny models too."""
    from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    check_choice("arch", arch, ARCHITECTURES + HEAD_NORM_ARCHITECTURES)
    cfg: PretrainedConfig
    if arch in ("gpt2", "gpt_neox"):  # MLP of 256; token 0 as bos / eos: GPT-2's 50256 lies outside the vocabulary
        cfg = scratch_config(arch, vocab_size, 2, 64, 4, 256, 128, rotary_pct=0.25, token_id=0)
    elif arch in GATED:  # the Llama layout: 4 heads of 16, 2 KV heads, SwiGLU of 128
        shape = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
        shape |= dict(max_position_embeddings=128, num_key_value_heads=2, head_dim=16, intermediate_size=128)
        cls = {
            "llama": LlamaConfig,
            "gemma2": Gemma2Config,
            "gemma3": Gemma3TextConfig,
            "qwen2": Qwen2Config,
            "qwen3": Qwen3Config,
        }[arch]
        cfg = cls(**(shape | GATED[arch]))
    else:
        raise ValueError(
            f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES + HEAD_NORM_ARCHITECTURES)}"
        )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    cfg._attn_implementation = "eager"
    return cfg


def tiny_causal_lm(arch: str, seed: int = 0, vocab_size: int = 49152, **overrides: Any) -> PreTrainedModel:
    """A random-initialised tiny causal LM of ``arch`` in eval mode, float32.

    Norm weights and biases are randomised too (HF initialises them to 1 / 0), so that tests of
    norm folding cannot pass by accident.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab_size, **overrides), attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, BIAS_STD.get(arch, 0.05))
    return model.eval()


def scratch_config(
    arch: str,
    vocab_size: int,
    n_layers: int,
    d_model: int,
    n_heads: int,
    d_mlp: int,
    max_positions: int,
    rotary_pct: float,
    token_id: int | None = None,
) -> PretrainedConfig:
    """The HF config of a small dropout-free ``gpt2`` or ``gpt_neox`` model to train from scratch (``token_id``: its
    bos and eos token; None: none). ``tiny_config`` builds its GPT-2 and GPT-NeoX models here too."""
    from transformers import GPT2Config, GPTNeoXConfig

    cfg: PretrainedConfig
    if arch == "gpt2":
        cfg = GPT2Config(
            vocab_size=vocab_size,
            n_positions=max_positions,
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            n_inner=d_mlp,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=token_id,
            eos_token_id=token_id,
        )
    elif arch == "gpt_neox":
        cfg = GPTNeoXConfig(
            vocab_size=vocab_size,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=d_mlp,
            max_position_embeddings=max_positions,
            rope_parameters=_neox_rope(rotary_pct),
            use_parallel_residual=True,
            attention_dropout=0.0,
            hidden_dropout=0.0,
            tie_word_embeddings=False,
            attention_bias=True,
            bos_token_id=token_id,
            eos_token_id=token_id,
        )
    else:
        raise ValueError(f"arch={arch!r}: choose gpt2 or gpt_neox")
    cfg._attn_implementation = "eager"
    return cfg


def scratch_causal_lm(config: PretrainedConfig, seed: int) -> PreTrainedModel:
    """A freshly initialised model of ``config`` (``scratch_config``; HF default init, seeded without touching the
    global RNG) to train."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, attn_implementation="eager")
