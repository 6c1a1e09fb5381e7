"""lit_svd: singular-vector interpretability of transformers, on PyTorch Lightning."""

from pathlib import Path

__version__ = "0.2.0.dev0"
PROG = "python -m lit_svd"  # the command line's name in usage lines, hints and provenance
CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # the shipped configs: configs/<method>/<name>.yaml

# The Python API (lit_svd/api.py), imported on first use so that `import lit_svd` stays cheap:
# ls.sad, ls.masks, ls.mounts, ls.directions, ls.run, ls.load, ls.method and every method of api.METHODS.
_API = ("sad", "masks", "mounts", "directions", "run", "load", "method", "circuits", "METHODS")


def __getattr__(name: str) -> object:
    if name in _API:  # by name: the package itself (its __version__, read by every layer) sits in no layer
        import importlib

        return getattr(importlib.import_module("lit_svd.api"), name)
    raise AttributeError(f"module 'lit_svd' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
