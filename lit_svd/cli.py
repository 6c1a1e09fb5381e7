"""`lit-svd fit|validate|test|predict --config FILE.yaml` (LightningCLI): the LightningCLI's door of
``lit_svd.__main__`` (which also dispatches ``report`` and the tools).

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

import os
import sys

from lit_svd.errors import DEBUG_ENV, debug, quiet, user_message


# --- entry point ---------------------------------------------------------------------------------------
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
    if not debug():
        quiet()
    from lit_svd.cli_lightning import is_user_error, lightning_cli

    try:
        return lightning_cli(None if args is None else argv)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:
        if debug() or not is_user_error(err):
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


if __name__ == "__main__":
    main()
