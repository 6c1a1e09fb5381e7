"""lit_svd: singular-vector interpretability of transformers, on PyTorch Lightning."""

from pathlib import Path

__version__ = "0.2.0.dev0"
PROG = "python -m lit_svd"  # the command line's name in usage lines, hints and provenance
CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # the shipped configs: configs/<method>/<name>.yaml

# The Python API (lit_svd/api.py), imported on first use so that `import lit_svd` stays cheap: ls.model, ls.run,
# ls.load, ls.method, ls.report, ls.tool and ls.<method> for every method of the registry (lit_svd/registry.py).
_API = ("model", "Model", "run", "load", "method", "report", "tool")


def _methods() -> tuple[str, ...]:
    import importlib  # by name: the package itself (its PROG, read by every layer) sits in no layer

    methods = importlib.import_module("lit_svd.registry").METHODS
    return tuple(n for m in methods.values() for n in (m.name, *m.aliases))


def __getattr__(name: str) -> object:
    if name in _API or name in _methods():
        import importlib

        return getattr(importlib.import_module("lit_svd.api"), name)
    raise AttributeError(f"module 'lit_svd' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, *_methods()])
