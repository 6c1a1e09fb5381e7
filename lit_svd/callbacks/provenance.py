"""The provenance of a result written by a callback: the run's resolved config, its seeds and its device."""

from __future__ import annotations

import os
from typing import Any

from lit_svd.results.base import Provenance


def resolved_config(trainer, module) -> dict | None:
    """The run's configuration as LightningCLI resolved it (what config.yaml holds); outside the CLI, the
    module's and the data module's hyperparameters."""
    import yaml
    from lightning.pytorch.cli import SaveConfigCallback

    for cb in trainer.callbacks:
        if isinstance(cb, SaveConfigCallback):
            return yaml.safe_load(cb.parser.dump(cb.config, skip_none=False, skip_link_targets=False))
    config: dict[str, Any] = {"model": {"class_path": _class_path(module), "init_args": dict(module.hparams)}}
    dm = getattr(trainer, "datamodule", None)
    if dm is not None:
        config["data"] = {"class_path": _class_path(dm), "init_args": dict(getattr(dm, "hparams", {}) or {})}
    return config


def _class_path(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def run_seeds(trainer, module) -> dict:
    """The global seed (``seed_everything``), the module's ``seed`` and the data module's seeds, where set."""
    dm = getattr(trainer, "datamodule", None)
    hp = getattr(module, "hparams", {}) or {}
    seeds = {
        "global": int(os.environ["PL_GLOBAL_SEED"]) if "PL_GLOBAL_SEED" in os.environ else None,
        "model": hp.get("seed"),
        "data": getattr(dm, "seed", None),
        "data_order": getattr(dm, "order_seed", None),
    }
    return {k: v for k, v in seeds.items() if v is not None}


def provenance(trainer, module) -> Provenance:
    """``Provenance.collect`` for a result of this trainer and module."""
    return Provenance.collect(
        config=_plain(resolved_config(trainer, module)),
        seeds=run_seeds(trainer, module),
        device=getattr(module, "device", None),
    )


def _plain(obj: Any) -> Any:
    """Config values as JSON types (tuples to lists, paths and other objects to strings)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)
