"""The layer and no-circle contracts (pyproject's [tool.importlinter], run by `make lint`) hold, and they can fail:
the same check on a copy of the package where a bottom-layer module imports a reporter, or where a result imports
its figures inside a function (the circle results <-> figures that issue 34 removed), reports them broken."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True)


def test_the_package_keeps_its_layers():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def test_an_import_against_the_layers_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "lit_svd", tmp_path / "lit_svd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    linalg = tmp_path / "lit_svd" / "linalg.py"
    linalg.write_text(linalg.read_text() + "\nfrom lit_svd.callbacks import masks  # noqa: E402,F401\n")
    done = lint(tmp_path)
    assert done.returncode == 1
    assert "BROKEN" in done.stdout and "lit_svd.linalg -> lit_svd.callbacks.masks" in done.stdout


def test_a_result_importing_its_figures_breaks_both_contracts(tmp_path):
    shutil.copytree(ROOT / "lit_svd", tmp_path / "lit_svd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    base = tmp_path / "lit_svd" / "results" / "base.py"
    base.write_text(base.read_text() + "\n\ndef _late():\n    from lit_svd.figures import sad  # noqa: F401\n")
    done = lint(tmp_path)
    assert done.returncode == 1 and "0 kept, 2 broken" in done.stdout
    assert "lit_svd.results.base -> lit_svd.figures.sad" in done.stdout and ".results -> .figures" in done.stdout


def imports_of(package: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file (top level, in functions, under
    ``TYPE_CHECKING``): every import statement, as a reader of the code sees it."""
    import ast

    def name(path: Path) -> str:
        parts = path.relative_to(package.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            found = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            graph[module] |= {m for m in found if m in modules and m != module}
    return graph


def first_cycle(package: Path) -> list[str] | None:
    """An import circle among the package's modules (``a -> b -> a``), else None. Package ``__init__`` files that
    only re-export their submodules are left out."""
    graph = imports_of(package)
    inits = {m for m in graph if (package.parent / Path(*m.split(".")) / "__init__.py").is_file()}
    graph = {m: deps - inits for m, deps in graph.items() if m not in inits}
    state: dict[str, int] = {}

    def cycle_from(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*path, m, d]
            if d not in state and (found := cycle_from(d, [*path, m])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        cycle = None if m in state else cycle_from(m, [])
        if cycle:
            return cycle
    return None


def test_no_two_modules_of_the_package_import_each_other(tmp_path):
    """No import circle (a file importing, directly or not, a file that imports it; issue 34 found models/base and
    models/points), and the check finds one: a copy where ``linalg`` imports ``output`` lazily and ``output``
    imports ``linalg``."""
    cycle = first_cycle(ROOT / "lit_svd")
    assert cycle is None, " -> ".join(cycle)
    shutil.copytree(ROOT / "lit_svd", tmp_path / "lit_svd", ignore=shutil.ignore_patterns("__pycache__"))
    for a, b in (("linalg", "output"), ("output", "linalg")):
        path = tmp_path / "lit_svd" / f"{a}.py"
        path.write_text(path.read_text() + f"\n\ndef _late():\n    from lit_svd import {b}  # noqa: F401\n")
    assert first_cycle(tmp_path / "lit_svd") is not None
