"""`python -m lit_svd fit|validate|test|predict --config FILE.yaml` (LightningCLI).

Model and data are given by class_path: any LightningModule / LightningDataModule importable by
path, the package's own by short name (``ToyAlignmentModule``) or full path.
"""
from __future__ import annotations

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI


def one_line_error(message: str) -> str:
    """jsonargparse's nested, multi-line parse error reduced to one line: the key and the innermost cause."""
    lines = [ln.strip().lstrip("- ").strip() for ln in message.splitlines() if ln.strip()]
    causes = [ln for ln in lines if any(s in ln for s in ("not accepted", "not expected", "Unrecognized",
                                                         "does not accept", "No action for key"))]
    if not causes:
        return " ".join(lines)
    key = lines[0].removeprefix("Parser key ").rstrip(":").strip("\"") if lines[0].startswith("Parser key") else ""
    where = next((ln.split("'")[1] for ln in lines if "class_path '" in ln), "")
    return f"{key + ': ' if key else ''}{causes[0]}{f' by {where}' if where else ''}"


class OneLineErrorParser(LightningArgumentParser):
    """Parse errors as one line (after the --help tip) instead of the usage block and a nested report."""

    def print_usage(self, file=None) -> None:  # the --help tip and the one-line error say enough
        pass

    def error(self, message: str, ex: Exception | None = None):
        super().error(one_line_error(message), ex)


def main(args: list[str] | None = None) -> LightningCLI:
    # register the package's classes so that short class_path names resolve
    import lit_svd.callbacks  # noqa: F401
    import lit_svd.datamodules  # noqa: F401
    import lit_svd.modules  # noqa: F401

    return LightningCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_class=OneLineErrorParser,
        save_config_kwargs={"overwrite": True},
        args=args,  # None: the command line
    )


if __name__ == "__main__":
    main()
