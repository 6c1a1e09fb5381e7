"""``lit-svd report MODEL --out DIR [--steps sad,masks_ioi,...] [--quick] [--jobs N]``: every method on one model.

The steps are the methods' report steps (``lit_svd.registry``: SAD on IOI, masks for IOI / GP / GT, the direction
check of the IOI mask run, mounts, and the circuit graph where its config exists). Each runs in this process as the
command line would (``commands.method_args`` -> ``cli_lightning.run_cli``: the same results.json as ``lit-svd
test|fit``) into ``DIR/<step>/`` and leaves ``DIR/<step>/step.json`` (status, run folder, seconds, error).
Resumable:
* a step whose step.json says ``done`` is not redone;
* a step killed mid-way is rerun; one whose config checkpoints (the mask runs: last.ckpt every 24 steps)
  resumes from its newest last.ckpt;
* a failed step is recorded (the error in the CLI's two lines) and the rest still runs; the next report
  retries it; a step needing a failed one fails in one line naming it.
A model that cannot be had, an unknown step or option and an unusable ``--out`` fail in two lines before any step.
Then ``DIR/index.html``: one offline page (no network: figures are files beside it or inline PNG) with each
step's headline figure, its control beside it (``lit_svd.figures.report``), the key numbers, and links to
the step's results.json, table and pages. It is rewritten after every step, so a killed report has one too.

``--jobs N``: N steps at once, each in its own process (``run_parallel``; the direction check still waits for
the IOI mask run); on a machine with N free cores the report takes about 1/N of the time (one thread each).

``--quick``: reduced settings (each method's ``quick`` keywords: few prompts, steps and tokens) for a fast look.
MODEL is any model the API takes: ``smollm2-135m``, ``gemma3-270m`` (their own configs), a hub name or folder (the
generic configs with the model overridden), ``tiny-llama`` and the other tiny models (tests).
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_svd import PROG as LIT_SVD
from lit_svd.commands import method_args
from lit_svd.registry import METHODS, Step, report_steps

PROG = f"{LIT_SVD} report"


STEPS: tuple[Step, ...] = report_steps()  # each method's report steps (lit_svd.registry)

# expected wall minutes of the full steps on other models, measured here (docs/api.md: Gemma-3 with --jobs 2);
# a model not listed starts from SmolLM2's (Step.minutes) and the ETA rescales as its steps finish
MEASURED_MINUTES: dict[str, dict[str, float]] = {
    "gemma3-270m": {
        "sad": 3.7,
        "masks_ioi": 19.6,
        "masks_gp": 14.2,
        "masks_gt": 19.9,
        "directions_ioi": 7.3,
        "mounts": 13.0,
        "circuits_ioi": 9.3,
    },
}


class ReportError(ValueError):
    """A report option that cannot be used (two lines: message, hint)."""


# --- steps -------------------------------------------------------------------------------------------------
@dataclass
class State:
    """A step's ``step.json``: status (done, failed, skipped), its run folder (relative to the report), seconds."""

    status: str
    run: str | None = None
    seconds: float | None = None
    error: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> State | None:
        path = folder / "step.json"
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            return None  # a damaged marker: the step is redone

    def write(self, folder: Path) -> None:
        from lit_svd.output import write_json

        write_json(folder / "step.json", self.__dict__)


def select_steps(names: str | None) -> list[Step]:
    """The steps named in ``--steps`` (comma-separated, in the report's order), all by default."""
    if not names:
        return list(STEPS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {s.name for s in STEPS}
    bad = [n for n in wanted if n not in known]
    if bad:
        raise ReportError(f"--steps: {bad[0]!r} is not a step\nhint: steps: {', '.join(s.name for s in STEPS)}")
    return [s for s in STEPS if s.name in wanted]


def check_inputs(model: str, out: Path) -> None:
    """Before any step: the model can be had (``model_names.check_available``: a missing path, an unknown tiny
    model, a hub name offline and not cached) and ``out`` is a folder that can be written (two lines otherwise)."""
    from lit_svd.model_names import ModelUnavailableError, check_available

    try:
        check_available(model)
    except ModelUnavailableError as err:
        raise ReportError(str(err)) from None
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {str(out)!r}: a file, not a folder\nhint: give a new or an existing report folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(
            f"--out {str(out)!r}: cannot be created ({err.strerror})\nhint: give a writable folder"
        ) from None


def step_keys(step: Step, model: str, out: Path, quick: bool, threads: int | None) -> dict[str, Any]:
    """The API keywords of a step: its folder, --quick's settings (the method's ``quick``), resumption."""
    keys: dict[str, Any] = {"out": out / step.name}
    if quick:
        keys.update(METHODS[step.method].quick)
    if threads is not None:
        keys["threads"] = threads
    if list((out / step.name).glob("**/checkpoints/last*.ckpt")):
        keys["ckpt_path"] = "last"  # a killed mask run resumes from its newest last.ckpt
    return keys


def run_step(step: Step, model: str, out: Path, quick: bool, threads: int | None):
    """Run one step in this process, as the command line would (``commands.method_args``,
    ``cli_lightning.run_cli``); returns its result (the run folder is ``result.folder``)."""
    from lit_svd.cli_lightning import run_cli
    from lit_svd.runs import load_run

    keys = step_keys(step, model, out, quick, threads)
    reads = METHODS[step.method].reads
    if step.after is not None and reads is not None:
        before = State.read(out / step.after)
        if before is None or before.status != "done":
            raise ValueError(f"{step.name} needs the {step.after} step, which has not finished")
        keys[reads] = out / before.run
    folder = run_cli(method_args(step.method, model, step.task, keys))
    result = load_run(folder, need=("results",)).result
    result.folder = folder
    return result


def two_lines(err: BaseException) -> list[str]:
    """An error as the CLI shows it: the message, then a hint."""
    from lit_svd.errors import user_message

    return user_message(err)


# --- the run ----------------------------------------------------------------------------------------------
def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else (f"{seconds // 60}:{seconds % 60:02d}")
    )


class Progress:
    """One line per step start and end on stderr: step i/n, name, elapsed, ETA from the expected costs
    (scaled by how long the finished steps took against theirs; divided among ``jobs`` parallel steps)."""

    def __init__(self, steps: list[Step], quick: bool, jobs: int = 1, model: str | None = None):
        self.steps, self.quick, self.jobs, self.start = steps, quick, jobs, time.monotonic()
        self.spent = self.expected_done = 0.0
        self.left = {s.name for s in steps}  # not finished (for the ETA of parallel steps)
        self.measured = {} if quick else MEASURED_MINUTES.get(model or "", {})

    def cost(self, step: Step) -> float:
        """Expected seconds of ``step``: measured on this model where known, else SmolLM2's."""
        return 60.0 * self.measured.get(step.name, step.quick_minutes if self.quick else step.minutes)

    def eta(self, i: int) -> float:
        speed = self.spent / self.expected_done if self.expected_done else 1.0
        if self.jobs == 1:
            return speed * sum(self.cost(s) for s in self.steps[i:])
        return speed * sum(self.cost(s) for s in self.steps if s.name in self.left) / self.jobs

    def line(self, i: int, step: Step, what: str) -> None:
        elapsed = time.monotonic() - self.start
        print(
            f"report [{i + 1}/{len(self.steps)}] {step.name}: {what} | elapsed {clock(elapsed)}"
            f" | ETA {clock(self.eta(i if what.startswith('start') else i + 1))}",
            file=sys.stderr,
            flush=True,
        )

    def finished(self, step: Step, seconds: float) -> None:
        self.spent += seconds
        self.expected_done += self.cost(step)
        self.left.discard(step.name)


def report(
    model: str,
    out: str | os.PathLike,
    steps: str | None = None,
    quick: bool = False,
    threads: int | None = None,
    jobs: int = 1,
    index: bool = True,
):
    """Run the report's steps on ``model`` into ``out`` (resumable) and write ``out/index.html``; returns
    ``{step name: State}``. ``jobs`` > 1: that many steps at once, each in its own process (``run_parallel``);
    ``index``: False leaves the page to the caller (a step run by a parallel report)."""
    chosen = select_steps(steps)
    root = Path(out)
    check_inputs(model, root)
    progress = Progress(chosen, quick, jobs, model)
    if jobs > 1:
        return run_parallel(chosen, model, root, quick, threads, jobs, progress)
    states: dict[str, State] = {}
    for i, step in enumerate(chosen):
        folder = root / step.name
        state = State.read(folder)
        if state is not None and state.status == "done":
            progress.line(i, step, "done before, kept")
            states[step.name] = state
            continue
        progress.line(i, step, f"started (expected ~{clock(progress.cost(step))})")
        t0 = time.monotonic()
        try:
            result = run_step(step, model, root, quick, threads)
            state = State("done", run=os.path.relpath(result.folder, root), seconds=round(time.monotonic() - t0, 1))
        except FileNotFoundError as err:
            if not step.optional:
                state = _failed(err, t0)
            else:
                state = State("skipped", error=[f"skipped: {str(err).splitlines()[0]}"])
        except KeyboardInterrupt:
            raise
        except Exception as err:  # a failed step is recorded; the others still run
            state = _failed(err, t0)
        folder.mkdir(parents=True, exist_ok=True)
        state.write(folder)
        states[step.name] = state
        if state.status != "skipped":
            progress.finished(step, time.monotonic() - t0)
        progress.line(i, step, state.status + (f" in {clock(state.seconds)}" if state.seconds is not None else ""))
        if state.status == "failed":
            print("\n".join(state.error), file=sys.stderr)
        if index:
            write_index(root, model, chosen, quick)
    if index:
        print(f"report: {write_index(root, model, chosen, quick)}", file=sys.stderr)
    return states


def run_parallel(
    chosen: list[Step], model: str, root: Path, quick: bool, threads: int | None, jobs: int, progress: Progress
) -> dict[str, State]:
    """The steps ``jobs`` at a time, each as ``python -m lit_svd report MODEL --steps NAME`` in its own process
    (its output in ``DIR/<step>/report.log``), in the report's order; a step waits for the one it reads
    (``after``) when that one is part of the report. Resumable as the sequential report: a step whose step.json
    says done is kept; a step whose process ends without a step.json is recorded as failed."""
    import subprocess

    order = {s.name: i for i, s in enumerate(chosen)}
    names = set(order)
    pending, states = list(chosen), {}
    running: dict[str, tuple[Step, subprocess.Popen, float, Path]] = {}
    try:
        while pending or running:
            for name, (step, proc, t0, log) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                seconds = round(time.monotonic() - t0, 1)
                state = State.read(root / name) or State(
                    "failed",
                    seconds=seconds,
                    error=[f"error: the {name} step's process ended with code {proc.returncode}", f"hint: see {log}"],
                )
                states[name] = state
                if state.status != "skipped":
                    progress.finished(step, seconds)
                took = f" in {clock(state.seconds)}" if state.seconds is not None else ""
                progress.line(order[name], step, state.status + took)
                if state.status == "failed":
                    print("\n".join(state.error), file=sys.stderr)
                write_index(root, model, chosen, quick)
            for step in list(pending):
                if len(running) >= jobs:
                    break
                if step.after in names and step.after not in states:
                    continue  # its input is still to come
                pending.remove(step)
                state = State.read(root / step.name)
                if state is not None and state.status == "done":
                    progress.finished(step, 0.0)
                    progress.line(order[step.name], step, "done before, kept")
                    states[step.name] = state
                    continue
                (root / step.name).mkdir(parents=True, exist_ok=True)
                log = root / step.name / "report.log"
                command = [sys.executable, "-m", "lit_svd", "report", model, "--out", str(root), "--steps", step.name]
                command += ["--quick"] * quick + (["--threads", str(threads)] if threads else []) + ["--no-index"]
                with open(log, "w") as f:
                    proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT)
                running[step.name] = (step, proc, time.monotonic(), log)
                progress.line(order[step.name], step, f"started (expected ~{clock(progress.cost(step))})")
            time.sleep(0.5)
    finally:
        for _, proc, _, _ in running.values():  # interrupted: stop the steps still running
            proc.terminate()
            proc.wait()
    print(f"report: {write_index(root, model, chosen, quick)}", file=sys.stderr)
    return {s.name: states[s.name] for s in chosen if s.name in states}


def _failed(err: BaseException, t0: float) -> State:
    if os.environ.get("LIT_SVD_DEBUG", "") not in ("", "0", "false"):
        traceback.print_exc()
    return State("failed", seconds=round(time.monotonic() - t0, 1), error=two_lines(err))


# --- the page ---------------------------------------------------------------------------------------------
STYLE = """
body { font-family: sans-serif; margin: 1.5em; max-width: 1250px; color: #222; }
section { border-top: 1px solid #ccc; padding-top: .5em; margin-top: 1em; }
.row { display: flex; gap: 1em; align-items: flex-start; flex-wrap: wrap; }
figure { margin: 0; } figure img { max-width: 600px; max-height: 420px; border: 1px solid #eee; }
figcaption { font-size: .8em; color: #555; }
table { border-collapse: collapse; font-size: .9em; } td, th { padding: 2px 8px; border-bottom: 1px solid #eee; }
th { text-align: left; } .failed { color: #b00; } .skipped { color: #888; } .done { color: #070; }
pre { background: #f6f6f6; padding: .5em; white-space: pre-wrap; }
"""


def key_numbers(result) -> list[tuple[str, Any]]:
    """The numbers a step's section shows: the method's claim and its control side by side."""
    from lit_svd.runs import scalars

    e = result.experiment
    if e == "sad":
        s = result.headline
        rows = [("heads eligible", s["n_heads_eligible"])]
        for key, label in (("null", "matched null"), ("unattended", "pair null"), ("rotated", "rotated basis")):
            if f"n_heads_sparser_than_{key}" in s:
                rows.append((f"heads sparser than the {label}", s[f"n_heads_sparser_than_{key}"]))
        rows += [("mean sparsity", s["mean_sparsity"]), ("mean sparsity, matched null", s.get("mean_sparsity_null"))]
        return rows + [("median N_recon", s["n_recon_median"]), ("median N_recon, null", s.get("n_recon_median_null"))]
    if e == "direction_mask":
        return [
            ("kept directions", f"{result.kept} of {result.n_directions} ({result.kept_fraction:.2%})"),
            (f"KL(full || hard), {result.eval_split}", result.kl_hard),
            ("KL(full || soft)", result.kl_soft),
            (f"{result.metric} full / hard", f"{result.logit_diff_full:.3f} / {result.logit_diff_hard:.3f}"),
            ("accuracy full / hard", f"{result.accuracy_full:.3f} / {result.accuracy_hard:.3f}"),
            ("steps", f"{result.steps}" + (" (stopped early)" if result.stopped_early else "")),
        ]
    if e == "direction_check":
        return [
            ("kept OV directions checked", result.n_directions),
            ("isolated", result.n_isolated),
            ("passing the causal check", f"{result.n_pass} ({_fmt(result.fraction_pass)})"),
            (
                "passing, isolated / in blocks",
                f"{_fmt(result.fraction_pass_isolated)} / {_fmt(result.fraction_pass_in_blocks)}",
            ),
            ("level (random directions pass at)", result.level),
        ]
    if e == "tiled_mounts":
        rows = [("site-layers passing", f"{result.n_pass} of {result.n_site_layers}")]
        if result.n_pass_null is not None:
            rows.append(("null site-layers passing", result.n_pass_null))
        return rows + [("tokens scored", result.n_tokens)]
    return list(scalars(result.to_dict(), limit=10).items())


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _section(root: Path, step: Step, quick: bool) -> str:
    from lit_svd.runs import load_run

    title = html.escape(step.title or step.name)
    state = State.read(root / step.name)
    head = f"<section id='{step.name}'><h2>{title} <small>({step.name})</small></h2>"
    if state is None:
        return head + "<p class='skipped'>not run yet</p></section>"
    if state.status != "done":
        lines = html.escape("\n".join(state.error))
        return head + f"<p class='{state.status}'>{state.status}</p><pre>{lines}</pre></section>"
    folder = root / state.run
    try:
        result = load_run(folder, need=("results",)).result
    except Exception as err:  # a result that cannot be read back is shown as such, the page still written
        return head + f"<p class='failed'>results.json unreadable</p><pre>{html.escape(str(err))}</pre></section>"
    parts = [
        head,
        f"<p class='done'>done in {clock(state.seconds or 0)} &middot; <code>{html.escape(state.run)}</code></p>",
    ]
    pngs = sorted(folder.glob("*.png"))
    first = next((p for p in pngs if p.stem == METHODS[step.method].headline), pngs[0] if pngs else None)
    figs = []
    if first is not None:
        figs.append(_figure(os.path.relpath(first, root), f"headline: {first.stem}"))
    ctrl = _control_png(result)
    if ctrl:
        figs.append(_figure(ctrl, "control"))
    if figs:
        parts.append(f"<div class='row'>{''.join(figs)}</div>")
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in key_numbers(result))
    parts.append(f"<table>{rows}</table>")
    links = [p for p in sorted(folder.iterdir()) if p.suffix in (".json", ".csv", ".html", ".png") and p.is_file()]
    parts.append(
        "<p>files: "
        + " &middot; ".join(
            f"<a href='{html.escape(os.path.relpath(p, root))}'>{html.escape(p.name)}</a>" for p in links
        )
        + "</p></section>"
    )
    return "".join(parts)


def _figure(src: str, caption: str) -> str:
    text = html.escape(caption)
    return f"<figure><img src='{html.escape(src)}' alt='{text}'/><figcaption>{text}</figcaption></figure>"


def _control_png(result) -> str | None:
    """The control figure as an inline PNG (data URI), or None."""
    import base64

    from lit_svd.figures.report import control
    from lit_svd.output import figure_png

    fig = control(result)
    return None if fig is None else "data:image/png;base64," + base64.b64encode(figure_png(fig, dpi=90)).decode()


def write_index(root: Path, model: str, steps: list[Step], quick: bool) -> Path:
    """``root/index.html``: a summary table of the steps, then one section per step."""
    from lit_svd.output import write_text

    summary = []
    for step in steps:
        state = State.read(root / step.name)
        status = state.status if state else "not run"
        took = clock(state.seconds) if state and state.seconds is not None else "-"
        summary.append(
            f"<tr><td><a href='#{step.name}'>{step.name}</a></td><td class='{status}'>{status}</td><td>{took}</td></tr>"
        )
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    page = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>lit_svd report: {html.escape(model)}</title><style>{STYLE}</style></head><body>",
        f"<h1>lit_svd report: {html.escape(model)}</h1>",
        f"<p>{'quick settings (--quick)' if quick else 'the shipped configs'}; written {now}</p>",
        "<table><tr><th>step</th><th>status</th><th>wall</th></tr>" + "".join(summary) + "</table>",
        *(_section(root, step, quick) for step in steps),
        "</body></html>",
    ]
    return write_text(root / "index.html", "\n".join(page) + "\n")


# --- command line -----------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Every method on one model as resumable steps, then DIR/index.html.",
        epilog="steps: " + ", ".join(f"{s.name} (~{s.minutes:g} min)" for s in STEPS),
    )
    p.add_argument("model", help="smollm2-135m, gemma3-270m, a hub name or folder, tiny-llama (tests)")
    p.add_argument("--out", required=True, help="the report's folder (a step per subfolder, index.html)")
    p.add_argument("--steps", default=None, help="comma-separated steps to run (default: all)")
    p.add_argument("--quick", action="store_true", help="reduced settings (few prompts, steps, tokens)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads of every step")
    p.add_argument(
        "--jobs", type=int, default=1, help="steps run at once, each in its own process (e.g. one per CPU core)"
    )
    p.add_argument("--no-index", action="store_true", help=argparse.SUPPRESS)  # a step of a parallel report
    return p


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # the CLI's two-line form
        raise ReportError(f"{message}\nhint: `{PROG} --help` lists every option")


def main(argv: list[str] | None = None) -> None:
    p = parser()
    p.__class__ = _Parser
    try:
        args = p.parse_args(argv)
        if args.threads is not None and args.threads < 1:
            raise ReportError(f"--threads {args.threads}: must be a positive integer")
        if args.jobs < 1:
            raise ReportError(f"--jobs {args.jobs}: must be a positive integer")
        states = report(args.model, args.out, args.steps, args.quick, args.threads, args.jobs, not args.no_index)
    except ReportError as err:
        lines = str(err).splitlines()
        print(f"error: {lines[0]}", file=sys.stderr)
        print(lines[1] if len(lines) > 1 else f"hint: `{PROG} --help`", file=sys.stderr)
        sys.exit(2)
    failed = [n for n, s in states.items() if s.status == "failed"]
    if failed:
        print(
            f"report: {len(failed)} step(s) failed: {', '.join(failed)} (run the same command again to retry)",
            file=sys.stderr,
        )
        sys.exit(1)
