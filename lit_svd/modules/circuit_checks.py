"""The circuit graph's options checked against the model and the task **before the model loads** (issue 24):
the CLI calls a module class's ``check_config(model_args, data_args)`` before it builds anything
(``cli_lightning.check_module_config``); ``CircuitGraphModule.check_config`` is ``check_circuit_config``.

What needs the model is read without its weights: the number of layers from its config
(``models.loading.load_config``), the tokenizer (``load_tokenizer``). Each failure is one line naming the key,
the value and what is allowed.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from lit_svd.analysis.graph_options import check_circuit_options

# the module's options (the check's parameters but the model's n_layers and parts)
OPTIONS = tuple(p for p in inspect.signature(check_circuit_options).parameters if p not in ("n_layers", "parts"))


def model_parts(config) -> set[str]:
    """What a model has that a reader may need: ``attention`` (query heads in its config)."""
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    return {"attention"} if heads else set()


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
    given = {k: model_args[k] for k in OPTIONS if k in model_args}
    check_circuit_options(**given, n_layers=n_layers_of(config), parts=model_parts(config))
    check_tokenizer(model, data_args, load_tokenizer(model, **where))
