"""The one reader of a finished run: its folder's ``config.yaml``, ``masks.pt`` and ``results.json``.

Every tool that reads a run goes through ``load_run`` (``cli_tools``, the direction check, the report):

    run = load_run("runs/masks_ioi/lightning_logs/version_0", need=("config", "masks"))
    run.config["model"]["init_args"], run.masks["lambdas"], run.result  # a lit_svd.results type

A file that is asked for and missing fails in one line that names it and the kind of folder expected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from lit_svd.results import Result, load_result

Part = Literal["config", "masks", "results"]
FILES: dict[str, str] = {"config": "config.yaml", "masks": "masks.pt", "results": "results.json"}


@dataclass
class Run:
    """A finished run's folder (the logger's version folder, where config.yaml and results.json are)."""

    folder: Path
    what: str = "run"  # how errors name the expected folder ("direction-mask run", ...)
    _cache: dict = field(default_factory=dict, repr=False)

    def path(self, part: Part) -> Path:
        return self.folder / FILES[part]

    def has(self, part: Part) -> bool:
        return self.path(part).is_file()

    def require(self, *parts: Part) -> Run:
        """Fail in one line if any of ``parts`` is missing."""
        for part in parts:
            if not self.has(part):
                raise FileNotFoundError(
                    f"{self.path(part)}: no {FILES[part]}; give the folder of a finished {self.what}"
                )
        return self

    @cached_property
    def config(self) -> dict:
        """config.yaml as a dict (LightningCLI's resolved configuration of the run)."""
        import yaml

        self.require("config")
        return yaml.safe_load(self.path("config").read_text()) or {}

    def init_args(self, section: Literal["model", "data"]) -> dict:
        """``config[section]["init_args"]``: the run's module or data module arguments."""
        return dict((self.config.get(section) or {}).get("init_args") or {})

    @cached_property
    def masks(self) -> dict:
        """masks.pt of a direction-mask run: ``{"lambdas": {component: [groups, directions]}, "threshold", ...}``."""
        import torch

        self.require("masks")
        return torch.load(self.path("masks"), map_location="cpu", weights_only=False)

    @cached_property
    def content(self) -> dict:
        """results.json as read (a plain dict; ``result`` is the typed form)."""
        self.require("results")
        return json.loads(self.path("results").read_text(encoding="utf-8"))

    @cached_property
    def result(self) -> Result:
        """results.json as its typed result (``lit_svd.results.load_result``), its ``folder`` the run's."""
        result = load_result(self.content)
        result.folder = self.folder
        return result


def load_run(folder: str | os.PathLike, need: Sequence[Part] = (), what: str = "run") -> Run:
    """The run in ``folder``; every part in ``need`` must be there (one-line error otherwise)."""
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a folder; give the folder of a finished {what}")
    return Run(path, what).require(*need)


def find_results(paths: Iterable[str | os.PathLike], experiment: str | None = None) -> list[tuple[str, Any]]:
    """``(label, result)`` for every results.json under ``paths`` (run folders searched recursively, or
    results.json files), labelled by the path given; results of another ``experiment`` fail in one line."""
    out = []
    for path in map(Path, paths):
        if path.is_file() and path.suffix != ".json":
            raise ValueError(f"{path}: not a run folder or a results.json")
        found = [path] if path.is_file() else sorted(path.rglob("results.json"))
        if not found:
            raise FileNotFoundError(f"{path}: no results.json (has the run finished?)")
        for file in found:
            content = json.loads(file.read_text(encoding="utf-8"))
            if experiment is not None and content.get("experiment") != experiment:
                raise ValueError(f"{file}: experiment is {content.get('experiment')!r}, not {experiment!r}")
            out.append((str(path), load_result(content)))
    return out


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
