"""An interrupted mask run resumes with ``--ckpt_path last`` and ends exactly where an uninterrupted run ends.

A tiny random Llama model and the shipped SmolLM2 IOI config (smaller sizes; a checkpoint every 4 optimizer
steps). The interrupted run is killed (SIGKILL, no clean-up) as soon as its first checkpoint exists, in the
middle of an epoch; the resumed run must produce the same masks (bit for bit) and the same results.json as a
run that was never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    from lit_svd.models.loading import load_tokenizer
    from lit_svd.models.tiny import tiny_causal_lm

    folder = tmp_path_factory.mktemp("tiny_llama")
    tiny_causal_lm("llama").save_pretrained(folder)
    load_tokenizer("smollm2-135m").save_pretrained(folder)
    cfg = yaml.safe_load((ROOT / "configs/masks/smollm2_ioi.yaml").read_text())
    trainer = cfg["trainer"]
    trainer.update(max_steps=30, max_time=None)
    checkpoint = next(c for c in trainer["callbacks"] if c["class_path"].endswith("ModelCheckpoint"))
    assert checkpoint["init_args"]["save_last"] and cfg["trainer"]["enable_checkpointing"]  # shipped default
    checkpoint["init_args"]["every_n_train_steps"] = 4
    report = next(c for c in trainer["callbacks"] if c["class_path"].endswith("DirectionMaskReport"))
    report["init_args"]["trajectory_every"] = 4  # a trajectory point before the interruption, kept by the checkpoint
    cfg["model"]["init_args"].update(
        model=str(folder), lr=0.3, alpha=0.01, init=0.6, threshold=0.3, steps_per_batch=2, soft_steps=6
    )
    cfg["data"]["init_args"].update(tokenizer=str(folder), n_train=24, n_val=8, batch_size=8)  # 3 batches an epoch
    path = tmp_path_factory.mktemp("cfg") / "masks_tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch(config: Path, root: Path, *extra: str) -> subprocess.Popen:
    env = dict(
        os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1"
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lit_svd",
            "fit",
            "--config",
            str(config),
            "--trainer.default_root_dir",
            str(root),
            "--trainer.enable_progress_bar",
            "false",
            *extra,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]


def outputs(root: Path) -> tuple[dict, dict]:
    results = json.loads(next(root.rglob("results.json")).read_text())
    state = torch.load(next(root.rglob("masks.pt")))
    masks = {**state["lambdas"], **{f"last_kept {n}": t for n, t in state["last_kept"].items()}}  # the ranking's steps
    return results, masks


def test_killed_mask_run_resumes_to_the_same_masks_and_results(config, tmp_path):
    whole = launch(config, tmp_path / "whole")
    finish(whole)

    root = tmp_path / "interrupted"
    run = launch(config, root)
    deadline = time.time() + 600
    while not list(root.rglob("checkpoints/last.ckpt")) and run.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    run.send_signal(signal.SIGKILL)
    run.communicate()
    assert not list(root.rglob("results.json")), "the run finished before it could be interrupted"
    state = torch.load(next(root.rglob("checkpoints/last.ckpt")), weights_only=False)
    assert 0 < state["global_step"] < 30 and state["global_step"] % 6 != 0  # mid-epoch (6 steps an epoch)
    assert not any(k.startswith("lm.") for k in state["state_dict"])  # the frozen model is not saved

    resumed = launch(config, root, "--ckpt_path", "last")
    finish(resumed)

    res_whole, masks_whole = outputs(tmp_path / "whole")
    res_resumed, masks_resumed = outputs(root)
    assert masks_whole.keys() == masks_resumed.keys()
    for name in masks_whole:
        assert torch.equal(masks_whole[name], masks_resumed[name]), name
    assert res_resumed["steps"] == 30 and res_resumed["trajectory"][0]["step"] <= state["global_step"]
    timing = {"train_wall_s", "provenance"}  # wall-clock time and what ran (command, time): may differ
    assert res_whole.keys() == res_resumed.keys()
    assert {k: v for k, v in res_resumed.items() if k not in timing} == {
        k: v for k, v in res_whole.items() if k not in timing
    }
