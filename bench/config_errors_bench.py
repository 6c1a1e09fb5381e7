"""Wall and CPU time of a configuration error, one bad option per module and data module, run as a user runs it.

    PYTHONPATH=. python bench/config_errors_bench.py [--repeat 3] [--root CHECKOUT]

Each case is ``python -m lit_svd <args>`` in a fresh process (``HF_HUB_OFFLINE=1``, one thread); the table gives
the best wall of ``--repeat`` runs, its CPU, whether torch was imported by the end (a fast error imports nothing
heavy) and the error's first line. docs/api.md ("Bad input fails fast") holds the figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the cases are the test's (it imports its neighbours by name)
from test_way_in import MODULE_CASES  # noqa: E402

# the child reports at exit whether torch was imported
CHILD = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('TORCH\\n' if 'torch' in sys.modules else ''))\n"
    "sys.argv[0] = 'python -m lit_svd'\n"
    "from lit_svd.__main__ import main; main()"
)
# the cases of tests/test_way_in.py (one option per module and data module that its constructor alone judged before)
CASES = [(name, args) for name, args, _ in MODULE_CASES]


def run(args: list[str], root: Path = ROOT) -> tuple[float, float, bool, str, int]:
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("LIT_SVD_DEBUG", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    return wall, cpu, "TORCH" in proc.stderr.splitlines(), lines[0] if lines else proc.stderr[-200:], proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to time (e.g. main, for the before)")
    given = parser.parse_args()
    repeat, root = given.repeat, given.root.resolve()
    print(f"| case | wall (best of {repeat}) | CPU | torch imported | rc | first line |")
    print("|---|---|---|---|---|---|")
    for name, args in CASES:
        runs = [run(args, root) for _ in range(repeat)]
        wall, cpu, torch, first, rc = min(runs)
        print(f"| {name} | {wall:.2f} s | {cpu:.2f} s | {'yes' if torch else 'no'} | {rc} | `{first}` |", flush=True)


if __name__ == "__main__":
    main()
