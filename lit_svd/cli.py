"""`python -m lit_svd fit|validate|test|predict --config FILE.yaml` (LightningCLI).

Model and data are given by class_path: any LightningModule / LightningDataModule importable by
path, the package's own by short name (``ToyAlignmentModule``) or full path.

What a user sees is decided here: a configuration error ends the run before any model loads, in at
most two lines on stderr (the message, then a hint; ``lit_svd.errors``), exit code 2; ``--debug`` (or
``LIT_SVD_DEBUG=1``) shows the full traceback instead. Errors readable from the command line alone (types,
choices, unknown keys, model and tokenizer names) end the run before torch or Lightning is imported
(``lit_svd.config_check``, about a second); the LightningCLI itself lives in ``cli_lightning`` and builds the
data module before the model, so that data-config errors do not wait for a model load. ``--threads N``
(or a top-level ``threads: N`` in a config) is the one place that sets torch's CPU threads. ``--ckpt_path
last`` resumes the newest ``last.ckpt`` under the run's ``default_root_dir``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from pathlib import Path

from jsonargparse import DefaultHelpFormatter

from lit_svd.errors import (  # noqa: F401  (the CLI's error helpers, re-exported)
    DEBUG_ENV,
    ConfigError,
    one_line_error,
    root_error,
    user_message,
)
from lit_svd.errors import debug as _debug

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PROG = "python -m lit_svd"


def check_names(cfg) -> None:
    """Model and tokenizer names that cannot be had fail before anything is built (offline: no network)."""
    from lit_svd.model_names import check_available

    for group, key in (("model", "model"), ("data", "tokenizer")):
        args = (cfg.get(group) or {}).get("init_args") or {}
        name = args.get(key) if hasattr(args, "get") else None
        if isinstance(name, str):
            check_available(name, key, args.get("revision"))


def _init_args(section) -> dict:
    args = (section or {}).get("init_args") if hasattr(section or {}, "get") else None
    if args is None:
        return {}
    return dict(args.as_dict() if hasattr(args, "as_dict") else args)


def check_module_config(cfg) -> None:
    """A module class may check its options against the model (its config, its tokenizer: not its weights) and
    the data before anything is built: ``check_config(model_args, data_args)`` (a static- or classmethod taking
    the ``init_args`` of ``model`` and ``data``), raising a one-line ValueError."""
    import importlib

    model = cfg.get("model") or {}
    path = model.get("class_path") if hasattr(model, "get") else None
    if not isinstance(path, str) or "." not in path:
        return
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return  # jsonargparse reports an unknown class itself
    check = getattr(cls, "check_config", None)
    if callable(check):
        check(_init_args(model), _init_args(cfg.get("data")))


def warn_oversubscription(trainer: dict) -> None:
    """One warning line when more CPU processes are asked for than there are cores (then the run goes on)."""
    devices, accelerator = trainer.get("devices", "auto"), str(trainer.get("accelerator", "auto"))
    devices = int(devices) if isinstance(devices, str) and devices.isdigit() else devices
    if accelerator not in ("cpu", "auto") or not isinstance(devices, int) or os.environ.get("LOCAL_RANK", "0") != "0":
        return  # (DDP workers re-run the command line: only the launching process warns)
    if accelerator == "auto":
        import torch

        if torch.cuda.is_available():
            return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if devices > cores:
        print(
            f"warning: trainer.devices={devices} CPU processes on {cores} cores oversubscribe the machine"
            f" (each step waits for the slowest); use --trainer.devices {cores} or fewer",
            file=sys.stderr,
        )


def last_checkpoint(root: str | os.PathLike | None) -> Path:
    """The newest ``last.ckpt`` of the runs under ``root`` (``--ckpt_path last``; None: ./lightning_logs)."""
    base = Path(root) if root else Path.cwd()
    found = sorted(
        base.glob("**/checkpoints/last*.ckpt" if root else "lightning_logs/*/checkpoints/last*.ckpt"),
        key=lambda p: p.stat().st_mtime,
    )
    if not found:
        raise ConfigError(
            f"ckpt_path=last: no checkpoints/last.ckpt under {str(base)!r}\n"
            "hint: resume with the same --trainer.default_root_dir as the interrupted run, or give a"
            " .ckpt path"
        )
    return found[-1]


def experiments_help() -> str:
    """One line per shipped config (configs/<method>/<name>.yaml): subcommand, path, its first comment sentence."""
    if not CONFIGS.is_dir():
        return ""
    lines = [f"experiments (run one as: {PROG} <subcommand> --config <path>; any key can be overridden):"]
    for method in sorted(p for p in CONFIGS.iterdir() if p.is_dir()):
        for cfg in sorted(method.glob("*.yaml")):
            text = cfg.read_text()
            about = next((ln.lstrip("# ").strip() for ln in text.splitlines() if ln.startswith("#")), "")
            about = re.split(r"\. | \(needs", about)[0].rstrip(".,")
            about = about if len(about) <= 72 else about[:69].rsplit(" ", 1)[0] + " ..."
            command = "fit " if "max_steps" in text else "test"
            lines.append(f"  {command} {cfg.relative_to(CONFIGS.parent)!s:<38} {about}")
    lines += [
        "",
        "subcommands: fit (train, then report), validate, test (analyse a frozen model), predict.",
        f"`{PROG} fit --help` lists every option; `{PROG} fit --model.help CLASS` one module's arguments;",
        "--debug (or LIT_SVD_DEBUG=1) shows tracebacks; --threads N sets torch's CPU threads.",
    ]
    return "\n".join(lines)


class RawEpilogFormatter(DefaultHelpFormatter):
    """Keeps the epilog's lines (the experiment table) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


# --- entry point ---------------------------------------------------------------------------------------
def quiet() -> None:
    """No adverts, deprecation notes or hardware banners: the run's own output and real warnings only."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings(
        "ignore",
        message=r".*(deprecated|Grad strides do not match|does not have many workers"
        r"|`isinstance\(treespec, LeafSpec\)`|Checkpoint directory .* exists).*",
    )
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.seed",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.accelerators.cuda",
    ):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(args: list[str] | None = None):
    """Run the command line (``args``: the arguments after the program name; None: ``sys.argv``). A
    configuration error found without Lightning (types, choices, unknown keys, names) ends the run before
    torch or Lightning is imported (``lit_svd.config_check``); everything else is LightningCLI's."""
    argv = sys.argv if args is None else list(args)  # the command line itself (None): edited in place, since
    if "--debug" in argv:  # DDP workers re-run it (and inherit the environment)
        argv[:] = [a for a in argv if a != "--debug"]
        os.environ[DEBUG_ENV] = "1"
    from lit_svd.config_check import check_command_line

    check_command_line(argv[1:] if args is None else argv)  # exits in two lines on an error it finds
    if not _debug():
        quiet()
    from lightning.pytorch import LightningDataModule, LightningModule

    # register the package's classes so that short class_path names resolve
    import lit_svd.callbacks  # noqa: F401
    import lit_svd.datamodules  # noqa: F401
    import lit_svd.modules  # noqa: F401
    from lit_svd.cli_lightning import LitSVDCLI, OneLineErrorParser

    try:
        return LitSVDCLI(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            parser_class=OneLineErrorParser,
            save_config_kwargs={"overwrite": True},
            args=None if args is None else argv,
        )
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:
        if _debug() or not _is_user_error(err):
            raise
        print("\n".join(user_message(err)), file=sys.stderr)
        sys.exit(2)
    finally:
        end_process_group()


def end_process_group() -> None:
    """Destroy the DDP process group, if one is up, before the interpreter exits (Lightning leaves it up; gloo's
    threads torn down at exit can abort a finished run: "terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _is_user_error(err: BaseException) -> bool:
    """Errors a user fixes by changing the configuration or the input (else: a traceback, a bug)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lit_svd.models.loading import ModelUnavailableError

    return isinstance(
        root_error(err),
        (ValueError, ModelUnavailableError, MisconfigurationException, FileNotFoundError, FloatingPointError),
    )


def __getattr__(name: str):
    """``LitSVDCLI`` and ``OneLineErrorParser`` live in ``cli_lightning`` (importing them imports Lightning)."""
    if name in ("LitSVDCLI", "OneLineErrorParser"):
        from lit_svd import cli_lightning

        return getattr(cli_lightning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
