"""The LightningCLI behind ``python -m lit_svd`` (imported by ``cli.main`` once the fast check has passed).

``LitSVDCLI`` builds the data module before the model (data-config errors do not wait for a model load),
applies ``--threads`` (without it, the run takes its share of the cores: ``lit_svd.threads``), warns when CPU
processes oversubscribe the cores, checks model and tokenizer names before anything loads, resolves
``--ckpt_path last`` and adds the step progress bar.
``OneLineErrorParser`` prints parse errors in the two-line form of ``lit_svd.errors``. ``lightning_cli`` runs
it (for ``cli.main`` and the API's ``run_cli``); ``is_user_error`` tells an error a user fixes from a bug.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_svd import PROG
from lit_svd.errors import ConfigError, debug, one_line_error, quiet, root_error, user_message
from lit_svd.registry import experiments
from lit_svd.threads import fixed_threads


def lightning_cli(args: list[str] | None, **parser_kwargs) -> LitSVDCLI:
    """Run the LightningCLI on ``args`` (the arguments after the program name; None: ``sys.argv``), the package's
    modules and data modules known by short name (callbacks by their full class path, as every config gives them).
    ``args`` are run as the process's command line (``sys.argv`` for the duration): the result's provenance
    records them, a DDP launch re-runs them, and LightningCLI does not warn about ``args`` beside ``sys.argv``."""
    import lit_svd.datamodules  # noqa: F401  (register the package's classes: short class_path names resolve)
    import lit_svd.modules  # noqa: F401

    argv = sys.argv
    if args is not None:
        sys.argv = [argv[0] if argv else PROG, *args]
    try:
        return LitSVDCLI(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            parser_class=OneLineErrorParser,
            save_config_kwargs={"overwrite": True},
            parser_kwargs=parser_kwargs,
        )
    finally:
        sys.argv = argv


def run_cli(args: list[str]) -> Path:
    """Run ``python -m lit_svd ARGS`` in this process and return the run folder (the Python API's and the report's
    way to run a method). A configuration error raises ValueError (FileNotFoundError for a missing file) in one
    line, the CLI's message. While it runs, ``sys.argv`` is that command line (``PROG ARGS``), so the result's
    provenance records the command that reproduces it. One process: a multi-device (DDP) run is the command
    line's (Lightning relaunches ``sys.argv``)."""
    import warnings

    from jsonargparse import ArgumentError

    from lit_svd.output import run_dir

    argv, sys.argv = sys.argv, [PROG]  # the provenance's command: PROG ARGS, the CLI command that reproduces it
    with warnings.catch_warnings():
        if not debug():
            quiet()
        try:
            cli = lightning_cli(list(args), exit_on_error=False)
        except ArgumentError as err:
            if debug():
                raise
            raise ValueError(one_line_error(str(err))) from None
        except Exception as err:
            if debug() or not is_user_error(err):
                raise
            message = user_message(err)[0].removeprefix("error: ")
            kind = FileNotFoundError if isinstance(root_error(err), FileNotFoundError) else ValueError
            raise kind(message) from err
        finally:
            sys.argv = argv
    return run_dir(cli.trainer)


def is_user_error(err: BaseException) -> bool:
    """Errors a user fixes by changing the configuration or the input (else: a traceback, a bug)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lit_svd.models.loading import ModelUnavailableError

    return isinstance(
        root_error(err),
        (ValueError, ModelUnavailableError, MisconfigurationException, FileNotFoundError, FloatingPointError),
    )


# --- checks before anything is built -----------------------------------------------------------------------
def check_names(cfg) -> None:
    """Model and tokenizer names that cannot be had fail before anything is built (offline: no network); the name
    of a model object in use (the Python API's ``m.sad(...)``, ``models.loaded.using``) stands for it."""
    from lit_svd.model_names import check_available
    from lit_svd.models.loading import in_use

    for group, key in (("model", "model"), ("data", "tokenizer")):
        args = (cfg.get(group) or {}).get("init_args") or {}
        name = args.get(key) if hasattr(args, "get") else None
        if isinstance(name, str) and in_use(name) is None:
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
    """The LightningCLI's epilog: the shipped experiments (``registry.experiments``) and how to run them."""
    return "\n".join(
        [
            f"experiments (run one as: {PROG} <subcommand> --config <path>; any key can be overridden):",
            *experiments(),
            "",
            "subcommands: fit (train, then report), validate, test (analyse a frozen model), predict.",
            f"`{PROG} fit --help` lists every option; `{PROG} fit --model.help CLASS` one module's arguments;",
            "--debug (or LIT_SVD_DEBUG=1) shows tracebacks; --threads N sets torch's CPU threads.",
        ]
    )


class RawEpilogFormatter(DefaultHelpFormatter):
    """Keeps the epilog's lines (the experiment table) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "".join(indent + line for line in text.splitlines(keepends=True))


# --- the CLI ---------------------------------------------------------------------------------------------
class OneLineErrorParser(LightningArgumentParser):
    """Parse errors as one line instead of the usage block and a nested report."""

    def print_usage(self, file=None) -> None:  # the one-line error says enough
        pass

    def error(self, message: str, ex: Exception | None = None):
        if debug() or not self.exit_on_error:  # nested parsers raise; the outermost one reports
            super().error(message, ex)
        print(f"error: {one_line_error(message)}", file=sys.stderr)
        print(
            f"hint: `{self.prog.replace(' [options]', '')} --help` lists every option; --debug shows the details",
            file=sys.stderr,
        )
        sys.exit(2)


class LitSVDCLI(LightningCLI):
    def init_parser(self, **kwargs) -> LightningArgumentParser:
        kwargs.setdefault("prog", PROG)
        kwargs.setdefault("description", "Singular-vector interpretability experiments (LightningCLI).")
        kwargs.setdefault("epilog", experiments_help())
        kwargs.setdefault("formatter_class", RawEpilogFormatter)
        return super().init_parser(**kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--threads",
            type=int | None,
            default=None,
            help="torch CPU threads for this run (null: OMP_NUM_THREADS, else this run's share of the cores:"
            " cores // lit_svd runs alive, re-read as runs start and end; lit_svd.threads)",
        )
        # data before model: jsonargparse instantiates groups of equal depth in the order they were added
        actions = parser._actions
        dests = [a.dest for a in actions]
        if "data" in dests and "model" in dests and dests.index("data") > dests.index("model"):
            actions.insert(dests.index("model"), actions.pop(dests.index("data")))

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        threads = cfg.get("threads")
        if threads is not None and threads < 1:
            raise ConfigError(f"threads={threads}: must be a positive integer or null")
        self.fixed_threads = fixed_threads(threads)  # None: the run shares the cores (lit_svd.threads)
        if self.fixed_threads is not None:
            import torch

            torch.set_num_threads(self.fixed_threads)
        warn_oversubscription(cfg.get("trainer", {}))
        check_names(cfg)
        check_module_config(cfg)
        if self.subcommand in ("fit", "validate", "test", "predict") and cfg.get("ckpt_path") == "last":
            cfg["ckpt_path"] = str(last_checkpoint(cfg.get("trainer", {}).get("default_root_dir")))

    def instantiate_trainer(self, **kwargs):
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        try:
            return super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError) as err:  # Lightning names the option without its group
            raise ConfigError(f"trainer: {user_message(err)[0].removeprefix('error: ')}") from err

    def _instantiate_trainer(self, config: dict, callbacks: list):
        from lightning.pytorch.callbacks import ProgressBar

        from lit_svd.progress import StepProgressBar

        given = list(config.get("callbacks") or []) + list(callbacks)
        if config.get("enable_progress_bar", True) is not False and not any(isinstance(c, ProgressBar) for c in given):
            callbacks = [*callbacks, StepProgressBar()]
        if getattr(self, "fixed_threads", None) is None:
            from lit_svd.callbacks.threads import ThreadShare

            callbacks = [*callbacks, ThreadShare()]
        return super()._instantiate_trainer(config, callbacks)
