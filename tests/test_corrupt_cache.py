"""A corrupt or partial cached model (a truncated ``model.safetensors`` under ``$LIT_SVD_CACHE``) is detected,
named with its path, and rebuilt from the GGUF file; the rebuilt weights are the original ones.

The GGUF conversion is replaced by a tiny random model (what transformers would dequantise), so the test runs
in seconds; the cache entry is written where and how ``load_causal_lm`` writes it.
"""

from __future__ import annotations

import logging

import pytest
import torch

from lit_svd.models import loading
from lit_svd.models.tiny import tiny_causal_lm


@pytest.fixture
def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    raw = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="!", eos_token="!")


@pytest.fixture
def converted(tmp_path, monkeypatch, tiny_tokenizer):
    """(gguf path, the model its conversion gives, a list of conversions made) with ``LIT_SVD_CACHE=tmp``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("LIT_SVD_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    model = tiny_causal_lm("llama", seed=0).float()
    conversions = []
    real_model, real_tokenizer = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def model_from(path, *args, gguf_file=None, **kwargs):
        if gguf_file is None:
            return real_model(path, *args, **kwargs)
        conversions.append(gguf_file)
        return tiny_causal_lm("llama", seed=0).float()

    def tokenizer_from(path, *args, gguf_file=None, **kwargs):
        return tiny_tokenizer if gguf_file is not None else real_tokenizer(path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", model_from)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", tokenizer_from)
    loading.load_causal_lm(str(gguf))
    assert conversions == ["tiny.gguf"]
    return gguf, model, conversions


def truncate(path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


@pytest.mark.parametrize("keep", [4, 100, -1000])
def test_a_truncated_cache_is_named_and_rebuilt(converted, caplog, keep):
    gguf, original, conversions = converted
    weights = loading._gguf_cache_dir(gguf) / "model.safetensors"
    size = weights.stat().st_size
    truncate(weights, keep if keep > 0 else size + keep)
    from safetensors import safe_open

    with pytest.raises(Exception):  # noqa: B017  (the control: safetensors itself cannot read the file)
        with safe_open(str(weights), "pt") as f:
            [f.get_tensor(k) for k in f.keys()]
    assert loading.safetensors_problem(weights) is not None
    with caplog.at_level(logging.WARNING, logger=loading.__name__):
        model, _ = loading.load_causal_lm(str(gguf))
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and str(weights) in warning[0] and "rebuilding" in warning[0], warning
    assert conversions == ["tiny.gguf", "tiny.gguf"] and weights.stat().st_size == size
    expected = original.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    loading.load_causal_lm(str(gguf))  # the rebuilt cache is read again, not converted a third time
    assert len(conversions) == 2


def test_a_whole_cache_is_not_flagged(converted):
    gguf, _, _ = converted
    assert loading.safetensors_problem(loading._gguf_cache_dir(gguf) / "model.safetensors") is None


def test_a_damaged_config_names_the_folder_and_the_fix(converted):
    gguf, _, _ = converted
    cached = loading._gguf_cache_dir(gguf)
    (cached / "config.json").write_text("{ not json")
    with pytest.raises(loading.ModelUnavailableError) as err:
        loading.load_causal_lm(str(gguf))
    lines = str(err.value).splitlines()
    assert (
        len(lines) == 2
        and str(cached) in lines[0]
        and lines[1] == f"hint: delete {cached} and run again; it is rebuilt from the GGUF file"
    )
