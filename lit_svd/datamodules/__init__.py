"""LightningDataModules: toy feature streams, task prompts, text streams."""

from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.datamodules.text import TextDataModule
from lit_svd.datamodules.toy import SparseFeatureDataModule

__all__ = ["SparseFeatureDataModule", "TaskDataModule", "TextDataModule"]
