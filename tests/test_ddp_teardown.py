"""Every process that starts a DDP process group ends it before it exits.

A two-process gloo run that exits with its group alive can abort at teardown ("terminate called without an active
exception", rc -6): the group is then destroyed during the interpreter's finalisation, when a gloo worker thread
(a C++ thread) that releases an object holding a Python reference must take the GIL; Python (3.11 here) ends such a
thread with ``pthread_exit``, whose forced unwinding through a ``noexcept`` C++ frame calls ``std::terminate``. It
depends on which thread releases the last reference when, hence once in many runs (pytorch/pytorch#190489 and
#179291 describe it). Ending the group while the interpreter is whole removes it: Lightning does so at exit for NCCL
groups but not for gloo ones, so lit_svd does: ``python -m lit_svd`` (``cli.main``) and every DDP script of the tests
end it in a ``finally`` (``cli.end_process_group``). This test reads the test scripts (files and inline script texts)
that start DDP and fails on one that does not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# a DDP trainer: the strategy written out, or the tests' factory given 2+ devices or a `devices` variable (its own
# ``strategy="ddp" if devices > 1`` is not a script)
DDP = re.compile(
    r"""strategy\s*=\s*["']ddp["'](?!\s+if)"""
    r"""|(?<!def )quiet_trainer\(\s*(?:devices\s*=\s*)?(?:[2-9]|devices\b)"""
)


def scripts_without_teardown(text: str) -> int:
    """How many DDP trainer calls in ``text`` are not followed by ``end_process_group()`` inside a ``finally``."""
    starts = [m.start() for m in DDP.finditer(text)]
    missing = 0
    for start in starts:
        after = text[start:]
        found = re.search(r"finally:\s*\n\s*end_process_group\(\)", after)
        if not found:
            missing += 1
    return missing


def test_every_ddp_script_of_the_tests_ends_its_process_group():
    offenders = {
        path.name: n
        for path in sorted(TESTS.glob("*.py"))
        if path.name != Path(__file__).name and (n := scripts_without_teardown(path.read_text()))
    }
    assert not offenders, f"DDP scripts that exit with a live process group: {offenders}"


def test_the_check_finds_a_script_that_leaves_its_group_alive():
    bare = 'trainer = pl.Trainer(devices=2, strategy="ddp")\ntrainer.fit(module)\n'
    ended = bare.replace("trainer.fit(module)\n", "try:\n    trainer.fit(module)\nfinally:\n    end_process_group()\n")
    assert scripts_without_teardown(bare) == 1 and scripts_without_teardown(ended) == 0
    by_factory = "trainer = quiet_trainer(2, folder)\ntrainer.fit(module)\n"
    assert scripts_without_teardown(by_factory) == 1


def test_the_command_line_ends_the_group_it_ran():
    from lit_svd import cli

    source = Path(cli.__file__).read_text()
    assert re.search(r"finally:\s*\n\s*end_process_group\(\)", source)


FINISHING_LATE = """
import os, socket, subprocess, sys, time
import torch, torch.distributed as dist
from lit_svd.cli import end_process_group

if "RANK" not in os.environ:  # rank 0 starts rank 1 on a free port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    rank1 = subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, **common, "RANK": "1"})
    os.environ.update(common, RANK="0")
dist.init_process_group("gloo")


class SlowToFinalise:  # the interpreter's finalisation takes 2 s (module teardown)
    def __del__(self, sleep=time.sleep):
        sleep(2)


slow = SlowToFinalise()
if os.environ["RANK"] == "1":
    time.sleep(1)  # joins rank 0's all_reduce late: it completes while rank 0 finalises
    dist.all_reduce(torch.ones(4))
    time.sleep(3)
else:
    dist.all_reduce(torch.ones(4), async_op=True).get_future().then(lambda f: f.value())
    if sys.argv[1] == "end":
        end_process_group()  # else rank 0 exits at once, its group alive and its all_reduce in flight
"""


@pytest.mark.slow
def test_a_group_alive_at_exit_aborts_and_ending_it_first_does_not(tmp_path):
    """The abort itself, made to happen every time: rank 0 exits while gloo work (with a Python callback) is in
    flight, so it completes during the interpreter's finalisation: "terminate called without an active exception",
    SIGABRT. With ``end_process_group()`` before exit the same run ends cleanly (the group drains its work while
    the interpreter is whole)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "finishing_late.py"
    script.write_text(FINISHING_LATE)
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1"}
    out = {}
    for mode in ("alive", "end"):
        try:
            done = subprocess.run(
                [sys.executable, str(script), mode], env=env, capture_output=True, text=True, timeout=60
            )
            out[mode] = (done.returncode, done.stderr)
        except subprocess.TimeoutExpired:  # a Python that parks such threads instead of ending them hangs here
            out[mode] = (None, "timeout")
    assert out["end"][0] == 0, out["end"][1][-2000:]
    assert out["alive"][0] != 0
    if out["alive"][0] is not None:
        assert out["alive"][0] == -6 and "terminate called without an active exception" in out["alive"][1]
