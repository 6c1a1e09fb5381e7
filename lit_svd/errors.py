"""The two-line error form shared by every way in (``python -m lit_svd``, ``cli_tools``, the report, the API).

A user's error ends in at most two lines on stderr, the message (naming the option, the value and what is
allowed) then a hint, and exit code 2; ``--debug`` (or ``LIT_SVD_DEBUG=1``) shows the traceback instead.
This module imports nothing heavy, so that errors found before torch or Lightning load can be printed.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from typing import NoReturn

DEBUG_ENV = "LIT_SVD_DEBUG"
_WRAPPERS = ("Does not validate against any of the Union subtypes", "Problem with given class_path")
_PLAIN_TYPES = ("ValueError", "ConfigError", "ModelUnavailableError", "MisconfigurationException", "CorruptCacheError")


class ConfigError(ValueError):
    """A configuration error found by the CLI itself (message, and a hint on a second line)."""


def debug() -> bool:
    """Whether tracebacks are wanted (``--debug`` sets ``LIT_SVD_DEBUG=1``)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0", "false")


def fail(message: str, hint: str) -> NoReturn:
    """Print ``error: message`` and the hint line on stderr, exit with code 2."""
    print(f"error: {message.removeprefix('error: ')}", file=sys.stderr)
    print(hint if hint.startswith(("hint", "offline", "warning")) else f"hint: {hint}", file=sys.stderr)
    sys.exit(2)


def fail_with(err: BaseException) -> NoReturn:
    """Exit in the two-line form for an exception a user can fix (see ``user_message``)."""
    message, hint = user_message(err)
    fail(message.removeprefix("error: ").removeprefix("FileNotFoundError: "), hint)


def root_error(err: BaseException) -> BaseException:
    """The error a user should read: the first in the ``__cause__`` chain that is not jsonargparse's wrapper
    (a module's own ValueError, or lit_svd's ModelUnavailableError rather than the hub error it wraps)."""
    while err.__cause__ is not None and str(err).startswith(_WRAPPERS):
        err = err.__cause__
    return err


def user_message(err: BaseException) -> list[str]:
    """At most two lines for an error: its message and, if it has one, its hint line."""
    inner = root_error(err)
    lines = [ln.strip() for ln in str(inner).strip().splitlines() if ln.strip()] or [type(inner).__name__]
    first = lines[0]
    if type(inner).__name__ not in _PLAIN_TYPES:
        first = f"{type(inner).__name__}: {first}"
    hint = lines[1] if len(lines) > 1 else f"run again with --debug (or {DEBUG_ENV}=1) for the traceback"
    return [f"error: {first}", hint if hint.startswith(("hint", "offline", "warning")) else f"hint: {hint}"]


def plain_cause(tail: str) -> str:
    """jsonargparse's wording of a type error in plain words ("expected a float, got abc")."""
    tail = re.split(r" ?Expected a <class 'NoneType'>| ?Given value type:| ?Subtypes:", tail)[0].strip()
    tail = re.sub(r"Expected a <class '(\w+)'>\. Got value: (.*)", r"expected a \1, got \2", tail)
    # restricted types (jsonargparse.typing.PositiveFloat ...)
    tail = re.sub(r"Not of type \w+: could not convert string to (\w+): '(.*)'", r"expected a \1, got \2", tail)
    tail = re.sub(
        r"Not of type \w+: (.*) does not conform to restriction v ?([<>=!]+) ?(\S+)", r"must be \2 \3, got \1", tail
    )
    return re.sub(r"Expected a (typing\.)?Literal\[(.*?)\]\. Got value: (.*)", r"must be one of \2, got \3", tail)


def one_line_error(message: str) -> str:
    """jsonargparse's nested, multi-line parse error reduced to one line: the full key and the innermost cause."""
    flat = " ".join(ln.strip().lstrip("- ").strip() for ln in message.splitlines() if ln.strip())
    keys = re.findall(r'Parser key "([^"]+)"', flat)
    where = re.search(r"class_path '([^']+)'", flat)
    # the innermost cause: after the last class_path / 'Parser key' prefix, cut at the union report's tail
    tail = re.split(r'Parser key "[^"]+":|class_path \'[^\']+\':', flat)[-1].strip()
    tail = re.split(r" ?Expected a <class 'NoneType'>| ?Given value type:| ?Subtypes:", tail)[0].strip()
    if not keys or not tail:
        return flat
    key = keys[0]
    if where and len(keys) > 1:  # model: ... class_path 'X': lr -> model.init_args.lr
        key = f"{keys[0]}.init_args.{keys[-1]}"
    elif len(keys) > 1:
        key = ".".join(keys)
    unknown = re.match(r"Option '([^']+)' is not accepted", tail)
    if unknown and where:
        key, tail = f"{key}.init_args.{unknown.group(1)}", "no such option"
    return f"{key}: {plain_cause(tail)}" + (f" (in {where.group(1).rsplit('.', 1)[-1]})" if where else "")


def quiet() -> None:
    """No adverts, deprecation notes or hardware banners: the run's own output and real warnings only."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings(
        "ignore",
        message=r".*(deprecated|Grad strides do not match|does not have many workers"
        r"|`isinstance\(treespec, LeafSpec\)`|Checkpoint directory .* exists"
        # a frozen model stays in eval mode on purpose; a mask run's checkpoint holds the masks after their step
        r"|Found \d+ module\(s\) in eval mode|Using ModelCheckpoint with manual optimization).*",
    )
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.seed",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
