"""examples/notebook.py (one model object, four methods) against the same four runs as CLI commands: wall time of
each way, and every results.json compared key by key (provenance and wall-time fields aside).

    python bench/notebook_bench.py [--model smollm2-135m] [--out runs/notebook_bench] [--threads 1]

The notebook runs first (one process: the model loaded once, its SVDs computed once), then the four commands,
one after the other (four processes, each loading the model and computing its SVDs), with the notebook's own
SETTINGS: ``lit_svd.commands.method_args`` writes each command from the same keywords the notebook passes. Both
ways write into the same folders (the CLI's runs are the next version), so the resolved configs agree too.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING_KEYS = ("train_wall_s", "wall_s", "timing", "directions_per_s", "probe_rows_per_s", "provenance")
CALLS = (("sad", "sad", "ioi"), ("masks", "masks_ioi", "ioi"), ("directions", "directions_ioi", None))
CALLS += (("circuits", "circuits_ioi", "ioi"),)


def measured(folder: Path, runs: dict[str, str]) -> dict:
    """results.json without provenance and wall times; the mask run's folder written as ``<mask run>``."""
    text = (folder / "results.json").read_text()
    for path, name in runs.items():
        text = text.replace(path, name)
    data = json.loads(text)
    return {k: v for k, v in data.items() if k not in TIMING_KEYS}


def notebook_settings() -> dict:
    """The notebook's SETTINGS (its first assignment: the full, not the tests', settings), read without running it."""
    tree = ast.parse((ROOT / "examples" / "notebook.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "SETTINGS")
    return ast.literal_eval(node.value)


def newest(folder: Path) -> Path:
    return max(folder.rglob("results.json"), key=lambda p: p.stat().st_mtime).parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default="runs/notebook_bench")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both ways")
    args = p.parse_args()
    out = Path(args.out).resolve()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    env |= {"LIT_SVD_EXAMPLE_MODEL": args.model, "LIT_SVD_EXAMPLE_OUT": str(out)}

    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "examples" / "notebook.py")], env=env, check=True, cwd=ROOT)
    notebook_s = time.perf_counter() - start
    by_notebook = {name: newest(out / name) for _, name, _ in CALLS}

    from lit_svd.commands import method_args

    settings = notebook_settings()
    cli_s, by_cli = {}, {}
    for method, name, task in CALLS:
        keys = {**settings[method], "out": out / name}
        if method == "masks":
            keys["max_time"] = None
        if method == "directions":
            keys["run"] = by_cli["masks_ioi"]
        command = [sys.executable, "-m", "lit_svd", *method_args(method, args.model, task, keys)]
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, cwd=ROOT)
        cli_s[name] = time.perf_counter() - start
        by_cli[name] = newest(out / name)
    runs = {str(by_notebook["masks_ioi"]): "<mask run>", str(by_cli["masks_ioi"]): "<mask run>"}
    same = {name: measured(by_notebook[name], runs) == measured(by_cli[name], runs) for _, name, _ in CALLS}
    total = sum(cli_s.values())
    report = {"model": args.model, "notebook_s": round(notebook_s, 1), "cli_s": cli_s, "cli_total_s": round(total, 1)}
    report |= {"ratio_cli_over_notebook": round(total / notebook_s, 2), "equal_results": same}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
