"""lit_svd: singular-vector interpretability of transformers, on PyTorch Lightning."""

__version__ = "0.1.0"
