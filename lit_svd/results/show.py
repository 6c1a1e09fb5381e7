"""How a result shows itself: its headline numbers, a ``repr`` of at most 15 lines and an HTML fragment.

``short_repr(result)`` is what ``print(result)`` and a notebook's plain display give: the kind and the model,
the headline numbers, the table's size, the folder and where the result came from. ``result_html(result)`` is
Jupyter's rich display (``Result._repr_html_``): the same numbers, the table's first rows and the figures inline.
"""

from __future__ import annotations

import html
from typing import Any

MAX_LINES = 15  # of a repr
FIXED_LINES = 4  # of them: the kind, the table, the folder, the provenance


def walk(obj: Any, path: str) -> Any:
    """The value at ``"field/key/0/key"`` (attribute, then dict keys and list indices); KeyError where absent."""
    first, *rest = path.split("/")
    if not hasattr(obj, first):
        raise KeyError(path)
    value = getattr(obj, first)
    for part in rest:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(path)
    return value


def pick(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """``{name: value}`` of each ``"path"`` (named by its last part) or ``"name=path"``; paths that are absent or
    hold None (an optional section the run did not have, an undefined value) are left out."""
    out: dict[str, Any] = {}
    for key in keys:
        name, path = key.split("=", 1) if "=" in key else (key.rsplit("/", 1)[-1], key)
        try:
            value = walk(obj, path)
        except KeyError:
            continue
        if value is not None:
            out[name] = value
    return out


def per_setting(items: list[dict], setting: str, keys: tuple[str, ...], most: int = 4) -> dict[str, Any]:
    """A sweep's headline: ``{"<key>@<setting>=<value>": item[key]}`` for each key of the first ``most`` items."""
    return {f"{key}@{setting}={fmt(item.get(setting))}": item.get(key) for item in items[:most] for key in keys}


def fmt(value: Any) -> str:
    """A value as a repr line shows it: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def title(result: Any) -> str:
    """``SADResult 'sad': smollm2-135m, task ioi``."""
    subject = result.subject()
    return f"{type(result).__name__} {result.experiment_name()!r}" + (f": {subject}" if subject else "")


def table_line(result: Any) -> str:
    n = len(result.rows())
    name = result.table_name()
    return f"table(): {n} row{'s' if n != 1 else ''}" + (f" ({name})" if name else "")


def provenance_line(result: Any) -> str | None:
    p = result.provenance
    if p is None:
        return None
    commit = (p.git_commit or "")[:9] + (" dirty" if p.git_dirty else "")
    parts = [f"lit_svd {p.lit_svd_version}", commit, (p.created or "")[:10], p.device or ""]
    return "written by " + ", ".join(x for x in parts if x)


def short_repr(result: Any) -> str:
    """At most ``MAX_LINES`` lines: the kind and subject, the headline numbers (the first ones, when there are
    more than fit), the table's rows, the folder, the provenance."""
    numbers = list(result.headline.items())
    room = MAX_LINES - FIXED_LINES
    if len(numbers) > room:
        numbers = [*numbers[: room - 1], ("...", f"{len(numbers) - room + 1} more in .headline")]
    width = max((len(k) for k, _ in numbers), default=0)
    lines = [title(result), *(f"  {k:<{width}}  {fmt(v)}" for k, v in numbers), table_line(result)]
    lines.append(f"folder: {result.folder}" if result.folder is not None else "folder: none (not saved or read)")
    origin = provenance_line(result)
    return "\n".join(lines + ([origin] if origin else []))


def result_html(result: Any, head: int = 8, figures: bool = True) -> str:
    """An HTML fragment: the title, folder and headline numbers, the table's first ``head`` rows, and (``figures``)
    every figure as an inline PNG."""
    import base64

    from lit_svd.output import figure_png

    esc = html.escape
    parts = [f"<h4>{esc(title(result))}</h4>"]
    if result.folder is not None:
        parts.append(f"<p><code>{esc(str(result.folder))}</code></p>")
    rows = "".join(
        f"<tr><th style='text-align:left'>{esc(k)}</th><td>{esc(fmt(v))}</td></tr>" for k, v in result.headline.items()
    )
    parts.append(f"<table>{rows}</table>")
    table = result.table()
    if len(table):
        parts.append(f"<p>table(): {len(table)} rows x {len(table.columns)} columns</p>")
        parts.append(table.head(head).to_html(max_cols=12, float_format=lambda x: f"{x:.4g}"))
    origin = provenance_line(result)
    if origin:
        parts.append(f"<p>{esc(origin)}</p>")
    if figures:
        for name, fig in result.figures.items():
            data = base64.b64encode(figure_png(fig, dpi=80)).decode()
            parts.append(f"<p>{esc(name)}</p><img src='data:image/png;base64,{data}'/>")
    return "\n".join(parts)
