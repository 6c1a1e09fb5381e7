"""The Python API: load a model once, run every method on it, get typed results back, through the CLI's own code.

    import lit_svd as ls
    m = ls.model("smollm2-135m")                 # loaded once: the model, its view, its cache of SVDs
    sad = m.sad(task="ioi", n_test=32)          # a SADResult, shown as HTML in Jupyter
    masks = m.masks(task="ioi", max_steps=64, out="runs/ioi")
    check = m.directions(masks)                 # the direction check of that mask run
    graph = m.circuits(task="ioi")              # a circuit graph (also m.circuit)
    curves = m.faithfulness(task="ioi", mask_run=masks, methods=["eap_heads", "mask", "random"])
    ls.sad("gemma3-270m", task="ioi")            # one call: the model loaded for it
    ls.run("configs/toy/single_pair.yaml", max_steps=100)    # any config file, any key overridden
    ls.load("runs/ioi/lightning_logs/version_0")  # a finished run's result
    ls.report("smollm2-135m", out="report", quick=True); ls.tool("mask-curve", "runs/a", "runs/b", out="curve")

``ls.model(name, dtype=..., device_map=..., ...)`` takes the seven loading options (``models.loaded.ModelOptions``),
or a Hugging Face model already loaded (or a view of one) with its tokenizer. ``m.<method>(...)`` and
``ls.<method>(model, ...)`` exist for every method of the registry (``lit_svd.registry.METHODS``): each builds the
arguments of ``python -m lit_svd <fit|test> --config <configs/<method>/...yaml> ...`` (``lit_svd.commands``; the
keyword scheme is there and in docs/api.md) and runs the CLI's own class on them in this process
(``cli_lightning.run_cli``: the same parser, checks, module, data module, report callback and Trainer), with the
model object in use (``models.loaded.using``: the module takes it instead of loading the name), then reads the
run's results.json back. So the API and the CLI write the same results.json (tests/test_api.py compares them).

Model names: the configs' (``smollm2-135m``, ``gemma3-270m``, a hub name, a folder), and ``tiny-<arch>``
(``tiny-llama``, ``tiny-gpt2``, ``tiny-gpt_neox``, ``tiny-gemma2``, ``tiny-gemma3``, ...): a tiny random model
(``lit_svd.models.loading.local_name``).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from lit_svd.commands import cli_args, method_args
from lit_svd.registry import METHODS, Method, method_named


# --- the model object ------------------------------------------------------------------------------------------
class Model:
    """A model loaded once (``ls.model``) that every method runs on: ``m.sad(task=...)``, ``m.masks(...)``,
    ``m.directions(run)``, ``m.mounts(...)``, ``m.circuits(...)``, ``m.faithfulness(...)`` (every method of
    ``lit_svd.registry.METHODS``), each writing the results.json the command line writes with the same settings.
    ``loaded`` is the model object itself (``lit_svd.models.loaded.LoadedModel``: ``lm``, ``tokenizer``,
    ``options``, ``view()``, ``svds``), whose attributes ``m`` also answers."""

    def __init__(self, loaded: Any):
        self.loaded = loaded

    def method(self, name: str, *args: Any, **keys: Any):
        """Run method ``name`` on this model (``ls.method(name, self, ...)``)."""
        return method(name, self, *args, **keys)

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "loaded":
            raise AttributeError(name)
        try:
            spec = method_named(name)
        except ValueError:
            return getattr(self.loaded, name)
        return functools.partial(self.method, spec.name)

    def __dir__(self) -> list[str]:
        return sorted({"loaded", "method", *METHODS, *(a for a in dir(self.loaded) if not a.startswith("_"))})

    def __repr__(self) -> str:
        return repr(self.loaded).replace(type(self.loaded).__name__, type(self).__name__, 1)


def model(
    model: str | Any = "smollm2-135m",
    tokenizer: Any = None,
    *,
    name: str | None = None,
    gguf_file: str | None = None,
    revision: str | None = None,
    dtype: str = "float32",
    device_map: str | dict | None = None,
    offload_folder: str | None = None,
    fold_norms: bool = True,
) -> Model:
    """Load ``model`` once (a name, folder or GGUF file, with the loading options of every pretrained-model module:
    ``models.loaded.ModelOptions``), or wrap a Hugging Face causal LM already loaded (or a lit_svd view of one) with
    its ``tokenizer`` (``name``: what the runs' configs call it; default its ``name_or_path``)."""
    from lit_svd.models.loaded import LoadedModel, ModelOptions, load_model

    if isinstance(model, str):
        options = ModelOptions(model, gguf_file, revision, dtype, device_map, offload_folder, fold_norms)
        return Model(load_model(options))
    return Model(LoadedModel.of(model, tokenizer, name))


# --- methods ------------------------------------------------------------------------------------------------------
def method(name: str, model: str | Model | Any = None, *args: Any, **keys: Any):
    """Run method ``name`` (``lit_svd.registry.METHODS``) on ``model`` (a name, or a model object: its options and the
    object itself are used) with ``keys`` overridden. Positional after the model: the task, or for a method that
    reads a finished run (the direction check), that run."""
    spec = method_named(name)
    task = None
    if args:
        if len(args) > 1:
            raise TypeError(f"{spec.name}: give at most one positional argument after the model")
        keys[spec.reads or "task"] = args[0]
    if spec.reads is None:
        task = keys.pop("task", None)
    from lit_svd.cli_lightning import run_cli

    loaded = model.loaded if isinstance(model, Model) else model
    if loaded is not None and not isinstance(loaded, str):  # a model object: its name and options, and itself
        from lit_svd.models.loaded import using

        changed = {k: v for k, v in loaded.options.changed().items() if k != "model"}
        keys = {**{f"model.init_args.{k}": v for k, v in changed.items()}, **keys}
        with using(loaded):
            return load(run_cli(method_args(spec.name, loaded.name, task, keys)))
    if model is None and spec.reads is None:
        raise TypeError(f"{spec.name}: give the model (a name or a model object)")
    return load(run_cli(method_args(spec.name, model, task, keys)))


def _method_function(spec: Method):
    """``ls.<method>``: ``method(spec.name, ...)`` with the method's own name and summary."""
    about = spec.summary[0].upper() + spec.summary[1:]
    if spec.reads is not None:

        def call(run: Any, **keys: Any):
            return method(spec.name, None, run, **keys)

        call.__doc__ = f"{about}. ``{spec.reads}``: a finished run's folder, or the result it returned."
    else:

        def call(model: str | Model, task: str | None = spec.task, **keys: Any):
            return method(spec.name, model, task, **keys)

        call.__doc__ = f"{about}; ``model``: a name or a model object (``ls.model``)."
    call.__name__ = call.__qualname__ = spec.name
    return call


def run(config: str | os.PathLike, subcommand: str | None = None, **keys: Any):
    """Run a config file (``python -m lit_svd <subcommand> --config FILE``; subcommand: fit when the config
    trains, else test) with ``keys`` overridden; returns the run's result (``load``)."""
    from lit_svd.cli_lightning import run_cli

    return load(run_cli(cli_args(config, keys, subcommand)))


def load(folder: str | os.PathLike):
    """The result of a finished run (its folder, or a results.json): printed in a few lines, ``figures``,
    Jupyter display (``lit_svd.results.base.Result``)."""
    import lit_svd.figures  # noqa: F401  (registers every result type's figures: result.figures draws them)
    from lit_svd.runs import load_run

    path = Path(folder)
    return load_run(path.parent if path.is_file() else path, need=("results",)).result


# --- the report and the tools -----------------------------------------------------------------------------------
def report(model: str, out: str | os.PathLike, **options: Any) -> dict:
    """``lit-svd report MODEL --out OUT``: every method on ``model`` (``lit_svd.report.report``: steps, quick,
    threads, jobs); returns ``{step: State}``."""
    from lit_svd.report import report as run_report

    return run_report(model, out, **options)


def tool(name: str, *args: Any, **options: Any):
    """``lit-svd <tool> ARGS --option VALUE ...`` (``lit_svd.registry.TOOLS``; ``rel_gaps=[0.01, 0.05]`` is
    ``--rel-gaps 0.01 0.05``, ``out=DIR`` is ``--out DIR``); returns the tool's result."""
    from lit_svd.cli_tools import run_tool

    argv = [name, *map(str, args)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        elif value is not None and value is not False:
            argv += [flag, str(value)]
    return run_tool(argv)


def __getattr__(name: str):
    """``ls.<method>(model, task=..., **keys)`` for every method of the registry (``lit_svd.registry.METHODS``)."""
    try:
        return _method_function(method_named(name))
    except ValueError:
        raise AttributeError(f"module 'lit_svd.api' has no attribute {name!r}") from None
