"""Faithfulness curves of SmolLM2 IOI circuits (issue 24 item 4): head-level attribution patching, a mask run's
lambdas, three random rankings and (with ``--graph-run``) a circuit graph, scored with one ablation on the same
test prompts and sizes (lit_svd.analysis.faithfulness). Prints one JSON object (curves, CPR / CMD, seconds per
curve) and, with ``--out``, writes it and a figure of the curves there.

    OMP_NUM_THREADS=1 heavy python bench/faithfulness_bench.py --mask-run runs/mask60/lightning_logs/version_0 \
        --n-test 64 --out runs/faithfulness_bench

The prompts are the mask run's test split (its config.yaml's data section, ``n_test`` prompts from its start: the
split is drawn last there, so a shorter one is a prefix of it); the mask never trained on them. ``--split val``
scores its validation split instead (all of it, the config's ``n_val``): where a mask's settings are chosen. The
attribution (EAP) and the graph are computed on these same prompts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mask-run", required=True, help="folder of a finished SmolLM2 IOI direction-mask run")
    p.add_argument("--graph-run", default=None, help="folder of a finished circuit-graph run (results.json)")
    p.add_argument("--n-test", type=int, default=64)
    p.add_argument("--split", choices=["test", "val"], default="test", help="the mask run's split to score on")
    p.add_argument(
        "--mask-rank-by",
        nargs="+",
        choices=["saved", "lambda", "logit"],
        default=["saved"],
        help="the mask ranking read from all the run saved (last_kept, logit), from its lambdas alone or its logits"
        " alone; several give one curve each (mask, mask_lambda, mask_logit)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=["eap_heads", "mask", "graph", "random"])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)

    from lit_svd.analysis.attribution import attributions
    from lit_svd.analysis.faithfulness import MIB_SIZES, Universe, faithfulness_curves, universe_components
    from lit_svd.analysis.rankings import eap_ranking, mask_ranking, random_ranking
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.models import load_causal_lm
    from lit_svd.models import view as make_view
    from lit_svd.runs import load_run

    t0 = time.monotonic()
    mask = load_run(args.mask_run, need=("config", "masks"), what="direction-mask run")
    data = {**mask.init_args("data"), "n_test": args.n_test, "batch_size": args.batch_size}
    data.pop("num_workers", None)
    model, tok = load_causal_lm(mask.masks["model"])
    for param in model.parameters():
        param.requires_grad_(False)
    view = make_view(model)
    dm = TaskDataModule(**data)
    batches = list(dm.test_dataloader() if args.split == "test" else dm.val_dataloader())
    comps = universe_components(view, progress=True)
    universe = Universe(comps)
    timing = {"load_and_svds_s": time.monotonic() - t0}

    rankings, info = {}, {}
    if "eap_heads" in args.methods:
        t = time.monotonic()
        attr = attributions(view, batches, data["task"])
        timing["eap_attribution_s"] = time.monotonic() - t
        rankings["eap_heads"], info["eap_heads"] = eap_ranking(universe, attr, view.n_kv_heads)
    if "mask" in args.methods:
        keys = {"saved": None, "lambda": ("lambdas", "threshold"), "logit": ("lambdas", "logits", "threshold")}
        for by in args.mask_rank_by:
            name = "mask" if by == "saved" else f"mask_{by}"
            state = mask.masks if keys[by] is None else {k: mask.masks[k] for k in keys[by] if k in mask.masks}
            rankings[name], info[name] = mask_ranking(universe, state)
    from lit_svd.analysis.rankings import GRAPH_RANKINGS, run_graph_ranking

    for m, mlp_inputs in GRAPH_RANKINGS.items() if args.graph_run else ():
        if m in args.methods:
            rankings[m], info[m] = run_graph_ranking(universe, args.graph_run, view, mlp_inputs=mlp_inputs)
    for s in args.seeds if "random" in args.methods else []:
        rankings[f"random_{s}"] = random_ranking(len(universe), s)

    curves, summary = faithfulness_curves(view, comps, batches, rankings, data["task"], MIB_SIZES, progress=True)
    rows = {name: c.row() for name, c in curves.items()}
    randoms = [r for name, r in rows.items() if name.startswith("random_")]
    cprs = torch.tensor([r["cpr"] for r in randoms], dtype=torch.float64)
    cmds = torch.tensor([r["cmd"] for r in randoms], dtype=torch.float64)
    out = {
        "model": mask.masks["model"],
        "task": data["task"],
        "n_prompts": summary["n_prompts"],
        "n_directions": summary["n_directions"],
        "m_full": summary["m_full"],
        "m_empty": summary["m_empty"],
        "curves": rows,
        "random": {
            "cpr_mean": float(cprs.mean()),
            "cpr_std": float(cprs.std()),
            "cmd_mean": float(cmds.mean()),
            "cmd_std": float(cmds.std()),
        }
        if len(randoms) > 1
        else None,
        "rankings": info,
        "timing": {
            **timing,
            "curves_wall_s": summary["wall_s"],
            "per_curve_s": {k: r["seconds"] for k, r in rows.items()},
        },
        "split": args.split,
        "mask_run": str(args.mask_run),
        "graph_run": args.graph_run,
    }
    print(json.dumps(out, indent=1))
    if args.out:
        from lit_svd.output import write_json

        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "faithfulness.json", out)
        from lit_svd.figures.faithfulness import curves_figure

        fig = curves_figure(rows, f"SmolLM2-135M IOI, {summary['n_prompts']} test prompts: faithfulness by size")
        fig.savefig(folder / "faithfulness.png", dpi=130, bbox_inches="tight")


if __name__ == "__main__":
    main()
