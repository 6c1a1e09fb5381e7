"""The fast check (``lit_svd.config_check``) against the full CLI's own reading of the classes.

The check reads ``__init__`` signatures from the source without importing; here they are compared with what
jsonargparse reads from the imported classes (names, and every annotation the check judges), and every
shipped config must pass the check (a false error would stop a valid run).
"""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from lit_svd import config_check

ROOT = Path(__file__).resolve().parents[1]
CLASSES = [(name, "modules") for name in config_check._exported("modules")] + [
    (name, "datamodules") for name in config_check._exported("datamodules")
]


@pytest.mark.parametrize("name,subpackage", CLASSES)
def test_signatures_read_from_the_source_match_the_imported_classes(name, subpackage):
    import importlib

    from jsonargparse._signatures import get_signature_parameters

    cls = getattr(importlib.import_module(f"lit_svd.{subpackage}"), name)
    real = {p.name: p for p in get_signature_parameters(cls, "__init__")}
    found = config_check.class_signature(name, subpackage)
    assert found is not None and not found.open
    assert set(found.params) == set(real), set(found.params) ^ set(real)
    hints = {}  # the annotations of every __init__ the parameters come from (a subclass passes **loading on)
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass) and klass.__module__.startswith("lit_svd"):
            hints |= typing.get_type_hints(klass.__init__)
    judged = 0
    for param in found.params.values():
        if param.annotation is not typing.Any and param.name in hints:
            assert param.annotation == hints[param.name], (param.name, param.annotation, hints[param.name])
            judged += 1
    assert judged >= len(found.params) // 2  # most options are judged before Lightning loads


def test_a_class_path_with_the_package_path_is_read_too():
    short = config_check.class_signature("ToyAlignmentModule", "modules")
    full = config_check.class_signature("lit_svd.modules.ToyAlignmentModule", "modules")
    assert short is not None and full is not None and short.params == full.params and "lr" in short.params


@pytest.mark.parametrize("config", sorted(ROOT.glob("configs/*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_passes_the_check(config, monkeypatch):
    """No false errors: the check accepts every shipped config (names are checked by the CLI test)."""
    monkeypatch.setattr(config_check, "check_names", lambda cfg: None)
    subcommand = "fit" if "max_steps" in config.read_text() else "test"
    config_check.check_command_line([subcommand, "--config", str(config)])


def test_overrides_are_read_as_the_command_line_gives_them(capsys, monkeypatch):
    monkeypatch.setattr(config_check, "check_names", lambda cfg: None)
    toy = str(ROOT / "configs/toy/single_pair.yaml")
    for good in (["--model.init_args.lr", "1e-3"], ["--model.init_args.lr=2"], ["--model.init_args.seeds", "[1, 2]"]):
        config_check.check_command_line(["fit", "--config", toy, *good])
    with pytest.raises(SystemExit) as code:
        config_check.check_command_line(["fit", "--config", toy, "--model.init_args.seeds", "[1, x]"])
    assert code.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert (
        len(lines) == 2 and lines[0].startswith("error: model.init_args.seeds: ") and "ToyAlignmentModule" in lines[0]
    )
