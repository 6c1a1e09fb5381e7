"""The LightningCLI behind ``python -m lit_svd`` (imported by ``cli.main`` once the fast check has passed).

``LitSVDCLI`` builds the data module before the model (data-config errors do not wait for a model load),
applies ``--threads``, warns when CPU processes oversubscribe the cores, checks model and tokenizer names
before anything loads, resolves ``--ckpt_path last`` and adds the step progress bar.
``OneLineErrorParser`` prints parse errors in the two-line form of ``lit_svd.errors``.
"""

from __future__ import annotations

import sys

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lit_svd.cli import (
    PROG,
    RawEpilogFormatter,
    check_module_config,
    check_names,
    experiments_help,
    last_checkpoint,
    warn_oversubscription,
)
from lit_svd.errors import ConfigError, debug, one_line_error, user_message


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
            help="torch CPU threads for this run (null: OMP_NUM_THREADS, else torch's default);"
            " 1 is fastest on a shared machine",
        )
        # data before model: jsonargparse instantiates groups of equal depth in the order they were added
        actions = parser._actions
        dests = [a.dest for a in actions]
        if "data" in dests and "model" in dests and dests.index("data") > dests.index("model"):
            actions.insert(dests.index("model"), actions.pop(dests.index("data")))

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        threads = cfg.get("threads")
        if threads is not None:
            if threads < 1:
                raise ConfigError(f"threads={threads}: must be a positive integer or null")
            import torch

            torch.set_num_threads(threads)
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
        return super()._instantiate_trainer(config, callbacks)
