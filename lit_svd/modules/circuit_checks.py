"""The circuit graph's options checked against the model and the task **before the model loads** (issue 24):
the CLI calls a module class's ``check_config(model_args, data_args)`` before it builds anything
(``cli_lightning.check_module_config``); ``CircuitGraphModule.check_config`` is ``check_circuit_config``.

What needs the model is read without its weights: the number of layers from its config
(``models.loading.load_config``), the tokenizer (``load_tokenizer``). Each failure is one line naming the key,
the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# The reader kinds the builder traces (analysis/circuit_graph.py: TRACEABLE) and what each needs of the model: every
# supported architecture has attention heads, so both are there; an MLP reader is not offered (an MLP output
# direction is not a linear function of its input directions: its split would not be exact).
READERS: dict[str, str] = {"qk": "attention", "ov": "attention"}
UNITS = ("direction", "block", "head")
DEFAULTS = {"threshold": 0.05, "depth": 2, "readers": tuple(READERS), "unit": "direction"}  # the builder's


def model_parts(config) -> set[str]:
    """What a model has that a reader may need: ``attention`` (query heads in its config)."""
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    return {"attention"} if heads else set()


def check_options(threshold: float, depth: int, readers: Sequence[str], unit: str, n_layers: int, parts: set) -> None:
    """threshold in (0, 1); depth an integer in 1 .. n_layers; readers known and present in the model; a known
    unit."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ValueError(
            f"threshold={threshold!r}: must lie in (0, 1) (a share of the sum of absolute contributions per reader)"
        )
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= n_layers:
        raise ValueError(f"depth={depth!r}: must be an integer in 1 .. {n_layers} (the model's layers)")
    readers = [readers] if isinstance(readers, str) else list(readers)
    if not readers:
        raise ValueError(f"readers=[]: give at least one of {', '.join(READERS)}")
    for r in readers:
        if r not in READERS:
            why = " (an MLP's split into its input directions would not be exact)" if r.startswith("mlp") else ""
            raise ValueError(f"readers: {r!r} is not a reader kind{why}; allowed: {', '.join(READERS)}")
        if READERS[r] not in parts:
            raise ValueError(f"readers: {r!r} needs {READERS[r]} heads, which this model lacks")
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} unknown; allowed: {', '.join(UNITS)}")


def check_tokenizer(model: str, data_args: Mapping, model_tokenizer) -> None:
    """The prompts must be tokenized by the model's own tokenizer (the answers' ids index its logits), and the
    task's answers must be single tokens in it (``datamodules.tasks.make_task`` raises otherwise)."""
    from lit_svd.datamodules.tasks import make_task, resolve_tokenizer

    name = data_args.get("tokenizer")
    if isinstance(name, str) and name != model:
        data_tok = resolve_tokenizer(name)
        if data_tok.get_vocab() != model_tokenizer.get_vocab():
            raise ValueError(
                f"data.init_args.tokenizer={name!r} is not the tokenizer of model={model!r} (other vocabulary):"
                f" the answers' token ids would not index its logits; give --data.init_args.tokenizer {model}"
            )
    if data_args.get("task") is not None:
        make_task(data_args["task"], model_tokenizer)


def check_circuit_config(model_args: Mapping, data_args: Mapping) -> None:
    """Every check of this module docstring, on the CLI's ``model.init_args`` and ``data.init_args``."""
    from lit_svd.models.loading import load_config, load_tokenizer, n_layers_of

    model = model_args.get("model")
    if not isinstance(model, str):
        return
    where = {k: model_args.get(k) for k in ("gguf_file", "revision")}
    config = load_config(model, **where)
    given = {k: model_args[k] for k in ("threshold", "depth", "readers", "unit") if k in model_args}
    check_options(**{**DEFAULTS, **given}, n_layers=n_layers_of(config), parts=model_parts(config))
    check_tokenizer(model, data_args, load_tokenizer(model, **where))
