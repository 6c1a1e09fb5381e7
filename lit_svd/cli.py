"""`python -m lit_svd fit|validate|test|predict --config FILE.yaml` (LightningCLI).

Model and data are given by class_path: any LightningModule / LightningDataModule importable by
path, the package's own by short name (``ToyAlignmentModule``) or full path.
"""
from __future__ import annotations

import sys

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI


class LitSVDCLI(LightningCLI):
    """LightningCLI with the package's modules importable by short class name."""


def main(args: list[str] | None = None) -> LightningCLI:
    # register the package's classes so that short class_path names resolve
    import lit_svd.callbacks  # noqa: F401
    import lit_svd.datamodules  # noqa: F401
    import lit_svd.modules  # noqa: F401

    return LitSVDCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args if args is not None else sys.argv[1:],
    )


if __name__ == "__main__":
    main()
