"""The torch-free option checks (``options_check = "module:function"`` of the modules and data modules): importing
them imports nothing heavy, their defaults are the constructors', the constructor fails with the same line as the
command line's fast check, and a check needing the model's sizes reads them from its config.json."""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys

import pytest

from lit_svd import config_check
from tests.helpers import ROOT

# every class whose constructor judges option values
CHECKED = [
    ("lit_svd.modules.sad.SADAnalysisModule", "modules"),
    ("lit_svd.modules.circuits.CircuitGraphModule", "modules"),
    ("lit_svd.modules.direction_mask.DirectionMaskModule", "modules"),
    ("lit_svd.modules.faithfulness.FaithfulnessModule", "modules"),
    ("lit_svd.modules.toy.ToyAlignmentModule", "modules"),
    ("lit_svd.modules.mounts.MountsAnalysisModule", "modules"),
    ("lit_svd.modules.direction_check.DirectionCheckModule", "modules"),
    ("lit_svd.modules.language_model.LanguageModelModule", "modules"),
    ("lit_svd.modules.language_model.FineTuneLMModule", "modules"),
    ("lit_svd.datamodules.tasks.TaskDataModule", "datamodules"),
    ("lit_svd.datamodules.text.TextDataModule", "datamodules"),
    ("lit_svd.datamodules.toy.SparseFeatureDataModule", "datamodules"),
]
# what the model has: its sizes supplied by the fast check from its config.json, its parts (``parts``) by the
# circuit module's ``check_config``
MODEL_FACTS = {"n_layers", "n_heads", "parts"}


def check_of(path: str, subpackage: str):
    """The class's ``options_check`` as the fast check finds it (from the source, nothing imported)."""
    found = config_check.class_signature(path, subpackage)
    assert found is not None and found.options_check, path
    module, _, function = found.options_check.partition(":")
    return getattr(importlib.import_module(module), function)


def as_the_fast_check(path: str, subpackage: str, options: dict) -> dict:
    """The check function's arguments as the fast check builds them: the class's literal defaults read from its
    source (``config_check.NO_DEFAULT``: none), then the ``options`` given."""
    params = inspect.signature(check_of(path, subpackage)).parameters
    source = config_check.class_signature(path, subpackage).params
    given = {k: p.default for k, p in source.items() if k in params and p.default is not config_check.NO_DEFAULT}
    return given | {k: v for k, v in options.items() if k in params}


def imported(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_option_check_imports_nothing_heavy():
    modules = sorted({check_of(*c).__module__ for c in CHECKED})
    assert len(modules) == 9, modules
    code = (
        "import sys\n"
        f"for m in {modules!r}: __import__(m)\n"
        "print(' '.join(m for m in ('torch', 'lightning', 'transformers', 'numpy') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "", (proc.stdout, proc.stderr[-2000:])
    # the control: one module that does import torch is seen
    proc = subprocess.run(
        [sys.executable, "-c", code.replace(repr(modules), repr(["lit_svd.linalg"]))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "torch" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("name,subpackage", CHECKED, ids=[c[0].rpartition(".")[2] for c in CHECKED])
def test_a_check_takes_the_constructors_options_with_its_defaults(name, subpackage):
    """A default that differed would judge an option the user did not give by a value the module never uses
    (None in the check: not given, not judged)."""
    cls = imported(name)
    params = {}
    for klass in reversed(cls.__mro__):  # a subclass passes **loading on to its base
        if "__init__" in vars(klass) and klass.__module__.startswith("lit_svd"):
            params |= inspect.signature(klass.__init__).parameters
    for p in inspect.signature(check_of(name, subpackage)).parameters.values():
        if p.name in MODEL_FACTS and p.name not in params:
            continue
        assert p.name in params, f"{name}: the check takes {p.name!r}, which the constructor does not"
        if p.default is inspect.Parameter.empty:  # the fast check passes the constructor's own default
            assert params[p.name].default is not inspect.Parameter.empty, (name, p.name)
        elif p.default is not None:
            assert p.default == params[p.name].default, (name, p.name, p.default, params[p.name].default)


@pytest.mark.parametrize("name,subpackage", CHECKED, ids=[c[0].rpartition(".")[2] for c in CHECKED])
def test_the_defaults_read_from_the_source_are_the_constructors(name, subpackage):
    """What the fast check passes for an option not given (a literal default read from the source without importing
    the class) is the constructor's default; the toy check, whose options have no defaults of their own, needs it."""
    source = config_check.class_signature(name, subpackage).params
    real = inspect.signature(imported(name).__init__).parameters
    read = {k: p.default for k, p in source.items() if p.default is not config_check.NO_DEFAULT and k in real}
    assert read, name
    for key, value in read.items():
        default = real[key].default
        same = value == default or isinstance(value, (list, tuple)) and tuple(value) == tuple(default)
        assert same, (name, key, value, default)


# one bad option per class: the constructor's error is the fast check's line
CONSTRUCTED = [
    ("ToyAlignmentModule", {"importance_decay": 2.0}, "importance_decay=2.0: must lie in (0, 1]"),
    ("ToyAlignmentModule", {"grid": {"d_model": [4]}, "d_model": [4, 5]}, "d_model is given as a list and by grid"),
    ("LanguageModelModule", {"n_heads": 3}, "model.d_model=128 is not divisible by model.n_heads=3"),
    ("MountsAnalysisModule", {"fit_fraction": 1.5}, "fit_fraction=1.5 is not allowed"),
    ("MountsAnalysisModule", {"sites": ["qq"]}, "sites='qq' is unknown; choose one of q, k"),
    ("DirectionCheckModule", {"run": "nowhere", "n_random": 1}, "n_random=1: the null needs at least 2"),
    ("DirectionCheckModule", {"run": "nowhere"}, "run='nowhere': not a folder"),
    ("FineTuneLMModule", {"trainable": "heads"}, "model.trainable='heads' is unknown"),
    ("TaskDataModule", {"n_test": -1}, "n_test=-1 is invalid; give a non-negative integer"),
    ("TaskDataModule", {"task": "ioj"}, "task='ioj' is unknown; choose one of ioi, gp, gt"),
    ("TextDataModule", {"path": "no/such.txt"}, "path='no/such.txt' does not exist"),
    ("TextDataModule", {"n_tokens": 0}, "n_tokens, val_tokens and test_tokens are all 0"),
    ("SparseFeatureDataModule", {"p": [0.1, 1.5]}, "p=[0.1, 1.5]: every activation probability must lie"),
    ("CircuitGraphModule", {"rel_gap": 1.5}, "rel_gap=1.5 is invalid; the relative gap between blocks"),
    ("DirectionMaskModule", {"alpha": -0.1}, "alpha=-0.1 is invalid; the L1 weight must be"),
    ("DirectionMaskModule", {"alpha": 0.0, "alpha_final": 1e-3}, "alpha_final=0.001 is invalid with alpha=0.0"),
    ("DirectionMaskModule", {"loss": "mse"}, "loss='mse' is unknown; choose one of kl, metric"),
    ("DirectionMaskModule", {"init": 1.0}, "init=1.0 is invalid; the initial mask value"),
    ("DirectionMaskModule", {"threshold": 0.0}, "threshold=0.0 is invalid; the kept threshold"),
    ("DirectionMaskModule", {"ablation": "mean"}, "ablation='mean' is unknown; choose one of zero, patch"),
    ("DirectionMaskModule", {"positions": "last"}, "positions='last' is unknown; choose one of answer, all"),
    ("DirectionMaskModule", {"mask_unit": "head"}, "mask_unit='head' is unknown; choose one of direction, block"),
    ("DirectionMaskModule", {"rel_gap": -0.1}, "rel_gap=-0.1 is invalid; the relative gap between blocks"),
    ("DirectionMaskModule", {"layers": ["x"]}, "layers: layer 'x' is not an integer"),
    ("DirectionMaskModule", {"steps_per_batch": 0}, "steps_per_batch=0 is invalid; give an integer >= 1"),
    ("DirectionMaskModule", {"lr": 0.5, "lr_min": 0.9}, "lr_min=0.9 is invalid; give a number in [0, lr=0.5]"),
    ("DirectionMaskModule", {"soft_steps": -1}, "soft_steps=-1 is invalid; give an integer >= 0"),
    ("FaithfulnessModule", {"methods": []}, "methods=[]: give at least one of eap_ig, eap"),
    ("FaithfulnessModule", {"methods": ["nap"]}, "methods: 'nap' unknown; allowed: eap_ig, eap"),
    ("FaithfulnessModule", {"methods": ["mask"]}, "methods has 'mask' but mask_run is null"),
    ("FaithfulnessModule", {"methods": ["graph_mlp"]}, "methods has 'graph_mlp' but graph_run is null"),
    ("FaithfulnessModule", {"methods": ["random"], "random_seeds": []}, "methods has 'random' but random_seeds"),
    ("FaithfulnessModule", {"sizes": [0.5, 0.1]}, "sizes=[0.5, 0.1]: give fractions in (0, 1], strictly"),
    ("FaithfulnessModule", {"attribution_split": "test"}, "attribution_split='test' is unknown; choose one of"),
    ("FaithfulnessModule", {"ig_path": "nodes"}, "ig_path='nodes' is unknown; choose one of joint, layer"),
    ("FaithfulnessModule", {"attribution_prompts": 0}, "attribution_prompts=0: give at least 1"),
    ("FaithfulnessModule", {"ig_steps": 0}, "ig_steps=0: give at least 1 (1 is plain EAP)"),
    ("FaithfulnessModule", {"layers": [0.5]}, "layers: layer 0.5 is not an integer"),
    ("FaithfulnessModule", {"mask_run": "nowhere"}, "mask_run='nowhere': not a folder; give the folder of a"),
    ("FaithfulnessModule", {"graph_run": "nowhere"}, "graph_run='nowhere': not a folder; give the folder of a"),
]


@pytest.mark.parametrize("name,options,message", CONSTRUCTED)
def test_the_constructor_fails_with_the_fast_checks_line(name, options, message):
    name, subpackage = next(c for c in CHECKED if c[0].endswith(f".{name}"))
    cls = imported(name)
    with pytest.raises(ValueError) as from_constructor:
        cls(**options)
    with pytest.raises(ValueError) as from_check:
        check_of(name, subpackage)(**as_the_fast_check(name, subpackage, options))
    assert str(from_constructor.value) == str(from_check.value)
    assert str(from_check.value).startswith(message) and "\n" not in str(from_check.value), str(from_check.value)


BOUNDED = [
    ("MountsAnalysisModule", {}),
    ("DirectionMaskModule", {}),
    ("FaithfulnessModule", {"methods": ["random"]}),
]


@pytest.mark.parametrize("name,options", BOUNDED, ids=[b[0] for b in BOUNDED])
def test_layers_are_bounded_by_the_model_after_loading_too(name, options):
    """The Python way in (no config.json read): the constructor checks ``layers`` against the loaded model, in the
    fast check's words."""
    name, subpackage = next(c for c in CHECKED if c[0].endswith(f".{name}"))
    with pytest.raises(ValueError) as loaded:
        imported(name)(model="tiny-llama", layers=[2], dtype="float64", **options)
    with pytest.raises(ValueError) as fast:
        check_of(name, subpackage)(layers=[2], n_layers=2, **options)
    assert str(loaded.value) == str(fast.value) == "layers: layer 2 is out of range; the model has 2 layers (0..1)"


def test_a_valid_configuration_passes_every_check():
    """The control of the cases above: each check accepts the defaults (the constructor's, as the fast check passes
    them)."""
    for name, subpackage in CHECKED:
        check_of(name, subpackage)(**as_the_fast_check(name, subpackage, {}))


def test_the_fast_checks_task_names_are_the_tasks_built():
    from lit_svd.data_options import TASK_NAMES
    from lit_svd.datamodules.tasks import TASKS

    assert tuple(TASKS) == TASK_NAMES
