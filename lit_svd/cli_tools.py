"""Command-line tools beside the LightningCLI (``cli.py``), each a subcommand of

    python -m lit_svd.cli_tools evaluate --task ioi gp gt --n-test 256 [--figure tasks.png]
    python -m lit_svd.cli_tools mask-curve runs/masks_a* [--out curve.png]
    python -m lit_svd.cli_tools mask-blocks RUN --out DIR [--rel-gaps 0.01 0.02 0.05]
    python -m lit_svd.cli_tools mask-thresholds RUN --out DIR [--thresholds 1e-3 0.01 0.1 0.5] [--max-kl 0.25]
    python -m lit_svd.cli_tools compare-directions MODEL_A MODEL_B --out DIR [--kinds qk ov] [--top 8]

``evaluate`` runs a model on the test split of one or more tasks (``TaskDataModule``) and prints each
task's clean and corrupted metrics as JSON (``lit_svd.metrics.evaluate_task``). ``mask-curve`` reads the
results.json of several direction-mask runs (e.g. one per alpha), prints one row per run (alpha, kept
fraction, hard and soft KL, task metric and accuracy with hard masks) sorted by alpha, and draws the
final hard-mask points with each run's trajectory behind them. ``mask-blocks`` annotates a finished
direction-mask run (its config.yaml, masks.pt and results.json; nothing is retrained or written there)
with the blocks of near-equal singular values of its components, at one or more ``rel_gap``: writes
results.json (kept directions isolated vs in blocks per kind and gap; kept directions and block-level
claims, receptors and steering rows with their block fields), blocks.json and mask_blocks.png into DIR.
``mask-thresholds`` re-cuts a run's hard masks at several lambda thresholds (soft-trained runs leave many
lambdas small but above 1e-3) and evaluates each on the validation and test splits; the threshold is
chosen on validation only. ``compare-directions`` follows the top singular directions of every head of
one model into another of the same architecture (kept / block / lost, as tracking over training steps).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

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
        (line,) = ax.plot([100 * p["kept_fraction"] for p in traj], [p["kl_hard"] for p in traj], lw=0.8, alpha=0.5)
        ax.plot(
            100 * r["kept_fraction"],
            r["kl_hard"],
            "o",
            color=line.get_color(),
            label=f"{Path(r['label']).name} (alpha {r['alpha']:g}): {100 * r['kept_fraction']:.1f} %, "
            f"KL {r['kl_hard']:.2f} on {r.get('eval_split', 'val')}",
        )
    if target:
        ax.fill_between([0, 100 * target[0]], 0, target[1], color="tab:green", alpha=0.12, label="target")
    ax.set_xscale("log")
    ax.set_xlabel("kept directions (%), hard masks")
    ax.set_ylabel("KL(full || hard-masked)")
    ax.set_ylim(0, max(0.5, 1.5 * max(r["kl_hard"] for r in runs)))  # early trajectory spikes run off the top
    splits = sorted({r.get("trajectory_split", "val") for r in runs})
    ax.set_title(
        f"sparsity-KL, {runs[0].get('task', '')} on {runs[0].get('model', '')}\n"
        f"points: final evaluation; lines: training trajectory on {'/'.join(splits)}",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_distributions(values: dict[str, dict[str, list[Tensor]]], path: str) -> None:
    """One histogram panel per task: the headline per-example value on clean vs corrupted prompts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(values), figsize=(4 * len(values), 3), squeeze=False)
    for ax, (task, per) in zip(axes[0], values.items()):
        for kind, color in (("clean", "tab:blue"), ("corrupt", "tab:orange")):
            v = torch.cat(per[kind]).numpy()
            ax.hist(v, bins=30, alpha=0.6, color=color, label=f"{kind} (mean {v.mean():.2f})")
        ax.set_title(task.upper())
        ax.set_xlabel("probability difference" if task == "gt" else "logit difference (correct - wrong)")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("prompts")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def evaluate(args: argparse.Namespace) -> list[dict]:
    """Evaluate a model on the test split of one or more tasks through ``TaskDataModule``; print JSON."""
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import evaluate_task
    from lit_svd.models.loading import load_causal_lm

    model, tokenizer = load_causal_lm(args.model)
    results, values = [], {}
    for task in args.task:
        dm = TaskDataModule(
            task,
            tokenizer,
            n_train=0,
            n_val=0,
            n_test=args.n_test,
            batch_size=args.batch_size,
            seed=args.seed,
            prepend_bos=args.prepend_bos,
        )
        values[task] = {}
        results.append(
            {
                "task": task,
                "model": args.model,
                "n_test": args.n_test,
                "seed": args.seed,
                "prepend_bos": args.prepend_bos,
                **evaluate_task(model, dm.test_dataloader(), task, per_example=values[task]),
            }
        )
        print(json.dumps(results[-1], indent=2), flush=True)
    if args.figure:
        plot_distributions(values, args.figure)
    return results


def mask_curve(args: argparse.Namespace) -> list[dict]:
    """Tabulate and plot the sparsity-KL curve of several direction-mask runs."""
    runs = load_runs(args.runs)
    print(table(runs))
    print(f"figure: {plot(runs, args.out)}")
    return runs


def mask_blocks(args: argparse.Namespace) -> dict:
    """Annotate a finished direction-mask run with the blocks of its components (nothing is retrained)."""
    import yaml

    from lit_svd.analysis.blocks import block_report, component_blocks, direction_block, kept_blocks
    from lit_svd.analysis.masks import hard_masks
    from lit_svd.models import view as make_view
    from lit_svd.models.intervene import build_components
    from lit_svd.models.loading import load_causal_lm

    run, out = Path(args.folder), Path(args.out)
    if out.resolve() == run.resolve():
        raise ValueError(f"--out {out} is the run folder; give a new folder (the run is read only)")
    for name in ("config.yaml", "masks.pt", "results.json"):
        if not (run / name).is_file():
            raise FileNotFoundError(f"{run / name}: no {name}; give a direction-mask run folder")
    hp = yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]
    saved = torch.load(run / "masks.pt")
    source = json.loads((run / "results.json").read_text())
    model, _ = load_causal_lm(hp["model"], gguf_file=hp.get("gguf_file"), revision=hp.get("revision"))
    comps = build_components(
        make_view(model, fold_norms=hp.get("fold_norms", True)), hp["components"], hp.get("layers"), progress=True
    )
    hard = hard_masks(saved["lambdas"], saved["threshold"])
    keep = {c.name: hard[c.name].bool() for c in comps}
    results = {
        "experiment": "mask_blocks",
        "source": str(run),
        "model": hp["model"],
        "kept": source["kept"],
        "rel_gaps": list(args.rel_gaps),
        "per_gap": [],
    }
    for i, gap in enumerate(args.rel_gaps):
        kb = kept_blocks(comps, keep, gap)
        report = block_report(comps, gap)
        blocks = {c.name: component_blocks(c, gap) for c in comps}

        def at(comp, head, direction):
            return direction_block(blocks[comp], head, direction)

        entry = {
            "rel_gap": gap,
            **{k: kb[k] for k in ("kept", "isolated", "isolated_fraction", "per_kind")},
            "all_directions": report["per_kind"],
            "receptors": [{**r, **at(f"L{r['layer']}.ov", r["head"], r["direction"])} for r in source["receptors"]],
        }
        if source.get("steering"):
            st = source["steering"]
            entry["steering"] = {**st, **at(st["component"], st["head"], st["direction"])}
        if source.get("steering_swap"):
            entry["steering_swap_directions"] = [
                {**r, **at(r["component"], r["head"], r["direction"])} for r in source["steering_swap"]["directions"]
            ]
        if i == 0:
            results.update(
                kept_directions=kb["directions"],
                kept_blocks=kb["blocks"],
                directions_rel_gap=gap,
                blocks_file="blocks.json",
            )
            out.mkdir(parents=True, exist_ok=True)
            (out / "blocks.json").write_text(json.dumps(report))
        results["per_gap"].append(entry)
        print(
            f"rel_gap {gap}: {kb['isolated']} of {kb['kept']} kept directions isolated; "
            + ", ".join(f"{k} {v['isolated']}/{v['kept']}" for k, v in kb["per_kind"].items()),
            flush=True,
        )
    (out / "results.json").write_text(json.dumps(results))
    print(f"figure: {plot_isolated(results, out / 'mask_blocks.png')}")
    return results


def plot_isolated(results: dict, path: Path) -> Path:
    """Per kind: fraction of kept directions that are isolated, next to the fraction of all directions, per gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(results["per_gap"][0]["per_kind"])
    gaps = results["per_gap"]
    fig, ax = plt.subplots(figsize=(1.5 + 1.2 * len(kinds), 3.2))
    x = np.arange(len(kinds))
    width = 0.8 / len(gaps)
    for j, e in enumerate(gaps):
        kept = [e["per_kind"][k]["isolated_fraction"] or 0.0 for k in kinds]
        every = [e["all_directions"][k]["isolated_fraction"] for k in kinds]
        ax.bar(x - 0.4 + width * (j + 0.5), kept, width, label=f"kept, rel_gap {e['rel_gap']:g}")
        ax.scatter(x - 0.4 + width * (j + 0.5), every, color="black", marker="_", s=200, zorder=3)
    ax.set_xticks(x, kinds)
    ax.set_ylabel("fraction isolated")
    ax.set_ylim(0, 1)
    ax.set_title("kept directions that are isolated (bars) vs all directions (ticks)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def choose_threshold(rows: Sequence[dict], max_kl: float) -> dict | None:
    """The sparsest row (largest ``threshold``) whose *validation* hard-mask KL is at most ``max_kl``;
    None when no threshold qualifies. Test figures play no part in the choice."""
    ok = [r for r in rows if r["val"]["kl_hard"] <= max_kl]
    return max(ok, key=lambda r: r["threshold"]) if ok else None


def mask_thresholds(args: argparse.Namespace) -> dict:
    """Re-cut the hard masks of a finished direction-mask run at several lambda thresholds (nothing is
    retrained): kept fraction and hard / soft scores on the validation and the test split per threshold,
    the threshold chosen on validation, its test figures; results.json and mask_thresholds.png in --out."""
    import yaml
    from torchmetrics import MeanMetric

    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules.direction_mask import DirectionMaskModule, _key

    run, out = Path(args.folder), Path(args.out)
    if out.resolve() == run.resolve():
        raise ValueError(f"--out {out} is the run folder; give a new folder (the run is read only)")
    for name in ("config.yaml", "masks.pt"):
        if not (run / name).is_file():
            raise FileNotFoundError(f"{run / name}: no {name}; give a direction-mask run folder")
    if any(not 0 < t < 1 for t in args.thresholds):
        raise ValueError(f"--thresholds {args.thresholds}: every threshold must lie in (0, 1)")
    config = yaml.safe_load((run / "config.yaml").read_text())
    saved = torch.load(run / "masks.pt", weights_only=False)
    if saved.get("mask_unit", "direction") != "direction":
        raise ValueError(f"{run}: mask_unit {saved['mask_unit']!r}; only per-direction runs can be re-cut")
    module = DirectionMaskModule(**config["model"]["init_args"]).eval()
    dm = TaskDataModule(**config["data"]["init_args"])
    with torch.no_grad():  # theta = logit(lambda): the run's lambdas exactly up to float rounding
        for c in module.components:
            module.theta[_key(c.name)].copy_(torch.logit(saved["lambdas"][c.name].double()).float())
    thresholds = sorted(args.thresholds)
    module.components_to_device()
    means: dict[tuple, MeanMetric] = {}  # (split, "full" / "soft" / threshold, score) -> mean over prompts
    for split in ("val", "test"):
        loader = getattr(dm, f"{split}_dataloader")()
        module.task = loader.dataset.task
        for batch in tqdm(loader, desc=f"{split} batches"):  # full, reference and soft once per batch
            batch = {k: v.to(module.device) for k, v in batch.items()}
            for key, scores in module.batch_scores(batch, thresholds).items():
                for name, values in scores.items():
                    means.setdefault((split, key, name), MeanMetric()).update(values)
    mean = {k: float(m.compute()) for k, m in means.items()}
    rows = []
    for t in thresholds:
        module.threshold = t
        row = {"threshold": t, "kept_fraction": module.kept()["kept_fraction"]}
        for split in ("val", "test"):
            row[split] = {
                "kl_hard": mean[split, t, "kl"],
                "kl_soft": mean[split, "soft", "kl"],
                "accuracy_hard": mean[split, t, "correct"],
                "metric_hard": mean[split, t, "metric"],
                "metric_full": mean[split, "full", "metric"],
            }
        rows.append(row)
        print(
            f"threshold {t:g}: kept {100 * row['kept_fraction']:.2f} %, kl_hard val {row['val']['kl_hard']:.3f}"
            f" test {row['test']['kl_hard']:.3f}",
            flush=True,
        )
    chosen = choose_threshold(rows, args.max_kl)
    results = {
        "experiment": "mask_thresholds",
        "source": str(run),
        "max_kl": args.max_kl,
        "chosen_on": "val",
        "rows": rows,
        "chosen": chosen,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        "chosen on validation: "
        + (
            f"threshold {chosen['threshold']:g}, kept {100 * chosen['kept_fraction']:.2f} %,"
            f" test kl_hard {chosen['test']['kl_hard']:.3f}"
            if chosen
            else "none"
        )
    )
    print(f"figure: {plot_thresholds(results, out / 'mask_thresholds.png')}")
    return results


def plot_thresholds(results: dict, path: Path) -> Path:
    """Hard-mask KL against kept fraction over the thresholds, validation and test, the choice ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    kept = [100 * r["kept_fraction"] for r in rows]
    for split, style in (("val", "o--"), ("test", "s-")):
        ax.plot(kept, [r[split]["kl_hard"] for r in rows], style, label=f"{split} hard-mask KL")
    for r, x in zip(rows, kept):
        ax.annotate(
            f"{r['threshold']:g}", (x, r["test"]["kl_hard"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    if results["chosen"]:
        c = results["chosen"]
        ax.plot(
            100 * c["kept_fraction"],
            c["test"]["kl_hard"],
            "o",
            ms=12,
            mfc="none",
            color="k",
            label=f"chosen on val (KL <= {results['max_kl']:g})",
        )
    ax.axhline(results["max_kl"], color="grey", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("kept directions (%) at each lambda threshold (labels)")
    ax.set_ylabel("KL(full || hard-masked)")
    ax.set_title(f"hard masks re-cut from {'/'.join(Path(results['source']).parts[-3:])}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def compare_directions(args: argparse.Namespace) -> dict:
    """Follow the top singular directions of every QK / OV head (and MLP map) of model A into model B of the
    same architecture (two checkpoints, a base and a fine-tune): per matrix how many keep their identity
    (kept / block / lost, as tracking over training steps), their cosines and singular-value ratios;
    results.json and compare_directions.png in --out."""
    from lit_svd.analysis.spectrum import layer_kinds, layer_svds
    from lit_svd.analysis.tracking import compare_svds
    from lit_svd.linalg import SVD
    from lit_svd.models import view as make_view
    from lit_svd.models.loading import load_causal_lm

    views = [
        make_view(load_causal_lm(m, gguf_file=g)[0])
        for m, g in ((args.model_a, args.gguf_a), (args.model_b, args.gguf_b))
    ]
    shapes = [(v.model_type, v.n_layers, v.n_heads, v.d_model) for v in views]
    if shapes[0] != shapes[1]:
        raise ValueError(
            f"model A is {shapes[0]} and model B {shapes[1]} (type, layers, heads, d_model): "
            "directions can only be compared between models of one architecture"
        )
    unknown = [k for k in args.kinds if k not in layer_kinds(views[0])]
    if unknown:
        raise ValueError(
            f"kinds {unknown} are not matrices of this model; choose from {', '.join(layer_kinds(views[0]))}"
        )
    layers = list(range(views[0].n_layers)) if args.layers is None else args.layers
    rows = []
    for layer in tqdm(layers, desc="compare layers"):
        with torch.no_grad():  # only the asked-for matrices
            a, b = (layer_svds(v, views[0].check_layer(layer), args.kinds) for v in views)
        for kind in args.kinds:
            batched = a[kind].S.dim() == 2
            for head in range(a[kind].S.shape[0]) if batched else [None]:
                pick = (lambda s: SVD(s.U[head], s.S[head], s.V[head])) if batched else (lambda s: s)
                ref, new = pick(a[kind]), pick(b[kind])
                step = compare_svds(ref, new, args.top, args.rel_gap, args.min_cos)
                n = len(step.sigma)
                ratio = [step.sigma[i] / float(ref.S[i]) if float(ref.S[i]) > 0 else float("nan") for i in range(n)]
                rows.append(
                    {
                        "matrix": kind,
                        "layer": layer,
                        "head": head,
                        **step.as_dict(),
                        "sigma_ref": ref.S[:n].tolist(),
                        "sigma_ratio": ratio,
                    }
                )
    summary = {}
    for kind in args.kinds:
        mine = [r for r in rows if r["matrix"] == kind]
        total = sum(len(r["state"]) for r in mine)
        summary[kind] = {
            "matrices": len(mine),
            "directions": total,
            **{s: sum(r[f"n_{s}"] for r in mine) for s in ("kept", "block", "lost")},
        }
    results = {
        "experiment": "compare_directions",
        "model_a": args.model_a,
        "model_b": args.model_b,
        "top": args.top,
        "rel_gap": args.rel_gap,
        "min_cos": args.min_cos,
        "summary": summary,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results))
    for kind, s in summary.items():
        print(
            f"{kind}: of {s['directions']} top directions in {s['matrices']} matrices, {s['kept']} kept, "
            f"{s['block']} carried as blocks, {s['lost']} lost",
            flush=True,
        )
    print(f"figure: {plot_compare(results, out / 'compare_directions.png')}")
    return results


def plot_compare(results: dict, path: Path) -> Path:
    """Per kind, layers x heads: the fraction of the top directions that keep their identity (kept or block)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(results["summary"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.2 * len(kinds) + 1, 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        mine = [r for r in results["rows"] if r["matrix"] == kind]
        layers = sorted({r["layer"] for r in mine})
        heads = sorted({r["head"] or 0 for r in mine})
        grid = np.full((len(layers), len(heads)), np.nan)
        for r in mine:
            grid[layers.index(r["layer"]), heads.index(r["head"] or 0)] = (r["n_kept"] + r["n_block"]) / len(r["state"])
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_title(f"{kind}: top {results['top']} directions held", fontsize=9)
        ax.set_xlabel("head" if len(heads) > 1 else "")
        ax.set_xticks(range(len(heads)) if len(heads) > 1 else [])
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(layers)), layers, fontsize=6)
    fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03)
    fig.suptitle(f"{Path(results['model_a']).name} -> {Path(results['model_b']).name}", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m lit_svd.cli_tools", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help=evaluate.__doc__)
    ev.add_argument("--task", nargs="+", default=["ioi"])
    ev.add_argument("--model", default="smollm2-135m")
    ev.add_argument("--n-test", type=int, default=256)
    ev.add_argument("--batch-size", type=int, default=32)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--prepend-bos", action="store_true", help="BOS first (Gemma models expect it)")
    ev.add_argument("--figure", default=None, help="PNG path: per-example value histograms, clean vs corrupt")
    ev.set_defaults(run=evaluate)
    mc = sub.add_parser("mask-curve", help=mask_curve.__doc__)
    mc.add_argument("runs", nargs="+", help="run folders (or results.json files)")
    mc.add_argument("--out", default="masks_sparsity_kl.png", help="figure path")
    mc.set_defaults(run=mask_curve)
    mb = sub.add_parser("mask-blocks", help=mask_blocks.__doc__)
    mb.add_argument(
        "folder", metavar="RUN", help="a finished direction-mask run folder (config.yaml, masks.pt, results.json)"
    )
    mb.add_argument("--out", required=True, help="new output folder")
    mb.add_argument(
        "--rel-gaps",
        type=float,
        nargs="+",
        default=[0.05, 0.02, 0.01],
        help="relative gaps; the first is the one of kept_directions and blocks.json",
    )
    mb.set_defaults(run=mask_blocks)
    mt = sub.add_parser("mask-thresholds", help=mask_thresholds.__doc__)
    mt.add_argument("folder", metavar="RUN", help="a finished direction-mask run folder (config.yaml, masks.pt)")
    mt.add_argument("--out", required=True, help="new output folder")
    mt.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=[1e-3, 1e-2, 3e-2, 0.1, 0.3, 0.5],
        help="lambda thresholds to cut the hard masks at",
    )
    mt.add_argument(
        "--max-kl",
        type=float,
        default=0.25,
        help="the choice: the largest threshold whose validation hard-mask KL is at most this",
    )
    mt.set_defaults(run=mask_thresholds)
    cd = sub.add_parser("compare-directions", help=compare_directions.__doc__)
    cd.add_argument("model_a", help="reference model: hub name, local folder or GGUF file")
    cd.add_argument("model_b", help="model of the same architecture whose directions are matched to A's")
    cd.add_argument("--gguf-a", default=None, help="GGUF file name inside model_a's repository or folder")
    cd.add_argument("--gguf-b", default=None, help="GGUF file name inside model_b's repository or folder")
    cd.add_argument("--out", required=True, help="new output folder")
    cd.add_argument("--kinds", nargs="+", default=["qk", "ov"], help="qk, ov, mlp_in, mlp_gate, mlp_out")
    cd.add_argument("--layers", type=int, nargs="+", default=None, help="default: every layer")
    cd.add_argument("--top", type=int, default=8, help="top directions of A followed per matrix")
    cd.add_argument("--rel-gap", type=float, default=0.05, help="relative gap of a block (linalg.REL_GAP)")
    cd.add_argument("--min-cos", type=float, default=0.9, help="|cos| below which a direction is lost")
    cd.set_defaults(run=compare_directions)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    main()
