"""LightningDataModules: toy feature streams, task prompts, text streams."""
from lit_svd.datamodules.toy import SparseFeatureDataModule  # noqa: E402,F401
from lit_svd.datamodules.tasks import TaskDataModule  # noqa: E402,F401
from lit_svd.datamodules.text import TextDataModule  # noqa: E402,F401
