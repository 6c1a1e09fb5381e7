"""``arch:NAME`` models: the exact architecture of the models researchers study, random weights.

The configs are checked against an independent fact: each named model's published parameter count (as the
hub's safetensors metadata and the model cards state it), counted on an empty (``meta``) model, so no weight
is allocated. A wrong width, head count, MLP size, vocabulary or tying changes the count.
"""

from __future__ import annotations

import pytest
import torch

from lit_svd.models.architectures import ARCHITECTURES, arch_config, parse_arch
from lit_svd.models.loading import load_causal_lm

PUBLISHED_PARAMETERS = {
    "gpt2": 124_439_808,
    "pythia-160m": 162_322_944,
    "qwen2.5-0.5b": 494_032_768,
    "gemma-2-2b": 2_614_341_888,
    "llama-3.1-8b": 8_030_261_248,
}


def _empty(name: str):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(arch_config(name))


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_parameter_count_is_the_published_one(arch):
    model = _empty(f"arch:{arch}")
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMETERS[arch]


def test_n_layers_keeps_every_other_size():
    full, two = arch_config("arch:gemma-2-2b"), arch_config("arch:gemma-2-2b?n_layers=2")
    assert (full.num_hidden_layers, two.num_hidden_layers) == (26, 2)
    assert two.layer_types == full.layer_types[:2] == ["sliding_attention", "full_attention"]
    for key in ("hidden_size", "intermediate_size", "num_key_value_heads", "head_dim", "vocab_size"):
        assert getattr(two, key) == getattr(full, key)
    assert (two.attn_logit_softcapping, two.final_logit_softcapping) == (50.0, 30.0)
    llama = arch_config("arch:llama-3.1-8b?n_layers=3")
    assert llama.num_hidden_layers == 3 and llama.rope_parameters["rope_type"] == "llama3"
    assert arch_config("arch:gpt2?n_layers=1").n_layer == 1


@pytest.mark.parametrize(
    "name,match",
    [
        ("arch:gpt3", r"unknown architecture 'gpt3'; allowed: gpt2, pythia-160m"),
        ("arch:gpt2?layers=2", r"unknown option 'layers'; allowed: n_layers"),
        ("arch:gpt2?n_layers=13", r"n_layers='13' must be an integer in 1..12"),
        ("arch:gpt2?n_layers=x", r"n_layers='x' must be an integer in 1..12"),
    ],
)
def test_bad_names_fail_in_one_line(name, match):
    with pytest.raises(ValueError, match=match):
        parse_arch(name)


def test_loaded_arch_model_runs_in_its_dtype_with_smollm2_token_ids(tokenizer):
    from lit_svd.models import view as make_view

    model, tok = load_causal_lm("arch:pythia-160m?n_layers=1", dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and len(tok) <= model.config.vocab_size
    v = make_view(model)
    assert (v.n_layers, v.d_model, v.n_heads, v.d_mlp, v.rotary_dim) == (1, 768, 12, 3072, 16)
    ids = tok(["When Mary and John went to the store, John gave a drink to"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 50304) and torch.isfinite(logits).all()
    again, _ = load_causal_lm("arch:pythia-160m?n_layers=1", dtype="bfloat16")
    assert torch.equal(next(again.parameters()), next(model.parameters()))  # seeded: the same weights each time
    with pytest.raises(ValueError, match="device_map with model='arch:gpt2'"):
        load_causal_lm("arch:gpt2", device_map={"": "cpu"})
