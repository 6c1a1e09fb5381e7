"""Every process that starts a DDP process group ends it before it exits.

A two-process gloo run that exits with its group alive can abort at teardown ("terminate called without an active
exception", rc -6): gloo's worker threads and the TCP store are then torn down by the interpreter's finalisation
instead of ``destroy_process_group`` (pytorch/pytorch#190489). Lightning destroys NCCL groups at exit but not gloo
ones, so lit_svd does: ``python -m lit_svd`` (``cli.main``) and every DDP script of the tests end it in a
``finally`` (``cli.end_process_group``). This test reads the test scripts (files and inline script texts) that start
DDP and fails on one that does not."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DDP = re.compile(r"""strategy\s*=\s*["']ddp["']""")


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


def test_the_command_line_ends_the_group_it_ran():
    from lit_svd import cli

    source = Path(cli.__file__).read_text()
    assert re.search(r"finally:\s*\n\s*end_process_group\(\)", source)
