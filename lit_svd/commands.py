"""A method call as the command line that runs it, without importing torch: what the Python API and the report run.

``method_args("sad", "smollm2-135m", "ioi", {"n_test": 32})`` is ``["test", "--config", ".../configs/sad/
smollm2_ioi.yaml", "--model.init_args.model=smollm2-135m", ...]``, the arguments of ``python -m lit_svd``; the
API runs them in-process (``cli_lightning.run_cli``), so the API and the CLI write the same results.json.

Keywords (one scheme, docs/api.md):
* ``name=value``: a module, data-module or Trainer argument, found by name in the config's classes (their
  signatures read from source, ``config_check.class_signature``): ``lr=1e-3`` -> ``--model.init_args.lr``,
  ``n_test=16`` -> ``--data.init_args.n_test``, ``max_steps=8`` -> ``--trainer.max_steps``; a name two of them
  take (``seed``) must be qualified; or the config's last callback (its report callback);
* ``group__name=value``: qualified (``data__seed=1``, ``trainer__max_time=...``, ``callback__name``: the last
  callback's);
* ``**{"dotted.key": value}``: passed as ``--dotted.key`` verbatim;
* ``out=DIR``: ``--trainer.default_root_dir``; ``seed_everything``, ``threads``, ``ckpt_path`` as the CLI's.

A value that is a finished run (a result with a ``folder``) is given as its folder.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from pathlib import Path
from typing import Any

from lit_svd import CONFIGS
from lit_svd.config_check import class_signature
from lit_svd.registry import Method, method_named

GENERIC = "smollm2"  # the configs used, with the model overridden, for a model without its own
PREFIXES = {"smollm2-135m": "smollm2", "gemma3-270m": "gemma3_270m", "gpt2": "gpt2"}
TOP_LEVEL = ("seed_everything", "threads", "ckpt_path")


# --- configs ---------------------------------------------------------------------------------------------------
def config_prefix(model: str) -> str:
    """The config prefix of a model (``smollm2-135m`` -> ``smollm2``); others use the generic configs."""
    return PREFIXES.get(model, GENERIC)


def config_for(method: str | Method, model: str, task: str | None = None) -> tuple[Path, dict[str, Any]]:
    """``(config file, overrides)`` of ``method`` on ``model``: the model's own config for the task if there is
    one, else the generic (SmolLM2) one, else the method's IOI config with the task overridden."""
    spec = method if isinstance(method, Method) else method_named(method)
    task = task or spec.task
    if spec.task is None and task is not None:
        raise ValueError(f"task={task!r}: {spec.name} takes no task")
    folder = CONFIGS / spec.folder
    for prefix in dict.fromkeys((config_prefix(model), GENERIC)):
        for t in dict.fromkeys((task, spec.task)):
            path = folder / spec.pattern.format(prefix=prefix, task=t)
            if path.is_file():
                return path, ({"data.init_args.task": task} if t != task else {})
    have = ", ".join(p.name for p in sorted(folder.glob("*.yaml"))) or "none"
    raise FileNotFoundError(
        f"{folder / spec.pattern.format(prefix=config_prefix(model), task=task)}: no config for {spec.name} on"
        f" {model!r} (configs there: {have})"
    )


def read_config(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise FileNotFoundError(f"config={str(path)!r}: no such file")
    return yaml.safe_load(path.read_text()) or {}


def config_path(config: str | os.PathLike) -> Path:
    """A config file as given, or relative to the checkout (``configs/sad/smollm2_ioi.yaml``)."""
    path = Path(config)
    return CONFIGS.parent / path if not path.is_file() and (CONFIGS.parent / path).is_file() else path


def subcommand_of(config: dict) -> str:
    """``fit`` for a config that trains (its trainer has max_steps / max_epochs), else ``test``."""
    trainer = config.get("trainer") or {}
    return "fit" if any(k in trainer for k in ("max_steps", "max_epochs")) else "test"


# --- keywords -> command-line arguments --------------------------------------------------------------------------
@functools.cache
def params_of(class_path: str | None, subpackage: str) -> tuple[str, ...]:
    """The ``__init__`` parameters of a config's class (from source; a class outside the package: imported)."""
    if not class_path:
        return ()
    signature = class_signature(class_path, subpackage)
    if signature is not None:
        return tuple(signature.params)
    import importlib
    import inspect

    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return ()
    return tuple(
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )


def _trainer_params() -> tuple[str, ...]:
    return params_of("lightning.pytorch.Trainer", "")


def _last_callback(config: dict) -> dict:
    callbacks = (config.get("trainer") or {}).get("callbacks") or []
    callbacks = [callbacks] if isinstance(callbacks, dict) else callbacks
    return callbacks[-1] if callbacks and isinstance(callbacks[-1], dict) else {}


def _owners(config: dict) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """``(qualifier, command-line prefix, class name, parameters)`` of every class a plain keyword may belong to."""
    out = []
    for qualifier, prefix, path, subpackage in (
        ("model", "model.init_args.", (config.get("model") or {}).get("class_path"), "modules"),
        ("data", "data.init_args.", (config.get("data") or {}).get("class_path"), "datamodules"),
        ("callback", "trainer.callbacks.init_args.", _last_callback(config).get("class_path"), "callbacks"),
    ):
        if path:
            out.append((qualifier, prefix, path.rsplit(".", 1)[-1], params_of(path, subpackage)))
    return out


def cli_key(key: str, config: dict) -> str:
    """The command-line key of an API keyword (the scheme in the module docstring); unknown: one-line error."""
    if key == "out":
        return "trainer.default_root_dir"
    if "." in key or key in TOP_LEVEL:
        return key
    if "__" in key:
        group, *rest = key.split("__")
        if group == "callback":
            return ".".join(["trainer", "callbacks", "init_args", *rest])
        if group in ("model", "data") and rest[0] not in ("init_args", "class_path"):
            rest = ["init_args", *rest]
        return ".".join([group, *rest])
    owners = [(q, prefix + key, name) for q, prefix, name, params in _owners(config) if key in params]
    if key in _trainer_params():
        owners.append(("trainer", f"trainer.{key}", "Trainer"))
    if len(owners) == 1:
        return owners[0][1]
    if len(owners) > 1:
        qualified = " or ".join(f"{o[0]}__{key}=" for o in owners)
        raise ValueError(f"{key}: taken by {' and '.join(o[2] for o in owners)}; write {qualified}")
    names = [n for *_, params in _owners(config) for n in params] + list(_trainer_params())
    near = difflib.get_close_matches(key, names, n=1)
    raise ValueError(
        f"{key}: no such option of {', '.join(o[2] for o in _owners(config))} or the Trainer"
        + (f" (did you mean {near[0]}?)" if near else "")
    )


def cli_value(value: Any) -> str:
    """A Python value as the command line gives it (jsonargparse reads it as YAML); a finished run: its folder."""
    if getattr(value, "folder", None) is not None and not isinstance(value, (str, os.PathLike)):
        value = value.folder
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return json.dumps(value)


def cli_args(config: str | os.PathLike, keys: dict[str, Any], subcommand: str | None = None) -> list[str]:
    """The command line (after ``python -m lit_svd``) of a config run with API keywords."""
    path = config_path(config)
    cfg = read_config(path)
    keys = {**_local_text(cfg, keys), **keys}
    args = [subcommand or subcommand_of(cfg), "--config", str(path)]
    for key, value in keys.items():
        args.append(f"--{cli_key(key, cfg)}={cli_value(value)}")
    return args


def _local_text(config: dict, keys: dict) -> dict:
    """A data ``path`` relative to the checkout's parent (``../shared/...``) resolved when the working folder
    is elsewhere (a notebook, a git worktree; ``$LIT_SVD_SHARED`` names the shared folder)."""
    given = any(k in keys for k in ("path", "data__path", "data.init_args.path"))
    path = ((config.get("data") or {}).get("init_args") or {}).get("path")
    if given or not isinstance(path, str) or Path(path).is_absolute() or Path(path).exists():
        return {}
    candidates = [CONFIGS.parent / path]
    shared = os.environ.get("LIT_SVD_SHARED")
    if shared and path.startswith("../shared/"):
        candidates.insert(0, Path(shared) / path.removeprefix("../shared/"))
    found = next((c.resolve() for c in candidates if c.exists()), None)
    return {"data.init_args.path": str(found)} if found else {}


# --- methods -----------------------------------------------------------------------------------------------------
def method_args(name: str, model: str, task: str | None = None, keys: dict[str, Any] | None = None) -> list[str]:
    """The command line of ``METHODS[name]`` on ``model`` (its config: ``config_for``) with ``keys`` overridden.
    A method that reads a finished run (``Method.reads``) takes that run's model and task (``run_args``)."""
    spec = method_named(name)
    keys = dict(keys or {})
    if spec.reads is not None:
        if spec.reads not in keys:
            raise ValueError(f"{spec.name}: give {spec.reads}= (the folder or result of a finished run it reads)")
        return run_args(spec, keys.pop(spec.reads), keys, model)
    path, fixed = config_for(spec, model, task)
    fixed = {"model.init_args.model": model, "data.init_args.tokenizer": model, **fixed}
    return cli_args(path, {**fixed, **keys})


def run_args(spec: Method, run: Any, keys: dict[str, Any], model: str | None = None) -> list[str]:
    """The command line of a method that reads the finished run ``run`` (a folder, or a result with ``folder``): its
    config for the run's model and task, the run's data section (``model``: must be the run's, when given)."""
    from lit_svd.runs import load_run

    folder = Path(cli_value(run))
    found = load_run(folder, need=("config",), what="run of the kind it reads")
    run_model = found.init_args("model").get("model", "")
    run_model = run_model if isinstance(run_model, str) else ""
    if model is not None and run_model and model != run_model:
        raise ValueError(f"{spec.reads}={str(folder)!r} is a run of model={run_model!r}, not {model!r}")
    task = found.init_args("data").get("task", spec.task)
    candidates = [
        CONFIGS / spec.folder / spec.pattern.format(prefix=prefix, task=t)
        for prefix in dict.fromkeys((config_prefix(run_model), GENERIC))
        for t in dict.fromkeys((task, spec.task or "ioi"))
    ]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise FileNotFoundError(f"{candidates[0]}: no config for {spec.name} of this run")
    data = {k: v for k, v in found.init_args("data").items() if k not in ("batch_size", "num_workers")}
    fixed = {f"model.init_args.{spec.reads}": str(folder), **{f"data.init_args.{k}": v for k, v in data.items()}}
    return cli_args(path, {**fixed, **keys})
