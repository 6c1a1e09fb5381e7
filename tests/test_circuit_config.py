"""The circuit graph's options fail in two lines before the model loads (``modules/circuit_checks.py`` through the
CLI's ``check_config`` protocol), on a tiny model whose loader is replaced by one that fails when called."""

from __future__ import annotations

import pytest
import yaml
from test_cli_errors import in_process

from lit_svd.analysis.graph_options import check_circuit_options
from lit_svd.cli import main
from lit_svd.modules.circuit_checks import check_circuit_config
from lit_svd.modules.pretrained import PretrainedLMModule


class GuardedCircuits(PretrainedLMModule):
    """The circuit module's option surface, its pre-load check, and the loader of every real-model module."""

    check_config = staticmethod(check_circuit_config)

    def __init__(
        self,
        model: str = "smollm2-135m",
        threshold: float = 0.05,
        depth: int = 2,
        readers: list[str] = ["qk", "ov"],  # noqa: B006
        unit: str = "direction",
    ):
        super().__init__(model)


@pytest.fixture
def no_model(monkeypatch):
    import lit_svd.models.loaded as loaded

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loaded, "load_causal_lm", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def config(tmp_path, model: str, tokenizer: str, task: str = "ioi") -> str:
    cfg = {
        "trainer": {"accelerator": "cpu", "devices": 1, "logger": False, "default_root_dir": str(tmp_path)},
        "model": {"class_path": f"{__name__}.GuardedCircuits", "init_args": {"model": model}},
        "data": {
            "class_path": "lit_svd.datamodules.tasks.TaskDataModule",
            "init_args": {"task": task, "tokenizer": tokenizer, "n_train": 0, "n_val": 0, "n_test": 4, "batch_size": 4},
        },
    }
    path = tmp_path / "circuits.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.parametrize(
    "args,text",
    [
        (["--model.init_args.threshold", "1.5"], "threshold=1.5: must lie in (0, 1)"),
        (["--model.init_args.threshold", "0"], "threshold=0.0: must lie in (0, 1)"),
        (["--model.init_args.depth", "3"], "depth=3: must be an integer in 1 .. 2 (the model's layers)"),
        (["--model.init_args.depth", "0"], "depth=0: must be an integer in 1 .. 2"),
        (["--model.init_args.readers", "[mlp]"], "readers: 'mlp' is not a reader kind (an MLP's split"),
        (["--model.init_args.readers", "[ov, xyz]"], "readers: 'xyz' is not a reader kind; allowed: qk, ov"),
        (["--model.init_args.unit", "neuron"], "unit='neuron' unknown; allowed: direction, block, head"),
    ],
)
def test_bad_options_fail_in_two_lines_before_the_model_loads(capsys, no_model, tiny_dirs, tmp_path, args, text):
    cfg = config(tmp_path, tiny_dirs["llama"], tiny_dirs["llama"])
    lines = in_process(capsys, "test", "--config", cfg, *args)
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: ") and text in lines[0], lines


def test_good_options_pass_the_check_and_reach_the_model(no_model, tiny_dirs, tmp_path):
    """The same tokenizer under another name passes; then the model would load (the guard stops it)."""
    cfg = config(tmp_path, tiny_dirs["llama"], "smollm2-135m")
    with pytest.raises(Exception, match="a model was loaded"):  # (jsonargparse wraps the guard's error)
        main(["test", "--config", cfg, "--model.init_args.depth", "2", "--model.init_args.readers", "[qk]"])


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    """A byte-level tokenizer without merges: no name or pronoun is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("bytes")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    raw = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="!", eos_token="!").save_pretrained(folder)
    return folder


@pytest.fixture
def byte_level_model(byte_level, tmp_path) -> str:
    """A tiny Llama saved with the byte-level tokenizer."""
    from lit_svd.models.tiny import tiny_causal_lm

    model_dir = tmp_path / "model"
    tiny_causal_lm("llama").save_pretrained(model_dir)
    for f in byte_level.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    return str(model_dir)


def test_a_data_tokenizer_that_is_not_the_models_fails(capsys, no_model, byte_level_model, tmp_path):
    """The prompts are SmolLM2's, the model's tokenizer is another: its answer ids would index the wrong logits."""
    lines = in_process(capsys, "test", "--config", config(tmp_path, byte_level_model, "smollm2-135m"))
    assert len(lines) <= 2 and "data.init_args.tokenizer='smollm2-135m' is not the tokenizer of model=" in lines[0]


def test_answers_that_are_not_one_token_fail_before_the_model_loads(capsys, no_model, byte_level_model, tmp_path):
    lines = in_process(capsys, "test", "--config", config(tmp_path, byte_level_model, byte_level_model, task="gp"))
    assert len(lines) <= 2 and "task gp" in lines[0] and "single tokens in this tokenizer" in lines[0], lines


def test_a_reader_kind_the_model_lacks():
    with pytest.raises(ValueError, match="readers: 'qk' needs attention heads, which this model lacks"):
        check_circuit_options(0.1, 1, ["qk"], "block", n_layers=4, parts=set())
    check_circuit_options(0.1, 4, ("qk", "ov"), "head", n_layers=4, parts={"attention"})  # the bounds are inclusive
    with pytest.raises(ValueError, match="depth=True"):
        check_circuit_options(0.1, True, ["qk"], "block", n_layers=4, parts={"attention"})
