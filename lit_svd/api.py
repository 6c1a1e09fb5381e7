"""The Python API: run a method from Python and get its typed result back, through the CLI's own code path.

    import lit_svd as ls
    sad = ls.sad("smollm2-135m", task="ioi", n_test=32)      # a SADResult, shown as HTML in Jupyter
    sad.summary["summary"]["n_heads_sparser_than_null"]; sad.table(); sad.figures; sad.save("out/")
    masks = ls.masks("smollm2-135m", task="gp", max_steps=48, out="runs/gp")
    check = ls.directions(masks)                              # the direction check of that mask run
    ls.mounts("gemma3-270m", test_tokens=2048)
    ls.run("configs/toy/single_pair.yaml", max_steps=100)    # any config file, any key overridden

Every call builds the arguments of ``python -m lit_svd <fit|test> --config <configs/<method>/...yaml> ...``
and runs ``lit_svd.cli_lightning.LitSVDCLI`` on them (the same parser, checks, module, data module, report callback and
Trainer as the command line), then reads the run's results.json back through ``lit_svd.runs``. So the API
and the CLI write the same results.json (tests/test_api.py compares them).

Keywords (one scheme, docs/api.md):
* ``name=value``: a module, data-module or Trainer argument, found by name in the config's classes
  (``lr=1e-3`` -> ``--model.init_args.lr``, ``n_test=16`` -> ``--data.init_args.n_test``, ``max_steps=8`` ->
  ``--trainer.max_steps``); a name two of them take (``seed``) must be qualified;
  or the config's last callback (its report callback: ``trajectory_every=2`` ->
  ``--trainer.callbacks.init_args.trajectory_every``);
* ``group__name=value``: qualified (``data__seed=1`` -> ``--data.init_args.seed``; ``trainer__max_time=...``;
  ``callback__name``: the last callback's);
* ``**{"dotted.key": value}``: passed as ``--dotted.key`` verbatim;
* ``out=DIR``: ``--trainer.default_root_dir``; ``seed_everything``, ``threads``, ``ckpt_path`` as the CLI's.

The model names of the configs (``smollm2-135m``, ``gemma3-270m``, a hub name, a folder) are accepted, and
``tiny-<arch>`` (``tiny-llama``, ``tiny-gpt2``, ``tiny-gpt_neox``, ``tiny-gemma2``, ``tiny-gemma3``): a tiny
random model (``lit_svd.models.tiny``, seed 0) saved once with SmolLM2's tokenizer under ``$LIT_SVD_CACHE/tiny``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import os
import sys
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from lit_svd import CONFIGS, PROG

GENERIC = "smollm2"  # the configs used, with the model overridden, for a model without its own
PREFIXES = {"smollm2-135m": "smollm2", "gemma3-270m": "gemma3_270m", "gpt2": "gpt2"}
TOP_LEVEL = ("seed_everything", "threads", "ckpt_path")
TINY = "tiny-"


@dataclass(frozen=True)
class Method:
    """A method the API runs from its configs: ``configs/<folder>/<pattern>`` (``{prefix}``: the model's config
    prefix, ``{task}``). Adding one (e.g. the circuit graph) is one line in ``METHODS``."""

    folder: str
    pattern: str = "{prefix}_{task}.yaml"
    task: str | None = "ioi"  # the default task (None: the method takes none)


METHODS: dict[str, Method] = {
    "sad": Method("sad"),
    "masks": Method("masks"),
    "mounts": Method("mounts", "{prefix}_wikitext.yaml", task=None),
    "circuits": Method("circuits"),
    "edge_circuits": Method("edge_circuits"),
}


# --- models and configs -----------------------------------------------------------------------------------
def resolve_model(model: str) -> str:
    """The name a config's ``model`` takes: ``tiny-<arch>`` becomes its saved folder, others are kept."""
    if not model.startswith(TINY):
        return model
    from lit_svd.models.loading import cache_root
    from lit_svd.models.tiny import ARCHITECTURES, HEAD_NORM_ARCHITECTURES

    arch = model[len(TINY) :]
    known = ARCHITECTURES + HEAD_NORM_ARCHITECTURES
    if arch not in known:
        raise ValueError(f"model={model!r}: no such tiny model; allowed: {', '.join(TINY + a for a in known)}")
    folder = cache_root() / "tiny" / f"{arch}-seed0"
    if not (folder / "config.json").is_file():
        _save_tiny(arch, folder)
    return str(folder)


def _save_tiny(arch: str, folder: Path) -> None:
    """Save the tiny model and SmolLM2's tokenizer into ``folder`` (written beside it, then renamed: a
    concurrent or killed save never leaves a half folder)."""
    import shutil
    import tempfile

    from lit_svd.models.loading import load_tokenizer
    from lit_svd.models.tiny import tiny_causal_lm

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    tiny_causal_lm(arch, seed=0).save_pretrained(tmp)
    load_tokenizer("smollm2-135m").save_pretrained(tmp)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)


def config_prefix(model: str) -> str:
    """The config prefix of a model (``smollm2-135m`` -> ``smollm2``); others use the generic configs."""
    return PREFIXES.get(model, GENERIC)


def config_for(method: str, model: str, task: str | None = None) -> tuple[Path, dict[str, Any]]:
    """``(config file, overrides)`` of ``method`` on ``model``: the model's own config for the task if there is
    one, else the generic (SmolLM2) one, else the method's IOI config with the task overridden."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: allowed: {', '.join(METHODS)}")
    spec = METHODS[method]
    task = task or spec.task
    if spec.task is None and task is not None:
        raise ValueError(f"task={task!r}: {method} takes no task")
    folder = CONFIGS / spec.folder
    for prefix in dict.fromkeys((config_prefix(model), GENERIC)):
        for t in dict.fromkeys((task, spec.task)):
            path = folder / spec.pattern.format(prefix=prefix, task=t)
            if path.is_file():
                return path, ({"data.init_args.task": task} if t != task else {})
    have = ", ".join(p.name for p in sorted(folder.glob("*.yaml"))) or "none"
    raise FileNotFoundError(
        f"{folder / spec.pattern.format(prefix=config_prefix(model), task=task)}: no config for {method} on"
        f" {model!r} (configs there: {have})"
    )


def _read_config(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise FileNotFoundError(f"config={str(path)!r}: no such file")
    return yaml.safe_load(path.read_text()) or {}


def subcommand_of(config: dict) -> str:
    """``fit`` for a config that trains (its trainer has max_steps / max_epochs), else ``test``."""
    trainer = config.get("trainer") or {}
    return "fit" if any(k in trainer for k in ("max_steps", "max_epochs")) else "test"


# --- keywords -> command-line arguments --------------------------------------------------------------------
def _class(path: str | None):
    """The class of a config's ``class_path`` (full path, or a short name of the package's classes)."""
    import importlib

    if not path:
        return None
    if "." in path:
        module, name = path.rsplit(".", 1)
        return getattr(importlib.import_module(module), name, None)
    for package in ("lit_svd.modules", "lit_svd.datamodules"):
        found = getattr(importlib.import_module(package), path, None)
        if found is not None:
            return found
    return None


@functools.cache
def _params(cls) -> tuple[str, ...]:
    if cls is None:
        return ()
    return tuple(
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )


def _trainer_params() -> tuple[str, ...]:
    from lightning.pytorch import Trainer

    return _params(Trainer)


def _last_callback(config: dict) -> dict:
    callbacks = (config.get("trainer") or {}).get("callbacks") or []
    callbacks = [callbacks] if isinstance(callbacks, dict) else callbacks
    return callbacks[-1] if callbacks and isinstance(callbacks[-1], dict) else {}


def _owners(config: dict) -> list[tuple[str, str, type | None]]:
    """``(qualifier, command-line prefix, class)`` of every class a plain keyword may belong to."""
    return [
        ("model", "model.init_args.", _class((config.get("model") or {}).get("class_path"))),
        ("data", "data.init_args.", _class((config.get("data") or {}).get("class_path"))),
        ("callback", "trainer.callbacks.init_args.", _class(_last_callback(config).get("class_path"))),
    ]


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
    owners = [(q, prefix + key, cls.__name__) for q, prefix, cls in _owners(config) if key in _params(cls)]
    if key in _trainer_params():
        owners.append(("trainer", f"trainer.{key}", "Trainer"))
    if len(owners) == 1:
        return owners[0][1]
    if len(owners) > 1:
        qualified = " or ".join(f"{o[0]}__{key}=" for o in owners)
        raise ValueError(f"{key}: taken by {' and '.join(o[2] for o in owners)}; write {qualified}")
    classes = [cls for _, _, cls in _owners(config) if cls is not None]
    names = [n for cls in classes for n in _params(cls)] + list(_trainer_params())
    near = difflib.get_close_matches(key, names, n=1)
    raise ValueError(
        f"{key}: no such option of {', '.join(c.__name__ for c in classes)} or the Trainer"
        + (f" (did you mean {near[0]}?)" if near else "")
    )


def cli_value(value: Any) -> str:
    """A Python value as the command line gives it (jsonargparse reads it as YAML)."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return json.dumps(value)


def cli_args(config_path: str | os.PathLike, keys: dict[str, Any], subcommand: str | None = None) -> list[str]:
    """The command line (after ``python -m lit_svd``) of a config run with API keywords."""
    path = Path(config_path)
    config = _read_config(path)
    args = [subcommand or subcommand_of(config), "--config", str(path)]
    for key, value in keys.items():
        args.append(f"--{cli_key(key, config)}={cli_value(value)}")
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


# --- running -----------------------------------------------------------------------------------------------
def run_cli(args: list[str]) -> Path:
    """Run ``python -m lit_svd ARGS`` in this process (``cli_lightning.lightning_cli``, as ``cli.main``) and
    return the run folder. A configuration error raises ValueError in one line (the CLI's message). While it runs,
    ``sys.argv`` is that command line, so the result's provenance records the command that reproduces it.
    One process: a multi-device (DDP) run is the command line's (Lightning relaunches ``sys.argv``)."""
    from jsonargparse import ArgumentError

    from lit_svd.cli import quiet
    from lit_svd.cli_lightning import is_user_error, lightning_cli
    from lit_svd.errors import debug, one_line_error, root_error, user_message
    from lit_svd.output import run_dir

    argv, sys.argv = sys.argv, [PROG, *args]  # the provenance's command: the CLI command that reproduces the run
    with warnings.catch_warnings():
        if not debug():
            quiet()
        try:
            cli = lightning_cli(list(args), exit_on_error=False)
        except ArgumentError as err:
            if debug():
                raise
            raise ValueError(one_line_error(str(err))) from None
        except Exception as err:
            if debug() or not is_user_error(err):
                raise
            message = user_message(err)[0].removeprefix("error: ")
            kind = FileNotFoundError if isinstance(root_error(err), FileNotFoundError) else ValueError
            raise kind(message) from err
        finally:
            sys.argv = argv
    return run_dir(cli.trainer)


def run(config: str | os.PathLike, subcommand: str | None = None, **keys: Any):
    """Run a config file (``python -m lit_svd <subcommand> --config FILE``; subcommand: fit when the config
    trains, else test) with ``keys`` overridden; returns the run's result (``load``)."""
    path = Path(config)
    if not path.is_file() and (CONFIGS.parent / path).is_file():
        path = CONFIGS.parent / path
    cfg = _read_config(path)
    keys = {**_local_text(cfg, keys), **keys}
    return load(run_cli(cli_args(path, keys, subcommand)))


def method(name: str, model: str, task: str | None = None, **keys: Any):
    """Run ``METHODS[name]`` on ``model`` (its config: ``config_for``) with ``keys`` overridden."""
    path, fixed = config_for(name, model, task)
    resolved = resolve_model(model)
    keys = {"model.init_args.model": resolved, "data.init_args.tokenizer": resolved, **fixed, **keys}
    return run(path, **keys)


def sad(model: str, task: str = "ioi", **keys: Any):
    """Sparse attention decomposition of every head of ``model`` on ``task`` prompts (configs/sad/); a SADResult."""
    return method("sad", model, task, **keys)


def masks(model: str, task: str = "ioi", **keys: Any):
    """Directional circuits: learn masks over the singular directions for ``task`` (configs/masks/); a MaskResult."""
    return method("masks", model, task, **keys)


def mounts(model: str, **keys: Any):
    """Tiled-SVD mounts of every linear site of ``model`` on WikiText (configs/mounts/); a MountsResult."""
    return method("mounts", model, **keys)


def directions(run_folder: Any, **keys: Any):
    """The direction check of a finished mask run (a folder, or the result ``masks()`` returned): each kept
    OV direction patched against random ones, its block and readout (configs/masks/*_directions.yaml, with the
    run's own data section). A DirectionCheckResult."""
    from lit_svd.runs import load_run

    folder = Path(getattr(run_folder, "folder", None) or run_folder)
    found = load_run(folder, need=("config", "masks"), what="direction-mask run")
    model = found.init_args("model").get("model", "")
    task = found.init_args("data").get("task", "ioi")
    prefix = config_prefix(model if isinstance(model, str) else "")
    path = next(
        p
        for p in (
            CONFIGS / "masks" / f"{prefix}_{task}_directions.yaml",
            CONFIGS / "masks" / f"{GENERIC}_{task}_directions.yaml",
            CONFIGS / "masks" / f"{GENERIC}_ioi_directions.yaml",
        )
        if p.is_file()
    )
    data = {k: v for k, v in found.init_args("data").items() if k not in ("batch_size", "num_workers")}
    fixed = {"model.init_args.run": str(folder), **{f"data.init_args.{k}": v for k, v in data.items()}}
    return run(path, **{**fixed, **keys})


def load(folder: str | os.PathLike):
    """The result of a finished run (its folder, or a results.json), with ``figures`` and Jupyter display."""
    from lit_svd.runs import load_run

    path = Path(folder)
    if path.is_file():
        path = path.parent
    found = load_run(path, need=("results",))
    from lit_svd.results import result_type

    result = shown_type(result_type(found.content.get("experiment"))).from_dict(found.content)
    result.folder = path
    return result


def __getattr__(name: str):
    """``ls.<method>(model, task=..., **keys)`` for every method of ``METHODS`` without its own function."""
    if name in METHODS:
        return partial(method, name)
    raise AttributeError(f"module 'lit_svd.api' has no attribute {name!r}")


# --- what the API returns ----------------------------------------------------------------------------------
class Shown:
    """Mixed into a result type by ``shown_type``: ``folder`` (the run folder), ``figures`` and ``_repr_html_``."""

    folder: Path | None = None

    @property
    def figures(self) -> dict:
        """``{name: matplotlib Figure}``: ``lit_svd.figures.figures_of(self)``."""
        from lit_svd.figures import figures_of

        return figures_of(self)

    def _repr_html_(self) -> str:
        return result_html(self)


@functools.cache
def shown_type(cls: type) -> type:
    """``cls`` with ``Shown`` mixed in (same fields, JSON, table; ``isinstance`` of ``cls`` holds)."""
    return type(cls.__name__, (cls, Shown), {"__qualname__": cls.__qualname__, "__module__": cls.__module__})


def scalars(content: dict, limit: int = 24) -> dict:
    """The scalar entries of a results.json content, nested ones flattened (``summary.n_heads_eligible``)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, obj: dict) -> None:
        for key, value in obj.items():
            if key in ("provenance", "config", "extra") or len(out) >= limit:
                continue
            name = f"{prefix}{key}"
            if isinstance(value, dict) and not prefix:
                walk(f"{name}.", value)
            elif isinstance(value, (int, float, str, bool)) or value is None:
                out[name] = value

    walk("", content)
    return out


def result_html(result, head: int = 8, figures: bool = True) -> str:
    """A small HTML page fragment: the key numbers, the table's first rows and the figures (inline PNG)."""
    import base64
    import html

    from lit_svd.output import figure_png

    content = result.to_dict()
    rows = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in scalars(content).items()
    )
    parts = [f"<h4>{html.escape(type(result).__name__)} ({html.escape(str(content.get('experiment', '')))})</h4>"]
    if getattr(result, "folder", None):
        parts.append(f"<p><code>{html.escape(str(result.folder))}</code></p>")
    parts.append(f"<table>{rows}</table>")
    table = result.table()
    if len(table):
        parts.append(f"<p>table(): {len(table)} rows x {len(table.columns)} columns</p>")
        parts.append(table.head(head).to_html(max_cols=12, float_format=lambda x: f"{x:.4g}"))
    if figures:
        for name, fig in result.figures.items():
            data = base64.b64encode(figure_png(fig, dpi=80)).decode()
            parts.append(f"<p>{html.escape(name)}</p><img src='data:image/png;base64,{data}'/>")
    return "\n".join(parts)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
