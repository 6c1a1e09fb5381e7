"""The sparsity-KL curve of several direction-mask runs (e.g. one per alpha), from their results.json.

    python -m lit_svd.analysis.mask_curve runs/masks_a* --out curve.png

prints one row per run (alpha, kept fraction, hard and soft KL, task metric and accuracy with hard
masks) sorted by alpha, and draws the final hard-mask points with each run's trajectory behind them.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

COLUMNS = ("alpha", "kept_fraction", "kl_hard", "kl_soft", "logit_diff_hard", "accuracy_hard", "steps")


def load_runs(paths: Sequence[str | Path]) -> list[dict]:
    """The results.json of each run folder (searched recursively; a results.json path also works),
    labelled by folder and sorted by alpha. Runs of another experiment fail in one line."""
    runs = []
    for path in map(Path, paths):
        if path.is_file() and path.suffix != ".json":
            raise ValueError(f"{path}: not a run folder or a results.json")
        found = [path] if path.is_file() else sorted(path.rglob("results.json"))
        if not found:
            raise FileNotFoundError(f"{path}: no results.json (has the run finished?)")
        for file in found:
            res = json.loads(file.read_text())
            if res.get("experiment") != "direction_mask":
                raise ValueError(f"{file}: experiment is {res.get('experiment')!r}, not 'direction_mask'")
            runs.append({"label": str(path), **res})
    return sorted(runs, key=lambda r: (r["alpha"], r["label"]))


def table(runs: Sequence[dict]) -> str:
    """A plain-text table of ``COLUMNS`` per run."""
    rows = ["run  " + "  ".join(f"{c:>15}" for c in COLUMNS)]
    for r in runs:
        rows.append(f"{r['label']}\n     " + "  ".join(f"{r.get(c, float('nan')):>15.4g}" for c in COLUMNS))
    return "\n".join(rows)


def plot(runs: Sequence[dict], out: str | Path, target: tuple[float, float] | None = (0.10, 0.25)):
    """Hard-mask KL against kept fraction: trajectories (hard KL on one validation batch) as lines,
    the final evaluation as labelled points, and the target box (kept <= 10 %, KL <= 0.25)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for r in runs:
        traj = [p for p in r.get("trajectory", []) if p["kept_fraction"] < 1]
        line, = ax.plot([100 * p["kept_fraction"] for p in traj], [p["kl_hard"] for p in traj], lw=0.8, alpha=0.5)
        ax.plot(100 * r["kept_fraction"], r["kl_hard"], "o", color=line.get_color(),
                label=f"{Path(r['label']).name} (alpha {r['alpha']:g}): {100 * r['kept_fraction']:.1f} %, KL {r['kl_hard']:.2f}")
    if target:
        ax.fill_between([0, 100 * target[0]], 0, target[1], color="tab:green", alpha=0.12, label="target")
    ax.set_xscale("log")
    ax.set_xlabel("kept directions (%), hard masks")
    ax.set_ylabel("KL(full || hard-masked)")
    ax.set_ylim(0, max(0.5, 1.5 * max(r["kl_hard"] for r in runs)))  # early trajectory spikes run off the top
    ax.set_title(f"sparsity-KL, {runs[0].get('task', '')} on {runs[0].get('model', '')}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders (or results.json files)")
    parser.add_argument("--out", default="masks_sparsity_kl.png", help="figure path")
    args = parser.parse_args(argv)
    runs = load_runs(args.runs)
    print(table(runs))
    print(f"figure: {plot(runs, args.out)}")


if __name__ == "__main__":
    main()
