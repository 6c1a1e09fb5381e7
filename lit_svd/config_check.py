"""The fast check of ``python -m lit_svd``: configuration errors found before torch or Lightning is imported.

Importing Lightning takes seconds (its metrics pull in transformers, scipy and sympy), so the command line is
checked first, from the YAML files and the overrides alone: the ``model`` and ``data`` groups' ``init_args``
against the ``__init__`` signature of their class, read from the package's source (``ast``; nothing is
imported), and ``threads``. A check finds an unknown option, a value of the wrong type or outside a
``Literal[...]``, a model or tokenizer name that cannot be had; it prints the same two lines as the full
CLI (``lit_svd.errors``) and exits with code 2. Everything it cannot read with certainty (a class outside
``lit_svd``, an annotation naming a class, a ``class_path`` given on the command line, ``--help``,
``--print_config``) it leaves to LightningCLI, which still checks everything, including what the classes'
constructors judge only once the model or the tokenizer is loaded. Value ranges written as jsonargparse's
restricted types in a signature (``lr: PositiveFloat``) are checked here, and each class's ``options_check``.
"""

from __future__ import annotations

import ast
import collections.abc
import functools
import inspect
import pathlib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_svd import PROG
from lit_svd.errors import ConfigError, debug, fail, fail_with, one_line_error

PACKAGE = Path(__file__).resolve().parent
SUBCOMMANDS = ("fit", "validate", "test", "predict")
GROUPS = {"model": "modules", "data": "datamodules"}  # group -> subpackage whose __init__ names its classes
_SKIP = ("-h", "--help", "--print_config", "--version")


NO_DEFAULT = object()  # a parameter without a default, or one whose default is not a literal


@dataclass(frozen=True)
class Parameter:
    name: str
    annotation: Any  # a type, or Any where the annotation cannot be read without importing
    default: Any = NO_DEFAULT  # the signature's default where it is a literal (read without importing)


@dataclass(frozen=True)
class Signature:
    cls: str
    params: dict[str, Parameter]
    open: bool  # **kwargs reach a class outside the package: unknown names cannot be judged
    options_check: str | None = None  # the class's ``options_check`` ("module:function"), judged here too


# --- the command line ------------------------------------------------------------------------------------
def check_command_line(args: list[str]) -> None:
    """Exit in two lines (code 2) on a configuration error found without importing torch or Lightning;
    return otherwise (``args``: the command line after the program name)."""
    if debug() or not args or args[0] not in SUBCOMMANDS or any(a.split("=")[0] in _SKIP for a in args):
        return
    if any(a.endswith(".help") or a.split("=")[0].endswith(".help") for a in args):
        return
    try:
        config = merged_config(args[1:])
        if config is None:
            return
        for group in GROUPS:
            check_group(config, group, args[0])
        check_threads(config.get("threads"))
        check_names(config)
    except ConfigError as err:
        fail_with(err)


def merged_config(args: list[str]) -> dict | None:
    """The YAML files of ``--config`` merged with the ``--key value`` overrides, in command-line order; None
    when the command line uses a form this check does not follow (the full CLI then judges it)."""
    import yaml

    config: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            return None
        key, eq, value = arg[2:].partition("=")
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                return None  # a flag without a value
            value, i = args[i + 1], i + 1
        i += 1
        if key == "config":
            if not Path(value).is_file():
                raise ConfigError(f"--config {value}: no such file\nhint: `{PROG} --help` lists the shipped configs")
            try:
                loaded = yaml.safe_load(Path(value).read_text())
            except (OSError, yaml.YAMLError):
                return None  # the full CLI reports an unreadable file
            if not isinstance(loaded, dict):
                return None
            for name, item in loaded.items():
                config[name] = _merge(config.get(name), item)
            continue
        parts = key.split(".")
        if parts[0] in GROUPS and len(parts) == 1 or parts[-1] == "class_path":
            config.setdefault(parts[0], {})["class_path_on_command_line"] = True
            continue
        node = config
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = _CommandLineValue(value)
    return config


class _CommandLineValue(str):
    """A value as typed on the command line (parsed as jsonargparse parses it, by the parameter's type)."""


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        if "class_path" in new and "class_path" in old and new["class_path"] != old["class_path"]:
            return dict(new)
        merged = dict(old)
        for key, value in new.items():
            merged[key] = _merge(old.get(key), value)
        return merged
    return new


# --- one group -------------------------------------------------------------------------------------------
def check_group(config: dict, group: str, subcommand: str) -> None:
    """Unknown options and ill-typed values in ``config[group]``'s init_args."""
    node = config.get(group)
    if not isinstance(node, dict) or node.get("class_path_on_command_line") or "dict_kwargs" in node:
        return
    class_path = node.get("class_path")
    if not isinstance(class_path, str):
        return
    signature = class_signature(class_path, GROUPS[group])
    if signature is None:
        return
    given = dict(node.get("init_args") or {})
    given |= {k: v for k, v in node.items() if k not in ("class_path", "init_args")}
    for name, value in given.items():
        param = signature.params.get(name)
        if param is None:
            if not signature.open:
                _parse_error(
                    group,
                    subcommand,
                    f'Parser key "{group}": Problem with given class_path '
                    f"'{signature.cls}': Option '{name}' is not accepted",
                )
            continue
        error = type_error(param, value)
        if error:
            _parse_error(
                group, subcommand, f'Parser key "{group}": class_path \'{signature.cls}\': Parser key "{name}": {error}'
            )
    if signature.options_check:
        check_options(signature, given)


def check_options(signature: Signature, given: dict) -> None:
    """A class's ``options_check`` (``"module:function"``, a torch-free function its constructor also calls) on the
    options given, typed as the parser would type them, and on the class's literal defaults of the others (so a
    check function need not repeat them); ``n_layers`` / ``n_heads``, where the function takes them, from the
    model's config.json when it can be read without loading anything (``model_names.light_config``)."""
    import importlib

    module, _, name = signature.options_check.partition(":")
    check = getattr(importlib.import_module(module), name)
    params = inspect.signature(check).parameters
    ours = {k: p for k, p in signature.params.items() if k in params}
    kwargs = {k: p.default for k, p in ours.items() if p.default is not NO_DEFAULT}
    kwargs |= {k: typed(ours[k], v) for k, v in given.items() if k in ours}
    if {"n_layers", "n_heads"} & set(params) and isinstance(given.get("model"), str):
        from lit_svd.model_names import config_sizes, light_config

        found = light_config(str(given["model"]), given.get("gguf_file"), given.get("revision"))
        sizes = dict(zip(("n_layers", "n_heads"), config_sizes(found))) if found else {}
        kwargs |= {k: v for k, v in sizes.items() if k in params and v is not None}
    try:
        check(**kwargs)
    except ValueError as err:
        raise ConfigError(f"{err}\nhint: run again with --debug (or LIT_SVD_DEBUG=1) for the traceback") from None
    except TypeError:  # a value of a type the signature does not judge here: the full CLI judges it
        return


def typed(param: Parameter, value: Any) -> Any:
    """A command-line value as the parser types it (YAML, and an integer given for a float parameter as a float)."""
    if isinstance(value, _CommandLineValue):
        import yaml

        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            return str(value)
    annotation = param.annotation
    floats = float in typing.get_args(annotation) or inspect.isclass(annotation) and issubclass(annotation, float)
    if floats and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:  # YAML reads 1e-3 as a string; the parser reads it as a float
            return float(value)
        except ValueError:
            return value
    return value


def _parse_error(group: str, subcommand: str, message: str) -> None:
    hint = f"hint: `{PROG} {subcommand} --help` lists every option; --debug shows the details"
    fail(one_line_error(message), hint)


def type_error(param: Parameter, value: Any) -> str | None:
    """jsonargparse's complaint about ``value`` for the parameter's type (None: it fits, or cannot be judged)."""
    if param.annotation is Any:
        return None
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_argument(f"--{param.name}", type=param.annotation)
    except Exception:  # a type jsonargparse does not take here: leave it to the full CLI
        return None
    try:
        if isinstance(value, _CommandLineValue):
            parser.parse_args([f"--{param.name}={value}"], defaults=False)
        else:
            parser.parse_object({param.name: value}, defaults=False)
    except Exception as err:  # jsonargparse's ArgumentError
        text = str(err)
        return text.split(":", 1)[1].strip() if text.startswith('Parser key "') else text
    return None


def check_threads(threads: Any) -> None:
    if isinstance(threads, str):
        try:
            threads = int(threads)
        except ValueError:
            raise ConfigError(f"threads={threads}: must be a positive integer or null") from None
    if isinstance(threads, int) and threads < 1:
        raise ConfigError(f"threads={threads}: must be a positive integer or null")


def check_names(config: dict) -> None:
    """Model and tokenizer names that cannot be had (the full CLI's ``check_names``; imports torch only)."""
    names = []
    for group, key in (("model", "model"), ("data", "tokenizer")):
        node = config.get(group) or {}
        args = node.get("init_args") or {} if isinstance(node, dict) else {}
        if isinstance(args, dict) and isinstance(args.get(key), str) and "class_path_on_command_line" not in node:
            names.append((key, str(args[key]), args.get("revision")))
    if not names:
        return
    from lit_svd.model_names import ModelUnavailableError, check_available

    for key, name, revision in names:
        try:
            check_available(name, key, revision)
        except ModelUnavailableError as err:
            fail_with(err)


# --- signatures from the source ----------------------------------------------------------------------------
def class_signature(class_path: str, subpackage: str) -> Signature | None:
    """The ``__init__`` parameters of a package class named by short name or full path (None: not ours)."""
    if "." not in class_path:
        module = _exported(subpackage).get(class_path)
        if module is None:
            return None
        class_path = f"{module}.{class_path}"
    module, _, name = class_path.rpartition(".")
    return _signature(module, name)


@functools.cache
def _exported(subpackage: str) -> dict[str, str]:
    """Short class name -> module, from ``from lit_svd.<subpackage>.x import A, B`` lines of its __init__."""
    tree = _tree(f"lit_svd.{subpackage}")
    out = {}
    for node in tree.body if tree else []:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lit_svd."):
            out |= {alias.asname or alias.name: node.module for alias in node.names}
    return out


@functools.cache
def _tree(module: str) -> ast.Module | None:
    if not module.startswith("lit_svd."):
        return None
    base = PACKAGE.joinpath(*module.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return ast.parse(path.read_text())
    return None


def _signature(module: str, name: str, depth: int = 0) -> Signature | None:
    tree = _tree(module)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None
    if tree is None or depth > 8:
        return None
    imports = _imports(tree)
    if cls is None:  # a re-export (lit_svd.modules.ToyAlignmentModule): follow the import
        source = imports.get(name)
        return _signature(*source, depth + 1) if source and source[0].startswith("lit_svd.") else None
    bases = []
    for base in cls.bases:
        base_name = base.id if isinstance(base, ast.Name) else None
        if base_name and any(isinstance(n, ast.ClassDef) and n.name == base_name for n in tree.body):
            bases.append(_signature(module, base_name, depth + 1))
        elif base_name in imports and imports[base_name][0].startswith("lit_svd."):
            bases.append(_signature(*imports[base_name], depth + 1))
        else:
            bases.append(None)  # a class outside the package (LightningModule, a mixin elsewhere)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    check = _class_constant(cls, "options_check")
    if init is None:
        ours = [b for b in bases if b is not None]
        if not ours:
            return None
        return Signature(f"{module}.{name}", ours[0].params, ours[0].open, check or ours[0].options_check)
    namespace = _namespace(module)
    params = {}
    args = init.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults))
    defaults |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
    for arg in [*positional, *args.kwonlyargs][1:]:
        params[arg.arg] = Parameter(arg.arg, _annotation(arg.annotation, namespace), _literal(defaults.get(arg.arg)))
    open_ = False
    if args.kwarg is not None:  # **kwargs: the first base's parameters too (jsonargparse follows super())
        first = bases[0] if bases else None
        if first is None:
            open_ = True
        else:
            params = first.params | params
            open_ = first.open
    return Signature(f"{module}.{name}", params, open_, check)


def _literal(node: ast.expr | None) -> Any:
    """The value of a default written as a literal (``0.1``, ``None``, ``(1, 2)``); NO_DEFAULT otherwise."""
    if node is None:
        return NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return NO_DEFAULT


def _class_constant(cls: ast.ClassDef, name: str) -> str | None:
    """A string assigned to ``name`` in a class body (``options_check = "module:function"``)."""
    for node in cls.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def _imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Local name -> (module, name) for ``from M import name [as local]`` at the top of a module."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {a.asname or a.name: (node.module, a.name) for a in node.names}
    return out


_BASE_NAMESPACE = {
    **{name: getattr(typing, name) for name in ("Any", "Literal", "Optional", "Union")},
    **{name: getattr(collections.abc, name) for name in ("Sequence", "Mapping", "Iterable")},
    "Path": pathlib.Path,
    **{t.__name__: t for t in (int, float, str, bool, list, dict, tuple)},
    "None": None,
}


_READING: set[str] = set()  # modules whose namespace is being read (import cycles)


@functools.cache
def _namespace(module: str) -> dict[str, Any]:
    """What a module's annotations may name without importing it: builtins, typing, and its own
    module-level aliases (``Kind = Literal[...]``), also those imported from other package modules."""
    namespace = dict(_BASE_NAMESPACE)
    tree = _tree(module)
    if tree is None or module in _READING:
        return namespace
    _READING.add(module)
    for local, (source, name) in _imports(tree).items():
        if source == "jsonargparse.typing":  # restricted types (PositiveFloat ...): a light import
            import jsonargparse.typing

            namespace[local] = getattr(jsonargparse.typing, name)
        elif source.startswith("lit_svd.") and source != module:
            value = _namespace(source).get(name)
            if value is not None and name not in _BASE_NAMESPACE:
                namespace[local] = value
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and getattr(node, "value", None) is not None:
            value = _annotation(node.value, namespace)
            if value is not Any and _is_type(value):
                namespace[target.id] = value
    _READING.discard(module)
    return namespace


def _is_type(value: Any) -> bool:
    return isinstance(value, type) or typing.get_origin(value) is not None


def _annotation(node: ast.expr | None, namespace: dict[str, Any]) -> Any:
    """The annotation's type when every name in it is known here (else Any: not judged)."""
    if node is None:
        return Any
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return Any
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in namespace:
            return Any
        if isinstance(sub, (ast.Attribute, ast.Call, ast.Lambda)):
            return Any
    try:
        value = eval(compile(ast.Expression(node), "<annotation>", "eval"), {"__builtins__": {}}, namespace)
    except Exception:
        return Any
    if value is None:
        return type(None)
    return value if _is_type(value) or inspect.isclass(value) else Any
