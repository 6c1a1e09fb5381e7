"""The base of every typed result: fields, provenance, the JSON round trip, the table and ``save``.

A result is a dataclass whose fields are the keys of its ``results.json`` (in that order), each with a
one-line description (``doc``, shapes included) that ``describe()`` lists. ``to_dict()`` is the
results.json content (``summary`` gives the same), ``from_dict`` reads it back, ``table()`` is a pandas
DataFrame of the result's rows (one per head, direction, site, ...: ``rows()``), ``save(folder)`` writes
``results.json`` and, for results with a table file, the CSV. Keys a result type does not know (sections
another callback added, keys of a newer schema) are kept in ``extra`` and written back unchanged.

What a reader sees: ``headline`` (the few numbers that say what the run found and its control, named by the
type's ``headline_keys``), a ``repr`` of at most 15 lines (kind, model, headline, table, folder, provenance),
``figures`` and ``_repr_html_`` (Jupyter: ``lit_svd.results.show``).

Figures are drawn by the layer above (``lit_svd.figures``), which registers each type's function here with
``draws`` when it is imported; ``Result.figures`` reads that registry (``FIGURES``), so nothing here imports
upward.

The JSON key of a field is its name, except where ``key=`` says otherwise (a field cannot be called
``summary``: that name is the results.json content on every result).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from lit_svd.output import csv_text, to_jsonable, write_text
from lit_svd.results.show import pick, result_html, short_repr

SCHEMA_VERSION = 1
_MISSING = dataclasses.MISSING
Drawer = Callable[[Any], dict]
# {result type: its figures function}, filled by ``lit_svd.figures`` on import (``draws``), read by Result.figures
FIGURES: dict[type, Drawer] = {}


def draws(*kinds: type) -> Callable[[Drawer], Drawer]:
    """Decorator: the function draws the figures (``{name: matplotlib Figure}``) of results of ``kinds``
    (``@draws(SADResult)`` in ``lit_svd.figures.sad``)."""

    def register(draw: Drawer) -> Drawer:
        for kind in kinds:
            FIGURES[kind] = draw
        return draw

    return register


def drawer(kind: type) -> Drawer | None:
    """The figures function of result type ``kind`` (a subclass draws as its type); None where none is registered."""
    return next((FIGURES[t] for t in kind.__mro__ if t in FIGURES), None)


def doc_field(doc: str, default: Any = _MISSING, *, key: str | None = None, nan_ok: bool = False, **kw: Any) -> Any:
    """A dataclass field with its description (``doc``), JSON key (``key``, default: the field name) and NaN
    rule (``nan_ok``: NaN is written as null, an undefined value; otherwise a NaN fails the write).
    A mutable default is given as a factory: ``doc_field("...", list)``."""
    meta = {"doc": doc, "key": key, "nan_ok": nan_ok}
    if callable(default) and default in (list, dict):
        return field(default_factory=default, metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def nan_field(doc: str, default: Any = _MISSING, **kw: Any) -> Any:
    """``doc_field`` whose NaN values are undefined (no pairs, no example, ...) and written as null."""
    return doc_field(doc, default, nan_ok=True, **kw)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@cache
def git_commit() -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the checkout lit_svd is imported from, or ``(None, None)`` outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None, None
    try:
        run = lambda *a: subprocess.run(  # noqa: E731
            ["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        return run("rev-parse", "HEAD"), bool(run("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None


@dataclass(kw_only=True)
class Provenance:
    """What produced a result: written as results.json's ``provenance`` block."""

    schema_version: int = doc_field("version of the results.json schema (lit_svd.results.SCHEMA_VERSION)")
    lit_svd_version: str | None = doc_field("lit_svd's version")
    git_commit: str | None = doc_field("commit of the lit_svd checkout that ran (None outside a git checkout)")
    git_dirty: bool | None = doc_field("the checkout had uncommitted changes to tracked files")
    config: dict | None = doc_field("the resolved configuration (LightningCLI's config; else the hparams)")
    seeds: dict = doc_field("every seed of the run: global (seed_everything), model, data", dict)
    versions: dict = doc_field("python, torch, transformers, lightning versions", dict)
    device: str | None = doc_field("the device the model ran on (e.g. cpu, cuda:0 NVIDIA H200)")
    command: list[str] | None = doc_field("the command line")
    created: str | None = doc_field("when the result was written (UTC, ISO 8601)")

    @classmethod
    def collect(cls, config: dict | None = None, seeds: dict | None = None, device: Any = None) -> Provenance:
        """The provenance of a result written now by this process."""
        from lit_svd import __version__

        commit, dirty = git_commit()
        return cls(
            schema_version=SCHEMA_VERSION,
            lit_svd_version=__version__,
            git_commit=commit,
            git_dirty=dirty,
            config=config,
            seeds=dict(seeds or {}),
            versions={
                "python": platform.python_version(),
                **{name: _version(name) for name in ("torch", "transformers", "lightning")},
            },
            device=device_name(device),
            command=list(sys.argv),
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        )


def device_name(device: Any) -> str | None:
    """``"cpu"``, or ``"cuda:0 NVIDIA H200"`` (the accelerator's name where torch knows it)."""
    if device is None:
        return None
    name = str(device)
    if name.startswith("cuda"):
        import torch

        try:
            name = f"{name} {torch.cuda.get_device_name(torch.device(name))}"
        except (RuntimeError, AssertionError):
            pass
    return name


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@dataclass(kw_only=True)
class Result:
    """Base of every method's result (see the module docstring). Subclasses are ``@dataclass(kw_only=True,
    repr=False)`` (the short ``repr`` is this class's) and set ``experiment`` (the results.json ``experiment``
    value), ``headline_keys`` and, if their table is written as a file, ``table_file``."""

    experiment: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()  # other ``experiment`` values this type reads (``experiment_name``)
    table_file: ClassVar[str | None] = None  # the CSV of ``table()`` that ``save`` writes beside results.json
    table_columns: ClassVar[tuple[str, ...] | None] = None  # its columns (default: the row keys)
    sections: ClassVar[dict[str, type[Result]]] = {}  # fields holding a nested typed result: {field name: its type}
    # the headline numbers: "field/key/..." paths (a list index is a number), named by their last part or "name=path"
    headline_keys: ClassVar[tuple[str, ...]] = ()

    provenance: Provenance | None = doc_field("what produced the result (Provenance)", None)
    extra: dict = doc_field("results.json keys this type does not know, kept as read", dict)
    folder: Path | None = field(default=None, compare=False, metadata={"doc": "the run folder read from or saved to"})

    # --- the fields ------------------------------------------------------------------------------------
    @classmethod
    def content_fields(cls) -> list[dataclasses.Field]:
        """The fields written as results.json keys (all but ``provenance``, ``extra`` and ``folder``)."""
        return [f for f in dataclasses.fields(cls) if f.name not in ("provenance", "extra", "folder")]

    @classmethod
    def json_key(cls, f: dataclasses.Field) -> str:
        return f.metadata.get("key") or f.name

    @classmethod
    def describe(cls) -> dict[str, str]:
        """``{results.json key: "type: description"}`` of every field (docs and ``--help``-style listings)."""
        hints = _hints(cls)
        out = {"experiment": f"str: {cls.experiment!r}"} if cls.experiment else {}
        for f in cls.content_fields():
            kind = getattr(hints[f.name], "__name__", None) or str(hints[f.name]).replace("typing.", "")
            out[cls.json_key(f)] = f"{kind}: {f.metadata.get('doc', '')}"
        out["provenance"] = "Provenance: what produced the result (schema and library versions, commit, config)"
        return out

    # --- JSON -----------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The results.json content: ``experiment``, every field under its key, ``extra``, ``provenance``.
        Optional sections (fields marked ``omit_none``) that are None are left out."""
        name = self.experiment_name()
        out: dict[str, Any] = {"experiment": name} if name else {}
        for f in self.content_fields():
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            if isinstance(value, Result):
                value = value.to_dict()
                value.pop("provenance", None)
            key = self.json_key(f)
            out[key] = to_jsonable(value, key, nan_ok=f.metadata.get("nan_ok", False))
        out.update(to_jsonable(self.extra, "extra"))
        if self.provenance is not None:
            out["provenance"] = to_jsonable(dataclasses.asdict(self.provenance), "provenance")
        return out

    def experiment_name(self) -> str:
        """The ``experiment`` value written (the type's, unless a type says it depends on the content)."""
        return self.experiment

    @property
    def summary(self) -> dict:
        """The results.json content (``to_dict()``)."""
        return self.to_dict()

    def to_json(self, indent: int | None = 2) -> str:
        """``to_dict()`` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        """The result of a results.json content. Its ``experiment`` must be this type's; a missing field
        with a default takes the default (a results.json of an older schema), one without fails."""
        data = dict(data)
        found = data.pop("experiment", cls.experiment)
        if cls.experiment and found not in (cls.experiment, *cls.aliases):
            raise ValueError(f"experiment is {found!r}, not {cls.experiment!r}: this is not a {cls.__name__}")
        prov = data.pop("provenance", None)
        kwargs: dict[str, Any] = {}
        for f in cls.content_fields():
            key = cls.json_key(f)
            if key in data:
                value = data.pop(key)
                if f.name in cls.sections and isinstance(value, dict):
                    value = cls.sections[f.name].from_dict(value)
                kwargs[f.name] = value
            elif f.default is _MISSING and f.default_factory is _MISSING:
                raise ValueError(f"results.json of {cls.__name__} has no {key!r} key")
        known = {f.name for f in dataclasses.fields(Provenance)}
        provenance = Provenance(**{k: v for k, v in prov.items() if k in known}) if prov else None
        return cls(**kwargs, provenance=provenance, extra=data)

    @classmethod
    def from_json(cls, source: str | os.PathLike) -> Result:
        """The result of a results.json file (a path) or of its text."""
        if isinstance(source, str) and source.lstrip().startswith("{"):
            text = source
        else:
            text = Path(source).read_text(encoding="utf-8")
        return cls.from_dict(json.loads(text))

    # --- rows, table, files ---------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """The result's rows as flat dicts (one per head / direction / site / ...); ``table()`` frames them."""
        return []

    def table(self):
        """The rows as a pandas DataFrame (columns: the row keys, in the order of ``rows()``)."""
        import pandas as pd

        rows = self.rows()
        columns = self.table_columns or list(dict.fromkeys(k for r in rows for k in r))
        return pd.DataFrame(rows, columns=list(columns))

    def save(self, folder: str | os.PathLike, name: str = "results.json") -> Path:
        """Write ``name`` (results.json) and, where the type has one, its table CSV into ``folder``
        (atomically, the NaN policy of ``lit_svd.output``); returns the JSON path."""
        folder = Path(folder)
        path = write_text(folder / name, self.to_json())
        table_name = self.table_name()
        if table_name:
            write_text(folder / table_name, csv_text(self.rows(), self.table_columns))
        self.folder = folder
        return path

    def table_name(self) -> str | None:
        """The file name of the table CSV (``table_file``; None: no table file)."""
        return self.table_file

    # --- what a reader sees ---------------------------------------------------------------------------
    @property
    def headline(self) -> dict[str, Any]:
        """The headline numbers: what the run found and its control (``headline_keys``; absent or None left out)."""
        return pick(self, self.headline_keys)

    def subject(self) -> str:
        """What the result is about, in a few words: its model and task (the task of the run's data section where
        the result has no field for it), or the run it read."""
        model, task, source = (getattr(self, k, None) for k in ("model", "task", "source"))
        if not task and self.provenance is not None:
            task = pick(self.provenance, ("config/data/init_args/task",)).get("task")
        parts = [str(model) if model else f"run {source}" if source else "", f"task {task}" if task else ""]
        return ", ".join(p for p in parts if p)

    def __repr__(self) -> str:
        return short_repr(self)

    @property
    def figures(self) -> dict:
        """``{name: matplotlib Figure}``, drawn from this result alone by its type's function (``FIGURES``, registered
        by ``lit_svd.figures`` when it is imported: lit_svd's API and command line import it)."""
        draw = drawer(type(self))
        if draw is None:
            raise TypeError(f"no figures for {type(self).__name__}: import lit_svd.figures (it registers them)")
        return draw(self)

    def _repr_html_(self) -> str:
        """Jupyter's display: ``lit_svd.results.show.result_html`` (figures inline where they are registered)."""
        return result_html(self, figures=drawer(type(self)) is not None)


def optional(doc: str, nan_ok: bool = False, key: str | None = None) -> Any:
    """An optional field, left out of results.json when None (keys only some runs have, sections that only
    some callbacks add)."""
    return field(default=None, metadata={"doc": doc, "key": key, "nan_ok": nan_ok, "omit_none": True})
