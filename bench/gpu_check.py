"""The GPU check: every method on reduced settings, on the GPU and on the CPU in one run, compared result by result.

    python bench/gpu_check.py                 # SmolLM2-135M and Gemma-3-270M (offline aliases), one GPU
    python bench/gpu_check.py --models smollm2 --cpu-threads 8

Per model (SmolLM2, Gemma-3): SAD (2 layers, 32 IOI prompts, 4 null draws), a direction-mask fit (4 steps),
tiled mounts (2 layers, 2,048 WikiText-2 tokens, controls included), the causal direction check (6 claimed OV
directions of a mask run written here, 16 prompts, 4 random directions per head); once: the toy model (100
steps). Each is the shipped config with smaller settings, run through the CLI (``python -m lit_svd``) with
``--trainer.accelerator gpu`` and again with ``cpu``; the two ``results.json`` are compared leaf by leaf
(numbers within abs 2e-3 or rel 2e-3, everything else exactly; timings, paths and the config are skipped).
Printed per case: whole-command wall time and throughput on each side, GPU peak memory (allocated) and
the process's peak RSS. With two or more GPUs the mounts case also runs as two-process DDP and is compared
with the one-GPU result. With a GPU the mask case also runs under Lightning's FSDPStrategy (all visible GPUs, at
most 2) and is compared with the one-GPU result: Lightning refuses FSDP on the CPU ("The strategy `fsdp` requires
a GPU accelerator"), so this is where FSDP mask training is checked. The last line is the summary.

Without CUDA the script runs its CPU fallback: the "GPU" side is a second CPU run, so the comparison checks
that the runs are repeatable and the script works, not the GPU path; the output says so. Budget on one H200:
well under 5 minutes (the CPU side dominates; give it the machine's cores with --cpu-threads).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = (ROOT / ".." / "shared" / "data" / "wikitext-2" / "valid.txt").resolve()
MODELS = {"smollm2": ("smollm2-135m", "smollm2"), "gemma3": ("gemma3-270m", "gemma3_270m")}
SKIP = {"timing", "wall_s", "directions_per_s", "config", "provenance", "table_csv", "table_html", "run", "path"}
REL, ABS = 2e-3, 2e-3
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
# runs a CLI command and writes its peak memory (GPU allocated, process RSS) to $GPU_CHECK_MEMORY
CHILD = """
import json, os, resource, sys, torch
from lit_svd.cli import main
main(sys.argv[1:])
gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
json.dump({"gpu_bytes": gpu, "rss_bytes": rss}, open(os.environ["GPU_CHECK_MEMORY"], "w"))
"""


def cases(alias: str, prefix: str, run_dir: Path) -> dict[str, tuple[list[str], float, str]]:
    """name -> (CLI arguments, units of work, unit name): the shipped configs on reduced settings."""
    cfg = lambda *p: ["--config", str(ROOT / "configs" / Path(*p))]  # noqa: E731
    task_data = ["--data.init_args.n_train", "32", "--data.init_args.n_val", "8", "--data.init_args.n_test", "16"]
    return {
        "sad": (
            ["test", *cfg("sad", f"{prefix}_ioi.yaml"), "--model.init_args.layers", "[0, 5]"]
            + ["--model.init_args.null_draws", "4", "--model.init_args.min_pairs", "5"]
            + ["--data.init_args.n_test", "32", "--data.init_args.batch_size", "16"],
            32,
            "prompts",
        ),
        "masks": (
            ["fit", *cfg("masks", f"{prefix}_ioi.yaml"), "--trainer.max_steps", "4", "--trainer.max_time", "null"]
            + ["--model.init_args.soft_steps", "2", "--model.init_args.steps_per_batch", "2"]
            + [*task_data, "--data.init_args.batch_size", "8", "--trainer.callbacks.init_args.trajectory_every", "2"],
            4,
            "steps",
        ),
        "mounts": (
            ["test", *cfg("mounts", f"{prefix}_wikitext.yaml"), "--data.init_args.path", str(WIKITEXT)]
            + ["--data.init_args.n_tokens", "2048", "--model.init_args.layers", "[1, 6]"]
            + ["--model.init_args.steer_texts", "4", "--model.init_args.layers_per_pass", "1"],
            2048,
            "tokens",
        ),
        "directions": (
            ["test", *cfg("masks", "smollm2_ioi_directions.yaml"), "--model.init_args.run", str(run_dir)]
            + ["--model.init_args.n_random", "4", "--data.init_args.tokenizer", alias, *task_data]
            + ["--data.init_args.batch_size", "16", "--data.init_args.test_last", "true"],
            6,
            "directions",
        ),
    }


TOY = (
    ["fit", "--config", str(ROOT / "configs" / "toy" / "single_pair.yaml"), "--trainer.max_steps", "100"],
    100,
    "steps",
)


def mask_run(folder: Path, alias: str) -> Path:
    """A finished mask run as DirectionMaskReport leaves it (masks.pt, config.yaml) claiming 6 OV directions."""
    import torch
    import yaml

    from lit_svd.models import view as make_view
    from lit_svd.models.intervene import build_components
    from lit_svd.models.loading import load_causal_lm

    view = make_view(load_causal_lm(alias)[0])
    comps = build_components(view, ["ov"], [0, view.n_layers // 2])
    lambdas = {c.name: torch.full(c.shape, 1e-4) for c in comps}
    for c in comps:
        for g, k in ((0, 0), (1, 2), (view.n_heads - 1, 1)):
            lambdas[c.name][g, k] = 0.9
    folder.mkdir(parents=True)
    torch.save(
        {"lambdas": lambdas, "threshold": 1e-3, "model": alias, "hparams": {"fold_norms": True}}, folder / "masks.pt"
    )
    data = dict(task="ioi", tokenizer=alias, n_train=32, n_val=8, n_test=16, batch_size=16, seed=0, test_last=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": {"init_args": data}}))
    return folder


def run(args: list[str], accelerator: str, out: Path, threads: int, devices: int = 1, strategy: str = "ddp") -> dict:
    """One CLI run; its results.json, wall time and peak memory (``strategy``: for ``devices > 1``, or ``fsdp``)."""
    out.mkdir(parents=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    env["GPU_CHECK_MEMORY"] = str(out / "memory.json")
    full = [*args, *QUIET, "--trainer.accelerator", accelerator, "--trainer.devices", str(devices)]
    full += ["--trainer.default_root_dir", str(out), "--threads", str(threads)]
    if devices > 1 or strategy != "ddp":  # Lightning's launcher re-runs the command line: the plain CLI
        full += ["--trainer.strategy", strategy]
        cmd = [sys.executable, "-m", "lit_svd", *full]
    else:
        cmd = [sys.executable, "-c", CHILD, *full]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    found = sorted(out.rglob("results.json"))
    if len(found) != 1:
        return {"error": f"expected one results.json under {out}, found {len(found)}"}
    memory = json.loads((out / "memory.json").read_text()) if (out / "memory.json").is_file() else {}
    return {"results": json.loads(found[0].read_text()), "wall": wall, **memory}


def compare(a, b, where: str = "") -> tuple[int, list[str]]:
    """(leaves compared, the ones that differ): numbers within abs ABS or rel REL, the rest exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        n, bad = 0, []
        for k in a:
            if k in SKIP or k.endswith("_s"):
                continue
            if k not in b:
                bad.append(f"{where}.{k}: missing")
                continue
            m, d = compare(a[k], b[k], f"{where}.{k}")
            n, bad = n + m, bad + d
        return n, bad
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return 1, [f"{where}: length {len(a)} vs {len(b)}"]
        n, bad = 0, []
        for i, (x, y) in enumerate(zip(a, b)):
            m, d = compare(x, y, f"{where}[{i}]")
            n, bad = n + m, bad + d
        return n, bad
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if isinstance(a, float) and math.isnan(a) and isinstance(b, float) and math.isnan(b):
            return 1, []
        ok = abs(a - b) <= max(ABS, REL * max(abs(a), abs(b)))
        return 1, [] if ok else [f"{where}: {a!r} vs {b!r}"]
    return 1, [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def describe(r: dict, units: float, unit: str) -> str:
    if "error" in r:
        return f"FAILED ({r['error'][:120]})"
    mem = f", GPU peak {r['gpu_bytes'] / 2**30:.2f} GiB" if r.get("gpu_bytes") else ""
    rss = f", RSS {r['rss_bytes'] / 2**30:.2f} GiB" if r.get("rss_bytes") else ""
    return f"{r['wall']:6.1f} s, {units / r['wall']:8.3g} {unit}/s{mem}{rss}"


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--cpu-threads", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)))
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs' folders here (default: a temp dir)")
    opts = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from conditions import report_conditions  # bench/conditions.py

    report_conditions()
    gpu = torch.cuda.is_available()
    side = "gpu" if gpu else "cpu"
    if gpu:
        n = torch.cuda.device_count()
        print(f"GPU check on {torch.cuda.get_device_name(0)} ({n} visible), torch {torch.__version__}")
    else:
        print("no CUDA here: CPU fallback, the second side is another CPU run (repeatability, not the GPU path)")
    start = time.perf_counter()
    where = Path(tempfile.mkdtemp(prefix="gpu_check_")) if opts.keep is None else opts.keep
    outcomes: list[tuple[str, bool]] = []
    mounts_gpu: dict[str, dict] = {}

    def check(name: str, args: list[str], units: float, unit: str) -> None:
        cpu = run(args, "cpu", where / name / "cpu", opts.cpu_threads)
        other = run(args, side, where / name / ("gpu" if gpu else "cpu_again"), opts.cpu_threads)
        if "error" in cpu or "error" in other:
            agree, note = False, ""
        else:
            n, bad = compare(cpu["results"], other["results"])
            agree, note = not bad, f"{n - len(bad)}/{n} leaves agree" + (f"; first: {bad[0]}" if bad else "")
        print(
            f"{name:20} cpu {describe(cpu, units, unit)} | {side} {describe(other, units, unit)} | {note}", flush=True
        )
        outcomes.append((name, agree))
        if name.endswith("/mounts"):
            mounts_gpu[name] = other

    for key in opts.models:
        alias, prefix = MODELS[key]
        try:
            run_dir = mask_run(where / f"{key}_mask_run", alias)
        except Exception as err:  # an alias not cached here: say so and go on
            print(f"{key:20} skipped: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
            outcomes.append((key, False))
            continue
        for name, (args, units, unit) in cases(alias, prefix, run_dir).items():
            check(f"{key}/{name}", args, units, unit)
    check("toy", *TOY)

    ddp = "skipped (fewer than 2 GPUs)"
    if gpu and torch.cuda.device_count() >= 2 and mounts_gpu:
        name, one = next(iter(mounts_gpu.items()))
        alias, prefix = MODELS[name.split("/")[0]]
        args = cases(alias, prefix, where)["mounts"][0]
        two = run(args, "gpu", where / f"{name}_ddp2", opts.cpu_threads, devices=2)
        if "error" in two or "error" in one:
            ddp, ok = f"FAILED ({two.get('error') or one.get('error')})", False
        else:
            n, bad = compare(one["results"], two["results"])
            ok = not bad
            ddp = f"{'agrees' if ok else 'DIFFERS'} with one GPU ({n - len(bad)}/{n} leaves), {two['wall']:.1f} s"
        print(f"{name + ' DDP x2':20} {ddp}")
        outcomes.append(("ddp", ok))
    fsdp = "skipped (no GPU; Lightning refuses FSDP on the CPU)"
    if gpu and opts.models:
        alias, prefix = MODELS[opts.models[0]]
        args = cases(alias, prefix, where)["masks"][0]
        n_dev = min(2, torch.cuda.device_count())
        one = run(args, "gpu", where / "masks_gpu1_for_fsdp", opts.cpu_threads)
        sharded = run(args, "gpu", where / "masks_fsdp", opts.cpu_threads, devices=n_dev, strategy="fsdp")
        if "error" in sharded or "error" in one:
            fsdp, ok = f"FAILED ({sharded.get('error') or one.get('error')})", False
        else:
            n, bad = compare(one["results"], sharded["results"])
            ok = not bad
            fsdp = f"{'agrees' if ok else 'DIFFERS'} with one GPU ({n - len(bad)}/{n} leaves) on {n_dev} GPU(s)"
            fsdp += f", {sharded['wall']:.1f} s" + (f"; first: {bad[0]}" if bad else "")
        print(f"{'masks FSDP':20} {fsdp}")
        outcomes.append(("fsdp", ok))
    agree = sum(ok for _, ok in outcomes)
    failed = [n for n, ok in outcomes if not ok]
    vs = f"{torch.cuda.get_device_name(0)} vs CPU" if gpu else "CPU vs CPU (fallback: no GPU)"
    print(
        f"gpu_check: {agree}/{len(outcomes)} cases agree ({vs}); DDP: {ddp}; FSDP: {fsdp};"
        f" {time.perf_counter() - start:.0f} s" + (f"; not agreeing: {', '.join(failed)}" if failed else "")
    )
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
