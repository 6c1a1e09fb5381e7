"""lit_svd: singular-vector interpretability of transformers, on PyTorch Lightning."""

__version__ = "0.2.0.dev0"
