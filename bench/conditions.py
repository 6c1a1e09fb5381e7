"""What a benchmark ran under, printed when it starts and when it ends.

Speed-ups measured while other jobs share the cores overstate or understate (each side slows by a different
factor), so every bench states the load, the cores and the threads next to its ratios; compare ratios only
between runs on a quiet machine (1-minute load average well below the number of cores).
"""

from __future__ import annotations

import atexit
import os
import platform


def conditions() -> str:
    import torch

    load = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    state = (
        "quiet" if load[0] < 0.25 * cores else "BUSY: other jobs share the cores, ratios are not quiet-machine figures"
    )
    return (
        f"load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min) on {cores} cores ({state});"
        f" torch {torch.__version__}, torch threads {torch.get_num_threads()}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; {platform.machine()}, Python {platform.python_version()}"
    )


def report_conditions(note: str = "") -> None:
    """Print the conditions now and again when the bench exits (``note``: what the line cannot see)."""
    print(f"conditions at start: {conditions()}{'; ' + note if note else ''}", flush=True)
    atexit.register(lambda: print(f"conditions at end:   {conditions()}", flush=True))
