"""Options with a fixed set of values: the set is a ``typing.Literal`` alias, checked in one place.

A signature names the alias (``side: Side``), so the type checker and jsonargparse (``--help``, parse errors)
know the values; ``check_choice(name, value, Side)`` checks a value that arrives at run time, with the
project's one-line error: ``side='value' is unknown; choose one of query, key``. Tuples of the values, where
code iterates over them, are ``choices(Alias)``, never written out a second time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, Union, get_args, get_origin


def choices(options: Any) -> tuple[Any, ...]:
    """The values of a ``Literal`` alias, in order (a union of Literals or nested Literals flattened); an
    iterable of values (a subset computed at run time) is taken as it is."""
    if get_origin(options) is Literal:
        return tuple(v for arg in get_args(options) for v in choices(arg))
    if get_origin(options) is Union:
        return tuple(v for arg in get_args(options) for v in choices(arg))
    if isinstance(options, Iterable) and not isinstance(options, str):
        return tuple(options)
    return (options,)  # one value of a Literal


def check_choice(name: str, value: Any, options: Any, where: str = "") -> Any:
    """``value`` if it is one of ``options`` (a ``Literal`` alias or a tuple of values), else ``ValueError``
    in one line naming the option, the value and the allowed values; ``where`` follows "is unknown" (``" for
    gpt2"``). Returns the value (typed as the caller's alias: this is the run-time check of that type)."""
    allowed = choices(options)
    if isinstance(value, (str, int, bool, type(None))) and value in allowed:
        return value
    raise ValueError(f"{name}={value!r} is unknown{where}; choose one of {', '.join(map(str, allowed))}")


# the linear maps of a transformer layer, named as every view names them (``models.base.ModelView.site_module``);
# here, below torch, so that the command line's fast check can judge a site before the model loads
Site = Literal["q", "k", "v", "o", "gate", "up", "down"]
SITES: tuple[Site, ...] = choices(Site)
