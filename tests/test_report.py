"""``python -m lit_svd report`` on a tiny model with --quick: runs to the end and writes an offline index.html
with every step; a killed report resumes without redoing its finished step and ends with the same results; a
failing step is reported in two lines and the other steps still run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lit_svd.report import STEPS, Progress, State, select_steps, step_keys
from tests.helpers import ROOT

MODEL = "tiny-llama"
RUN_ONLY = ("created", "command", "git_commit", "git_dirty")


def report_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "lit_svd", "report", MODEL, "--out", str(out), "--quick", *extra]


def env() -> dict:
    shared = os.environ.get("LIT_SVD_SHARED") or str(ROOT.parent / "shared")
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "LIT_SVD_SHARED": shared,
    }


def run_report(out: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    if not (Path(env()["LIT_SVD_SHARED"]) / "data" / "wikitext-2" / "valid.txt").is_file():
        pytest.skip("the shared text (../shared/data/wikitext-2/valid.txt) is not present: the mounts step needs it")
    proc = subprocess.run(report_cmd(out, *extra), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def measured(out: Path, step: str) -> dict:
    """A finished step's results.json without what only says when and how it ran."""
    state = State.read(out / step)
    data = json.loads((out / state.run / "results.json").read_text().replace(str(out), "<out>"))
    for key in RUN_ONLY:
        data["provenance"].pop(key)
    data.pop("train_wall_s", None)
    data.pop("wall_s", None)
    data.pop("directions_per_s", None)
    data.pop("probe_rows_per_s", None)
    return data


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.images = set(), [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        if tag == "img":
            self.images.append(attrs["src"])


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("report")
    return out, run_report(out)


@pytest.mark.slow  # whole reports (tiny models) in subprocesses
def test_a_report_runs_every_step_and_writes_an_offline_index(full):
    out, proc = full
    for i, step in enumerate(STEPS):
        assert f"report [{i + 1}/{len(STEPS)}] {step.name}: started" in proc.stderr
    states = {s.name: State.read(out / s.name) for s in STEPS}
    assert states.pop("circuits_ioi").status in ("done", "skipped")  # done once configs/circuits/ has the config
    assert {n: s.status for n, s in states.items()} == {n: "done" for n in states}
    warned = [ln for ln in proc.stderr.splitlines() if "Warning" in ln or "warn(" in ln]
    assert not warned, warned  # no library warning on a normal run (Lightning's about `args` was one per step)
    text = (out / "index.html").read_text()
    assert "http://" not in text and "https://" not in text
    page = Page()
    page.feed(text)
    assert {s.name for s in STEPS} <= page.ids
    for name, state in states.items():
        results = os.path.relpath(out / state.run / "results.json", out)
        assert results in page.links, name
    for ref in page.links + page.images:
        if not ref.startswith(("#", "data:image/png;base64,")):
            assert (out / ref).is_file(), ref
    headline = {"sad": "sad_heatmap.png", "masks_ioi": "masks_kept_ov.png", "mounts": "mounts_lift_depth.png"}
    for name, png in headline.items():
        assert os.path.relpath(out / states[name].run / png, out) in page.images
    controls = [src for src in page.images if src.startswith("data:image/png")]
    assert len(controls) == 6  # sad, three mask runs, the direction check, mounts


@pytest.mark.slow  # whole reports (tiny models) in subprocesses
def test_a_killed_report_resumes_without_redoing_the_finished_step(full, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.Popen(
        report_cmd(out, "--steps", "sad,masks_ioi,directions_ioi"),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while (State.read(out / "sad") is None or State.read(out / "masks_ioi") is not None) and proc.poll() is None:
            assert time.monotonic() < deadline, "the first step did not finish in 10 min"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the report and anything it started
        proc.wait()
    first = State.read(out / "sad")
    assert first.status == "done" and State.read(out / "directions_ioi") is None
    done = out / first.run / "results.json"
    stamp = done.stat().st_mtime_ns, (out / "sad" / "step.json").stat().st_mtime_ns

    again = run_report(out, "--steps", "sad,masks_ioi,directions_ioi")
    assert "report [1/3] sad: done before, kept" in again.stderr
    assert (done.stat().st_mtime_ns, (out / "sad" / "step.json").stat().st_mtime_ns) == stamp
    assert len(list((out / "sad").rglob("results.json"))) == 1
    full_out, _ = full
    for step in ("sad", "masks_ioi", "directions_ioi"):
        assert measured(out, step) == measured(full_out, step), step


@pytest.mark.slow  # whole reports (tiny models) in subprocesses
def test_parallel_steps_give_the_results_of_the_sequential_report(full, tmp_path):
    """--jobs 2: two steps at once in their own processes; the direction check waits for the IOI mask run; every
    step's results equal the sequential report's (run-only fields aside) and each step leaves its log."""
    out = tmp_path / "report"
    proc = run_report(out, "--steps", "sad,masks_ioi,directions_ioi", "--jobs", "2")
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("report [")]
    started = [ln.split("]")[1].split(":")[0].strip() for ln in lines if "started" in ln]
    assert started == ["sad", "masks_ioi", "directions_ioi"], lines
    first_end = next(i for i, ln in enumerate(lines) if "masks_ioi: done" in ln)
    assert lines.index(next(ln for ln in lines if "directions_ioi: started" in ln)) > first_end
    full_out, _ = full
    for step in ("sad", "masks_ioi", "directions_ioi"):
        assert State.read(out / step).status == "done" and (out / step / "report.log").is_file()
        assert measured(out, step) == measured(full_out, step), step
    page = Page()
    page.feed((out / "index.html").read_text())
    assert {"sad", "masks_ioi", "directions_ioi"} <= page.ids
    again = run_report(out, "--steps", "sad,masks_ioi,directions_ioi", "--jobs", "2")
    assert again.stderr.count("done before, kept") == 3


@pytest.mark.slow  # whole reports (tiny models) in subprocesses
def test_a_failing_step_is_reported_and_the_others_run(tmp_path):
    out = tmp_path / "report"
    proc = run_report(out, "--steps", "directions_ioi,mounts", check=False)
    assert proc.returncode == 1
    failed = State.read(out / "directions_ioi")
    assert failed.status == "failed" and len(failed.error) == 2
    assert failed.error[0] == "error: directions_ioi needs the masks_ioi step, which has not finished"
    assert failed.error[0] in proc.stderr and "report: 1 step(s) failed: directions_ioi" in proc.stderr
    assert State.read(out / "mounts").status == "done"
    page = Page()
    page.feed((out / "index.html").read_text())
    assert {"directions_ioi", "mounts"} <= page.ids


def test_a_bad_option_fails_in_two_lines(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lit_svd", "report", MODEL, "--out", str(tmp_path), "--steps", "sad,nope"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --steps: 'nope' is not a step",
        "hint: steps: " + ", ".join(s.name for s in STEPS),
    ]
    assert not (tmp_path / "sad").exists()
    assert [s.name for s in select_steps("mounts,sad")] == ["sad", "mounts"]


def test_a_step_with_a_checkpoint_resumes_from_it(tmp_path):
    step = next(s for s in STEPS if s.name == "masks_ioi")
    assert "ckpt_path" not in step_keys(step, MODEL, tmp_path, quick=True, threads=None)
    ckpt = tmp_path / "masks_ioi" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    keys = step_keys(step, MODEL, tmp_path, quick=True, threads=1)
    assert keys["ckpt_path"] == "last" and keys["out"] == tmp_path / "masks_ioi" and keys["threads"] == 1
    assert keys["max_steps"] == 64  # --quick
    assert "max_steps" not in step_keys(step, MODEL, tmp_path, quick=False, threads=None)


def test_the_eta_scales_the_expected_costs_by_the_measured_speed():
    steps = [s for s in STEPS if s.name in ("sad", "masks_ioi", "mounts")]
    progress = Progress(steps, quick=False)
    assert progress.eta(0) == 60.0 * (2.0 + 14.0 + 12.0)  # nothing measured yet: the expected minutes
    progress.finished(steps[0], seconds=3 * 60.0 * 2.0)  # the first step took three times its expectation
    assert progress.eta(1) == 3 * 60.0 * (14.0 + 12.0)
    gemma = Progress(steps, quick=False, model="gemma3-270m")  # measured minutes where the model has them
    assert gemma.eta(0) == pytest.approx(60.0 * (3.7 + 19.6 + 13.0))
    assert Progress(steps, quick=True, model="gemma3-270m").eta(0) == 60.0 * (0.3 + 5.0 + 2.0)  # --quick: SmolLM2's
