"""Torch's CPU threads, chosen in one place: runs that share a machine share its cores.

A run given ``--threads N`` (a config's top-level ``threads: N``, the API's ``threads=N``) or started with
``OMP_NUM_THREADS`` set uses that many threads. Otherwise it takes its share of the cores: ``max(1, cores //
runs)``, where ``runs`` counts the lit_svd runs alive on this machine (itself included) and ``cores`` the cores
this process may use. Runs register here while they run (``Registry``: one file per process in ``$LIT_SVD_RUNS``,
default ``<tmp>/lit_svd-runs-<uid>``), and ``lit_svd.callbacks.threads.ThreadShare`` re-reads the count as batches
go, so a run started beside another (a second command, the report's ``--jobs 2``, a DDP rank) drops to its share and
a run left alone takes the cores back. Other programs are not counted: give ``--threads`` when they run beside.

Why: two runs of torch's default (every core each) on two cores took 657 s for a SAD run that takes 70 s with one
thread per process (OpenMP threads wait for a core their peer holds); docs/guide.md, "Threads".
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ENV = "LIT_SVD_RUNS"


def usable_cores() -> int:
    """The cores this process may run on (its affinity; ``os.cpu_count()`` where the system has none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def fair_share(cores: int, runs: int) -> int:
    """Threads of one of ``runs`` runs sharing ``cores`` cores: an equal share, at least one."""
    return max(1, cores // max(1, runs))


def fixed_threads(threads: int | None) -> int | None:
    """The thread count a run was given: ``threads``, else ``OMP_NUM_THREADS``; None: it shares the cores."""
    if threads is not None:
        return threads
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class Registry:
    """The lit_svd runs alive on this machine: one empty file per process, named by its pid."""

    def __init__(self, folder: str | os.PathLike | None = None):
        default = Path(tempfile.gettempdir()) / f"lit_svd-runs-{os.getuid() if hasattr(os, 'getuid') else 0}"
        self.folder = Path(folder or os.environ.get(ENV) or default)

    def register(self, pid: int | None = None) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / str(pid or os.getpid())).touch()

    def unregister(self, pid: int | None = None) -> None:
        (self.folder / str(pid or os.getpid())).unlink(missing_ok=True)

    def runs(self) -> int:
        """Runs registered and alive (files of processes that ended are removed)."""
        if not self.folder.is_dir():
            return 0
        count = 0
        for path in self.folder.iterdir():
            if not path.name.isdigit():
                continue
            if alive(int(path.name)):
                count += 1
            else:
                path.unlink(missing_ok=True)
        return count

    def share(self, cores: int | None = None) -> int:
        """This run's threads now: ``fair_share`` of the cores over the runs alive (this one counted once)."""
        me = (self.folder / str(os.getpid())).exists()
        return fair_share(cores or usable_cores(), self.runs() + (0 if me else 1))
