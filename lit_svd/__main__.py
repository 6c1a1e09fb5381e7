"""``lit-svd`` and ``python -m lit_svd``: the one way in (the same ``main``).

    lit-svd fit|validate|test|predict --config FILE.yaml [--key value ...]   the LightningCLI (``lit_svd.cli``)
    lit-svd report MODEL --out DIR [--quick] [--steps ...]                   every method on one model (``report``)
    lit-svd <tool> ...                                                       evaluate, mask-curve, ... (``cli_tools``)
    lit-svd --help                                                           all of it, at once (no torch)

Each subcommand is one door's ``main``, imported only when called; ``--help`` and an unknown subcommand are
answered here from the registry (``lit_svd.registry``), before torch or Lightning is imported.
"""

from __future__ import annotations

import sys
from textwrap import shorten

from lit_svd import PROG, __version__
from lit_svd.errors import fail
from lit_svd.registry import METHODS, TOOLS, experiments

LIGHTNING = {
    "fit": "train, then report (a config with trainer.max_steps)",
    "validate": "run the validation loop",
    "test": "analyse a frozen model, then report",
    "predict": "run the predict loop",
}


def usage() -> str:
    """The top-level help: the subcommands, the report, the tools, the Python API's methods and the experiments."""
    width = max(map(len, [*LIGHTNING, "report", *TOOLS])) + 2
    lines = [
        f"usage: {PROG} <subcommand> ...   (also: lit-svd <subcommand> ...)",
        "",
        "Singular-vector interpretability of transformers, on PyTorch Lightning.",
        "",
        "subcommands (`<subcommand> --help` for each one's options):",
        *(f"  {name:<{width}}{about}" for name, about in LIGHTNING.items()),
        f"  {'report':<{width}}every method on one model, resumable steps, DIR/index.html (report MODEL --out DIR)",
        *(f"  {name:<{width}}{about}" for name, about in TOOLS.items()),
        "",
        "methods (Python: m = lit_svd.model(NAME); m.<method>(...), or lit_svd.<method>(NAME, ...)):",
        *(f"  {name:<{width}}{shorten(m.summary, 118 - width, placeholder=' ...')}" for name, m in METHODS.items()),
        "",
        f"experiments ({PROG} <fit|test> --config <path>; any key can be overridden):",
        *experiments(),
        "",
        "--debug (or LIT_SVD_DEBUG=1) shows tracebacks; --threads N sets torch's CPU threads; docs/api.md, README.md.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None):
    """Dispatch ``argv`` (None: ``sys.argv[1:]``) to its door: the LightningCLI, the report or a tool."""
    args = sys.argv[1:] if argv is None else list(argv)
    first = args[0] if args else None
    if first in (None, "-h", "--help"):
        print(usage())
        return None
    if first == "--version":
        print(f"lit_svd {__version__}")
        return None
    if first == "report":
        from lit_svd.report import main as report

        return report(args[1:])
    if first in TOOLS:
        from lit_svd.cli_tools import main as tool

        return tool(args)
    if first in LIGHTNING or first.startswith("-"):
        from lit_svd.cli import main as lightning

        return lightning(None if argv is None else args)
    doors = ", ".join([*LIGHTNING, "report", *TOOLS])
    fail(f"{first!r} is not a subcommand", f"hint: subcommands: {doors}; `{PROG} --help` lists them")


if __name__ == "__main__":
    sys.argv[0] = PROG  # provenance records "python -m lit_svd ..." (a DDP launch re-runs -m lit_svd with argv[1:])
    main()
