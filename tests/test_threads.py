"""Threads chosen in one place (lit_svd/threads.py): a given count wins; otherwise each run takes an equal share of the
cores over the lit_svd runs alive, and a run's ``ThreadShare`` follows that count as runs start and end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lit_svd.callbacks.threads import ThreadShare
from lit_svd.threads import Registry, fair_share, fixed_threads


def test_fair_share_is_an_even_split_of_at_least_one():
    cases = [(cores, runs) for cores in (1, 2, 3, 16) for runs in (0, 1, 2, 3, 5, 40)]
    for cores, runs in cases:
        share = fair_share(cores, runs)
        assert share >= 1 and (share * max(runs, 1) <= cores or share == 1)  # never oversubscribes beyond one each
        assert share == max(1, cores // max(1, runs))
    assert [fair_share(16, r) for r in (1, 2, 3, 4)] == [16, 8, 5, 4]


def test_a_given_count_wins(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert fixed_threads(3) == 3 and fixed_threads(None) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert fixed_threads(None) == 2 and fixed_threads(5) == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert fixed_threads(None) is None


def test_the_registry_counts_live_processes_only(tmp_path):
    reg = Registry(tmp_path / "runs")
    assert reg.runs() == 0 and reg.share(4) == 4  # alone: every core
    reg.register()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reg.register(sleeper.pid)
        assert reg.runs() == 2 and reg.share(4) == 2 and reg.share(3) == 1
    finally:
        sleeper.kill()
        sleeper.wait()
    assert reg.runs() == 1 and not (tmp_path / "runs" / str(sleeper.pid)).exists()  # an ended run is removed
    reg.unregister()
    assert reg.runs() == 0


def test_thread_share_follows_the_runs_and_restores_the_count(tmp_path):
    found = torch.get_num_threads()
    reg = Registry(tmp_path / "runs")
    share = ThreadShare(every_s=0.0, registry=reg)
    share.cores = 4
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        share.setup(None, None, "test")
        assert (tmp_path / "runs" / str(os.getpid())).exists() and torch.get_num_threads() == 4
        reg.register(other.pid)  # a second run starts beside it
        share.on_test_batch_start(None, None, None, 0)
        assert torch.get_num_threads() == 2
        other.kill()
        other.wait()
        share.on_test_epoch_end(None, None)  # left alone: it takes the cores back
        assert torch.get_num_threads() == 4
    finally:
        other.kill()
        share.teardown(None, None, "test")
    assert torch.get_num_threads() == found and reg.runs() == 0


@pytest.mark.parametrize("env, expected", [({}, "ThreadShare"), ({"OMP_NUM_THREADS": "1"}, "fixed 1")])
def test_the_cli_shares_the_cores_unless_given_a_count(env, expected, tmp_path):
    """The command line's trainer has a ThreadShare exactly when no count is given (``OMP_NUM_THREADS``,
    ``--threads``)."""
    code = (
        "import lit_svd.callbacks, lit_svd.datamodules, lit_svd.modules\n"
        "from lightning.pytorch import LightningDataModule, LightningModule\n"
        "from lit_svd.callbacks.threads import ThreadShare\n"
        "from lit_svd.cli_lightning import LitSVDCLI\n"
        "cli = LitSVDCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,"
        " run=False, args=['--config', 'configs/toy/single_pair.yaml', '--threads=null'])\n"
        "share = [c for c in cli.trainer.callbacks if isinstance(c, ThreadShare)]\n"
        "print('ThreadShare' if share else f'fixed {cli.fixed_threads}')"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env, "PYTHONPATH": root, "LIT_SVD_RUNS": str(tmp_path)},
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == expected
