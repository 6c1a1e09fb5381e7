"""Command-line tools beside the LightningCLI (``cli.py``), each a subcommand of ``lit-svd`` / ``python -m lit_svd``
(``lit_svd.registry.TOOLS``; from Python: ``lit_svd.tool(name, ...)`` or ``run_tool(argv)``):

    lit-svd evaluate --task ioi gp gt --n-test 256 [--out DIR] [--figure tasks.png]
    lit-svd mask-curve runs/masks_a* [--out DIR | curve.png]
    lit-svd mask-blocks RUN --out DIR [--rel-gaps 0.01 0.02 0.05]
    lit-svd mask-thresholds RUN --out DIR [--thresholds 1e-3 0.01 0.1 0.5] [--max-kl 0.25]
    lit-svd compare-directions MODEL_A MODEL_B --out DIR [--kinds qk ov] [--top 8]
    lit-svd mounts-merge RUN_A RUN_B ... --out DIR

Each tool writes its typed result (``lit_svd.results``) as results.json, its table as CSV and its figure
into its output; runs are read through ``lit_svd.runs``, figures drawn by ``lit_svd.figures``. Errors a
user can fix end in two lines on stderr (the message, naming the option; then a hint), exit code 2, as in
``python -m lit_svd``; ``--debug`` (or ``LIT_SVD_DEBUG=1``) shows the traceback instead.

``evaluate`` runs a model on the test split of one or more tasks (``TaskDataModule``) and prints each
task's clean and corrupted metrics as JSON (``lit_svd.metrics.evaluate_task``); with ``--out DIR`` it
also writes results.json, tasks.csv and tasks.png there. ``mask-curve`` reads the
results.json of several direction-mask runs (e.g. one per alpha), prints one row per run (alpha, kept
fraction, hard and soft KL, task metric and accuracy with hard masks) sorted by alpha, and draws the
final hard-mask points with each run's trajectory behind them (``--out DIR``: results.json, mask_curve.csv
and mask_curve.png there; ``--out X.png``: the figure there, X.json beside it). ``mask-blocks`` annotates a finished
direction-mask run (its config.yaml, masks.pt and results.json; nothing is retrained or written there)
with the blocks of near-equal singular values of its components, at one or more ``rel_gap``: writes
results.json (kept directions isolated vs in blocks per kind and gap; kept directions and block-level
claims, receptors and steering rows with their block fields), blocks.json and mask_blocks.png into DIR.
``mask-thresholds`` re-cuts a run's hard masks at several lambda thresholds (soft-trained runs leave many
lambdas small but above 1e-3) and evaluates each on the validation and test splits; the threshold is
chosen on validation only. ``compare-directions`` follows the top singular directions of every head of
one model into another of the same architecture (kept / block / lost, as tracking over training steps).
``mounts-merge`` joins mounts runs over disjoint layers of one model with the same settings (a large model
scored a group of layers per process, ``layers``) into the one table of a whole run: results.json with the pass
tables and the real-against-null test recomputed over every site-layer, sites.csv and the depth figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

import lit_svd.figures  # noqa: F401  (registers every result type's figures: result.figures)
from lit_svd import PROG as LIT_SVD
from lit_svd.errors import debug as debug_wanted
from lit_svd.errors import fail, fail_with
from lit_svd.models.loading import ModelUnavailableError
from lit_svd.output import figure_png, write_json, write_text
from lit_svd.results import (
    CompareDirectionsResult,
    EvaluateResult,
    MaskBlocksResult,
    MaskCurveResult,
    MaskThresholdsResult,
    MountsResult,
    Provenance,
    Result,
)
from lit_svd.runs import find_results, load_run

COLUMNS = ("alpha", "kept_fraction", "kl_hard", "kl_soft", "logit_diff_hard", "accuracy_hard", "steps")
PROG = LIT_SVD  # the tools are subcommands of the one command line
DEBUG_ENV = "LIT_SVD_DEBUG"


class ToolError(ValueError):
    """A bad option or input of a tool (its message names the option)."""


def save(result: Result, out: Path, args: argparse.Namespace) -> Path:
    """Write ``result`` (provenance: the tool's arguments) and its figures into ``out``; returns results.json."""
    result.provenance = Provenance.collect(config={"tool": args.command, **_args(args)}, seeds=_seeds(args))
    path = result.save(out)
    for name, fig in result.figures.items():
        write_png(out / f"{name}.png", fig)
    return path


def write_png(path: Path, fig) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(figure_png(fig, dpi=120))
    os.replace(tmp, path)
    return path


def _args(args: argparse.Namespace) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("run", "command")}


def _seeds(args: argparse.Namespace) -> dict:
    return {"data": args.seed} if getattr(args, "seed", None) is not None else {}


def new_folder(out: str | Path, run: Path | None = None) -> Path:
    """``--out``: a folder to write into, not the (read-only) run folder."""
    out = Path(out)
    if run is not None and out.resolve() == run.resolve():
        raise ToolError(f"--out {out} is the run folder; give a new folder (the run is read only)")
    return out


# --- mask-curve ------------------------------------------------------------------------------------------
def load_runs(paths: Sequence[str | Path]) -> list[dict]:
    """The results.json of each run folder (searched recursively; a results.json path also works),
    labelled by folder and sorted by alpha. Runs of another experiment fail in one line."""
    runs = [{"label": label, **res.to_dict()} for label, res in find_results(paths, "direction_mask")]
    return sorted(runs, key=lambda r: (r["alpha"], r["label"]))


def table(runs: Sequence[dict]) -> str:
    """A plain-text table of ``COLUMNS`` per run."""
    rows = ["run  " + "  ".join(f"{c:>15}" for c in COLUMNS)]
    for r in runs:
        rows.append(f"{r['label']}\n     " + "  ".join(f"{r.get(c, float('nan')):>15.4g}" for c in COLUMNS))
    return "\n".join(rows)


CURVE_KEYS = (*COLUMNS, "eval_split", "trajectory_split", "task", "model", "trajectory")


def mask_curve(args: argparse.Namespace) -> MaskCurveResult:
    """Tabulate and plot the sparsity-KL curve of several direction-mask runs."""
    runs = load_runs(args.runs)
    print(table(runs))
    result = MaskCurveResult(runs=[{"label": r["label"], **{k: r[k] for k in CURVE_KEYS if k in r}} for r in runs])
    out = Path(args.out)
    if out.suffix == ".png":  # the figure at --out, the results beside it
        result.provenance = Provenance.collect(config={"tool": args.command, **_args(args)})
        write_text(out.with_suffix(".json"), result.to_json())
        print(f"figure: {write_png(out, result.figures['mask_curve'])}")
    else:
        save(result, out, args)
        print(f"results: {out / 'results.json'}; figure: {out / 'mask_curve.png'}")
    return result


# --- evaluate --------------------------------------------------------------------------------------------
def evaluate(args: argparse.Namespace) -> EvaluateResult:
    """Evaluate a model on the test split of one or more tasks through ``TaskDataModule``; print JSON."""
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import evaluate_task
    from lit_svd.models.loading import load_causal_lm

    if args.n_test < 1:
        raise ToolError(f"--n-test {args.n_test}: give at least one test prompt")
    model, tokenizer = load_causal_lm(args.model)
    tasks = []
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
        values: dict = {}
        row = {
            "task": task,
            "model": args.model,
            "n_test": args.n_test,
            "seed": args.seed,
            "prepend_bos": args.prepend_bos,
            **evaluate_task(model, dm.test_dataloader(), task, per_example=values),
        }
        print(json.dumps(row, indent=2), flush=True)
        row["values"] = {kind: torch.cat(v).tolist() for kind, v in values.items()}
        tasks.append(row)
    result = EvaluateResult(model=args.model, tasks=tasks)
    if args.out:
        save(result, new_folder(args.out), args)
    if args.figure:
        write_png(Path(args.figure), result.figures["tasks"])
    return result


# --- mask-blocks -----------------------------------------------------------------------------------------
def mask_blocks(args: argparse.Namespace) -> MaskBlocksResult:
    """Annotate a finished direction-mask run with the blocks of its components (nothing is retrained)."""
    from lit_svd.analysis.blocks import block_report, component_blocks, direction_block, kept_blocks
    from lit_svd.analysis.masks import hard_masks
    from lit_svd.models.intervene import build_components
    from lit_svd.models.loaded import ModelOptions, load_model

    run = load_run(args.folder, need=("config", "masks", "results"), what="direction-mask run")
    out = new_folder(args.out, run.folder)
    hp = run.init_args("model")
    saved, source = run.masks, run.result
    options = ModelOptions(**{k: hp[k] for k in ModelOptions().as_dict() if k in hp})  # the run's loading options
    comps = build_components(load_model(options).view(), hp["components"], hp.get("layers"), progress=True)
    hard = hard_masks(saved["lambdas"], saved["threshold"])
    keep = {c.name: hard[c.name].bool() for c in comps}
    result = MaskBlocksResult(
        source=str(run.folder), model=hp["model"], kept=source.kept, rel_gaps=list(args.rel_gaps), per_gap=[]
    )
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
            "receptors": [{**r, **at(f"L{r['layer']}.ov", r["head"], r["direction"])} for r in source.receptors],
        }
        if source.steering:
            st = source.steering
            entry["steering"] = {**st, **at(st["component"], st["head"], st["direction"])}
        if source.steering_swap:
            entry["steering_swap_directions"] = [
                {**r, **at(r["component"], r["head"], r["direction"])} for r in source.steering_swap["directions"]
            ]
        if i == 0:
            result.kept_directions, result.kept_blocks = kb["directions"], kb["blocks"]
            result.directions_rel_gap, result.blocks_file = gap, "blocks.json"
            write_json(out / "blocks.json", report, indent=None)
        result.per_gap.append(entry)
        print(
            f"rel_gap {gap}: {kb['isolated']} of {kb['kept']} kept directions isolated; "
            + ", ".join(f"{k} {v['isolated']}/{v['kept']}" for k, v in kb["per_kind"].items()),
            flush=True,
        )
    save(result, out, args)
    print(f"figure: {out / 'mask_blocks.png'}")
    return result


# --- mask-thresholds -------------------------------------------------------------------------------------
def choose_threshold(rows: Sequence[dict], max_kl: float) -> dict | None:
    """The sparsest row (largest ``threshold``) whose *validation* hard-mask KL is at most ``max_kl``;
    None when no threshold qualifies. Test figures play no part in the choice."""
    ok = [r for r in rows if r["val"]["kl_hard"] <= max_kl]
    return max(ok, key=lambda r: r["threshold"]) if ok else None


def mask_thresholds(args: argparse.Namespace) -> MaskThresholdsResult:
    """Re-cut the hard masks of a finished direction-mask run at several lambda thresholds (nothing is
    retrained): kept fraction and hard / soft scores on the validation and the test split per threshold,
    the threshold chosen on validation, its test figures; results.json and mask_thresholds.png in --out."""
    from torchmetrics import MeanMetric

    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules.direction_mask import DirectionMaskModule, _key

    if any(not 0 < t < 1 for t in args.thresholds):
        raise ToolError(f"--thresholds {args.thresholds}: every threshold must lie in (0, 1)")
    run = load_run(args.folder, need=("config", "masks"), what="direction-mask run")
    out = new_folder(args.out, run.folder)
    saved = run.masks
    if saved.get("mask_unit", "direction") != "direction":
        raise ToolError(f"{run.folder}: mask_unit {saved['mask_unit']!r}; only per-direction runs can be re-cut")
    module = DirectionMaskModule(**run.init_args("model")).eval()
    dm = TaskDataModule(**run.init_args("data"))
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
    result = MaskThresholdsResult(
        source=str(run.folder), max_kl=args.max_kl, chosen_on="val", thresholds=rows, chosen=chosen
    )
    save(result, out, args)
    print(
        "chosen on validation: "
        + (
            f"threshold {chosen['threshold']:g}, kept {100 * chosen['kept_fraction']:.2f} %,"
            f" test kl_hard {chosen['test']['kl_hard']:.3f}"
            if chosen
            else "none"
        )
    )
    print(f"figure: {out / 'mask_thresholds.png'}")
    return result


# --- compare-directions ----------------------------------------------------------------------------------
def compare_directions(args: argparse.Namespace) -> CompareDirectionsResult:
    """Follow the top singular directions of every QK / OV head (and MLP map) of model A into model B of the
    same architecture (two checkpoints, a base and a fine-tune): per matrix how many keep their identity
    (kept / block / lost, as tracking over training steps), their cosines and singular-value ratios;
    results.json and compare_directions.png in --out."""
    from lit_svd.analysis.spectrum import layer_kinds, layer_svds
    from lit_svd.analysis.tracking import compare_svds
    from lit_svd.linalg import SVD
    from lit_svd.models.loaded import ModelOptions, load_model

    for name, value in (("--top", args.top), ("--rel-gap", args.rel_gap), ("--min-cos", args.min_cos)):
        if value <= 0 or (name != "--top" and value >= 1):
            raise ToolError(f"{name} {value}: must be {'a positive integer' if name == '--top' else 'in (0, 1)'}")
    pairs = ((args.model_a, args.gguf_a), (args.model_b, args.gguf_b))
    views = [load_model(ModelOptions(m, g)).view() for m, g in pairs]
    shapes = [(v.model_type, v.n_layers, v.n_heads, v.d_model) for v in views]
    if shapes[0] != shapes[1]:
        raise ToolError(
            f"model A is {shapes[0]} and model B {shapes[1]} (type, layers, heads, d_model): "
            "directions can only be compared between models of one architecture"
        )
    unknown = [k for k in args.kinds if k not in layer_kinds(views[0])]
    if unknown:
        raise ToolError(
            f"--kinds {unknown} are not matrices of this model; choose from {', '.join(layer_kinds(views[0]))}"
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
    per_kind = {}
    for kind in args.kinds:
        mine = [r for r in rows if r["matrix"] == kind]
        total = sum(len(r["state"]) for r in mine)
        per_kind[kind] = {
            "matrices": len(mine),
            "directions": total,
            **{s: sum(r[f"n_{s}"] for r in mine) for s in ("kept", "block", "lost")},
        }
    result = CompareDirectionsResult(
        model_a=args.model_a,
        model_b=args.model_b,
        top=args.top,
        rel_gap=args.rel_gap,
        min_cos=args.min_cos,
        per_kind=per_kind,
        matrices=rows,
    )
    out = Path(args.out)
    save(result, out, args)
    for kind, s in per_kind.items():
        print(
            f"{kind}: of {s['directions']} top directions in {s['matrices']} matrices, {s['kept']} kept, "
            f"{s['block']} carried as blocks, {s['lost']} lost",
            flush=True,
        )
    print(f"figure: {out / 'compare_directions.png'}")
    return result


# --- mounts-merge ------------------------------------------------------------------------------------------
def mounts_merge(args: argparse.Namespace) -> MountsResult:
    """Join mounts runs over disjoint layers of one model (same settings) into one whole-run table."""
    from lit_svd.analysis.mounts_tables import mounts_result

    parts = find_results(args.runs, experiment="tiled_mounts")
    if len(parts) < 2:
        raise ToolError(
            f"mounts-merge needs two or more mounts runs; found {len(parts)} results.json under {args.runs}"
        )
    (label0, first), settings = parts[0], _merge_settings(parts[0][1])
    owner: dict[tuple[int, str], str] = {}
    for label, part in parts:
        other = _merge_settings(part)
        if other != settings:
            keys = sorted(k for k in settings.keys() | other.keys() if settings.get(k) != other.get(k))
            raise ToolError(
                f"{label}: its settings differ from {label0}'s in {', '.join(keys)}; only layers may differ"
            )
        for row in part.sites:
            key = (row["layer"], row["site"])
            if key in owner:
                raise ToolError(
                    f"{label}: layer {key[0]} {key[1]} is also in {owner[key]}; parts must score disjoint layers"
                )
            owner[key] = label
    site_order = list(dict.fromkeys(r["site"] for _, part in parts for r in part.sites))
    rows = sorted(
        (row for _, part in parts for row in part.sites), key=lambda r: (r["layer"], site_order.index(r["site"]))
    )
    result = mounts_result(
        rows,
        model=first.model,
        config={**first.config, "layers": sorted({r["layer"] for r in rows})},
        tile_widths=first.tile_widths,
    )
    out = Path(args.out)
    save(result, out, args)
    print(f"{len(parts)} runs, {len(rows)} site-layers; passing {result.n_pass} (null {result.n_pass_null})")
    print(f"results: {out / 'results.json'}")
    return result


def _merge_settings(result: MountsResult) -> dict:
    """What must agree between the parts of one mounts run: the model and every setting but ``layers``."""
    return {"model": result.model, **{k: v for k, v in result.config.items() if k != "layers"}}


# --- the command line ------------------------------------------------------------------------------------
class ToolParser(argparse.ArgumentParser):
    """Argument errors in the two-line form of ``python -m lit_svd`` (message, hint), exit code 2."""

    def error(self, message: str):
        fail(f"{message}", f"hint: `{self.prog} --help` lists every option")


def parser() -> argparse.ArgumentParser:
    p = ToolParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=ToolParser)
    ev = sub.add_parser("evaluate", help=evaluate.__doc__)
    ev.add_argument("--task", nargs="+", default=["ioi"], choices=["ioi", "gp", "gt"])
    ev.add_argument("--model", default="smollm2-135m")
    ev.add_argument("--n-test", type=int, default=256)
    ev.add_argument("--batch-size", type=int, default=32)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--prepend-bos", action="store_true", help="BOS first (Gemma models expect it)")
    ev.add_argument("--out", default=None, help="folder for results.json, tasks.csv and tasks.png")
    ev.add_argument("--figure", default=None, help="PNG path: per-example value histograms, clean vs corrupt")
    ev.set_defaults(run=evaluate)
    mc = sub.add_parser("mask-curve", help=mask_curve.__doc__)
    mc.add_argument("runs", nargs="+", help="run folders (or results.json files)")
    mc.add_argument("--out", default="masks_sparsity_kl.png", help="output folder, or a .png path for the figure")
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
    mm = sub.add_parser("mounts-merge", help=mounts_merge.__doc__)
    mm.add_argument("runs", nargs="+", help="mounts run folders (or results.json files) over disjoint layers")
    mm.add_argument("--out", required=True, help="new output folder")
    mm.set_defaults(run=mounts_merge)
    return p


def run_tool(argv: Sequence[str] | None = None) -> Result:
    """Parse ``argv`` and run the tool; errors are raised (``main`` turns them into two lines)."""
    args = parser().parse_args(argv)
    return args.run(args)


def main(argv: Sequence[str] | None = None) -> Result | None:
    """The command line: ``run_tool`` with a user's errors in two lines (message, hint) and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or debug_wanted()
    argv = [a for a in argv if a != "--debug"]
    try:
        return run_tool(argv)
    except (ValueError, FileNotFoundError, ModelUnavailableError) as err:
        if debug:
            raise
        fail_with(err)  # the CLI's two lines: the message, then its hint


if __name__ == "__main__":  # the old door: one line saying where the tools are now
    fail(f"python -m lit_svd.cli_tools is now {PROG} <tool>", f"hint: {PROG} {' '.join(sys.argv[1:])}")
