"""Two shipped configs alone and side by side: does each keep its speed per core when it shares the machine?

    python bench/threads_bench.py            # SAD (configs/sad/smollm2_ioi.yaml) beside mounts (4 layers, 4,096 tokens)
    python bench/threads_bench.py --control  # and the same pair at torch's old default, every core each

Each command runs as ``python -m lit_svd test ...`` with no thread setting (``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` removed from its environment), so the default of ``lit_svd.threads`` decides: alone a run
takes every core, side by side each takes its share. Printed per run: wall seconds alone and side by side, CPU
seconds, and **time per core**: side by side a run has ``cores / 2`` cores, alone it had ``cores``, so its time
per core side by side against alone is ``wall_side / (2 * wall_alone)`` (target <= 1.3: sharing costs at most
30 % over an even split of the machine). ``--control`` repeats the side-by-side pair with ``--threads <cores>``
each (torch's default before: both runs on every core), the case the default exists to avoid. The runs count each
other through a registry folder of the bench's own (``LIT_SVD_RUNS``), so other lit_svd runs on the machine do not
change what this bench measures; measure on a quiet machine (the conditions are printed).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conditions import report_conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAD = "test --config configs/sad/smollm2_ioi.yaml"
MOUNTS = (
    "test --config configs/mounts/smollm2_wikitext.yaml --data.init_args.test_tokens=4096"
    " --model.init_args.layers=[0,1,2,3]"
)
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_together(commands: list[list[str]], env: dict, logs: Path) -> list[tuple[float, float, int]]:
    """Start every command at once; ``(wall s, CPU s, return code)`` of each, from the start to its exit (its
    output in ``logs``/<i>.log, the last lines printed when it fails)."""
    logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    started: dict[int, subprocess.Popen] = {}
    out: dict[int, tuple[float, float, int]] = {}
    try:
        for i, c in enumerate(commands):
            with open(logs / f"{i}.log", "w") as log:
                started[i] = subprocess.Popen(c, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        index = {p.pid: i for i, p in started.items()}
        while len(out) < len(commands):
            pid, status, usage = os.wait4(-1, 0)
            if pid in index:
                code = os.waitstatus_to_exitcode(status)
                started[index[pid]].returncode = code  # reaped here: Popen must not wait for it again
                out[index[pid]] = (time.monotonic() - start, usage.ru_utime + usage.ru_stime, code)
                if code:
                    print((logs / f"{index[pid]}.log").read_text()[-2000:], file=sys.stderr)
    finally:  # interrupted: the runs do not outlive the bench
        for i, p in started.items():
            if i not in out:
                p.kill()
    return [out[i] for i in range(len(commands))]


def command(args: str, root: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lit_svd",
        *shlex.split(args),
        "--trainer.default_root_dir",
        str(root),
        *QUIET,
        *extra,
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", default=SAD, help=f"first run's arguments after `python -m lit_svd` (default: {SAD})")
    p.add_argument("--b", default=MOUNTS, help=f"second run's arguments (default: {MOUNTS})")
    p.add_argument("--control", action="store_true", help="also side by side with --threads <cores> each")
    args = p.parse_args()
    n = cores()
    report_conditions(f"{n} cores; runs counted in the bench's own registry")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.setdefault("PYTHONPATH", str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        env["LIT_SVD_RUNS"] = str(Path(tmp) / "registry")
        pair = [args.a, args.b]
        work = Path(tmp)
        alone = [
            run_together([command(a, work / f"alone_{i}", [])], env, work / f"logs_alone_{i}")[0]
            for i, a in enumerate(pair)
        ]
        side = run_together([command(a, work / f"side_{i}", []) for i, a in enumerate(pair)], env, work / "logs_side")
        rows = [("default", alone, side)]
        if args.control:
            fixed = [f"--threads={n}"]
            runs = [command(a, work / f"control_{i}", fixed) for i, a in enumerate(pair)]
            control = run_together(runs, env, work / "logs_control")
            rows.append((f"--threads {n} each", alone, control))
    for label, ref, got in rows:
        print(f"\nside by side, {label}:")
        for name, (wa, ca, ra), (ws, cs, rs) in zip(pair, ref, got):
            if ra or rs:
                print(f"  {name}: FAILED (return codes {ra} alone, {rs} side by side)")
                continue
            print(
                f"  {name}\n    alone {wa:.1f} s wall ({ca:.1f} s CPU), side by side {ws:.1f} s wall ({cs:.1f} s CPU):"
                f" {ws / wa:.2f}x the wall time, time per core {ws / (2 * wa):.2f}x alone (target <= 1.3)"
            )


if __name__ == "__main__":
    main()
