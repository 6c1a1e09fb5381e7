"""The models researchers study, as random-weight models of their exact architecture (``arch:NAME``).

Each entry is a Hugging Face config dict written from the model's published architecture facts (its
``config.json`` on the hub and its paper): layers, widths, heads and key/value heads, head size, MLP width,
vocabulary, norm and its eps, rotary base and scaling, soft-caps, sliding windows, tied embeddings. No weight is
read: ``build_arch_model("arch:gemma-2-2b?n_layers=2")`` initialises the model with the library's own init
(seed fixed), so that a method's time and memory are measured at the real dimensions without the weights.

Name scheme: ``arch:NAME`` with an optional ``?n_layers=N`` that keeps the first N layers (every other size
unchanged; per-layer lists such as Gemma-2's alternating ``layer_types`` are cut to N), e.g.
``arch:llama-3.1-8b?n_layers=2``; the same string works as ``model.model`` in a config and on the command line.

The tokenizer of every ``arch:`` model is SmolLM2-135M's (offline, vocabulary 49,152): every one of its ids is
a valid id of each architecture here (the smallest vocabulary is GPT-2's 50,257), so prompts run unchanged;
the token *meanings* are not the named model's, which does not matter for cost.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import torch

PREFIX = "arch:"
TOKENIZER = "smollm2-135m"

ARCHITECTURES: dict[str, dict] = {
    # GPT-2 small (124M): Radford et al. 2019, openai-community/gpt2 config.json
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_inner": None,  # 4 * 768 = 3072
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": True,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    },
    # Pythia-160M: Biderman et al. 2023, EleutherAI/pythia-160m config.json (GPT-NeoX, parallel residual)
    "pythia-160m": {
        "model_type": "gpt_neox",
        "vocab_size": 50304,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_act": "gelu",
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000,
        "max_position_embeddings": 2048,
        "layer_norm_eps": 1e-5,
        "use_parallel_residual": True,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    # Qwen2.5-0.5B: Qwen/Qwen2.5-0.5B config.json (biases on q, k, v; GQA 14 / 2; tied embeddings)
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    # Gemma-2-2B: Gemma Team 2024 (Gemma 2 report, table 1), google/gemma-2-2b config.json
    "gemma-2-2b": {
        "model_type": "gemma2",
        "vocab_size": 256000,
        "hidden_size": 2304,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "intermediate_size": 9216,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    },
    # Llama-3.1-8B: Llama Team 2024 (The Llama 3 Herd of Models, table 3), meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
}

LAYER_KEYS = ("num_hidden_layers", "n_layer")


def is_arch(name: str) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def parse_arch(name: str) -> tuple[str, int | None]:
    """``"arch:NAME?n_layers=N"`` -> ``(NAME, N or None)``; a bad name or option fails naming what is allowed."""
    body = name[len(PREFIX) :]
    arch, _, query = body.partition("?")
    if arch not in ARCHITECTURES:
        raise ValueError(f"model={name!r}: unknown architecture {arch!r}; allowed: {', '.join(ARCHITECTURES)}")
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False)) if query else {}
    unknown = set(options) - {"n_layers"}
    if unknown:
        raise ValueError(f"model={name!r}: unknown option {sorted(unknown)[0]!r}; allowed: n_layers")
    n_layers = None
    if "n_layers" in options:
        full = arch_config_dict(arch)
        top = next(full[k] for k in LAYER_KEYS if k in full)
        try:
            n_layers = int(options["n_layers"])
        except ValueError:
            n_layers = 0
        if not 1 <= n_layers <= top:
            raise ValueError(f"model={name!r}: n_layers={options['n_layers']!r} must be an integer in 1..{top}")
    return arch, n_layers


def arch_config_dict(arch: str, n_layers: int | None = None) -> dict:
    """The HF config dict of ``arch`` (a copy), with the first ``n_layers`` layers when given."""
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in ARCHITECTURES[arch].items()}
    if n_layers is not None:
        for key in LAYER_KEYS:
            if key in cfg:
                cfg[key] = n_layers
    return cfg


def arch_config(name: str) -> Any:  # a transformers PretrainedConfig
    """The transformers config object of an ``arch:`` name."""
    from transformers import AutoConfig

    arch, n_layers = parse_arch(name)
    cfg = arch_config_dict(arch, n_layers)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    if getattr(config, "layer_types", None) is not None and len(config.layer_types) != config.num_hidden_layers:
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    return config


def build_arch_model(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:  # PreTrainedModel
    """A random-weight model of ``name``'s exact architecture in ``dtype`` (eval mode; the default attention
    implementation, as ``load_causal_lm`` loads real models), initialised under ``seed``."""
    from transformers import AutoModelForCausalLM

    config = arch_config(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
