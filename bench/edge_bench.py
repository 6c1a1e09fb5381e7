"""Cost of edge circuits on a real model (issue 33 item 5): the edge universe (SVDs), EAP-IG edge attribution over
training prompts and one edge curve over test prompts, on one thread; prints one JSON object with the seconds,
the seconds of each curve point, the edge counts and the peak memory (``ru_maxrss``), each curve's CPR / CMD with
its bootstrap interval over the prompts and the paired intervals against the head-level curves (``summary``), and,
with ``--out``, writes it there (after the attribution and after each curve: the curves are scored one at a time).

    OMP_NUM_THREADS=1 python bench/edge_bench.py --task ioi --n-train 64 --n-test 64 --curve directions_signed_raw

The prompts: ``TaskDataModule(task, n_train=1000, n_val=64, n_test=64, test_last=True, seed=0)`` (the faithfulness
configs' split), or with ``--config`` an edge-circuit config's model and data section (its split: Gemma-3's
``n_test: 128, prepend_bos: true`` without ``test_last``, of which the config tests the first 64): the first
``--n-train`` prompts of its training split are scored, the first ``--n-test`` of the test split (its first
``--n-curve`` prompts if given; ``--curve-split val``: the validation split, to choose a ranking on) are curved.
The scores and the gains (``G = Rc W^T``, read by the edge ablation) go
to two temporary files, removed at the end, on an exception and on SIGTERM; the corrupted recordings and both ends
of the curves are computed once for all curves. ``--scores DIR`` keeps them in DIR instead (``scores.f32``,
``gains.f32``, the head-level scores ``units.npy`` and ``scores.json``: model, task, the training prompts (their
count and a digest of their batches), steps, edge counts, the units written), and a later run with the same DIR,
training prompts and options reads them back instead of attributing (the validation and test curves of one
attribution, or a longer test split: with ``test_last`` the training prompts do not change with ``--n-test``);
other options: it exits with one line naming what differs. Remove DIR yourself.

``--prune metric faithful``: edge pruning (``analysis.edge_pruning``) on the first ``--prune-n`` training prompts,
from the head-level scores, before the curves: curves ``pruned_signed_raw`` (``metric``) and ``pruned_abs_raw``
(``faithful``) with the others; ``--prune-level directions`` prunes direction edges (block, writer and reader
logits: curves ``prunedirs_signed_fair`` / ``prunedirs_abs_fair``, compared with the head-level ones in ``summary
["vs_pruned"]``); each run's options, seconds and objective per step in ``pruning``, the peak memory after them in
``pruning_peak_rss_gb``; the learned logits in ``OUT/logits_<curve>.pt``; a direction run's trained circuit also
through the hard path on 8 curved prompts (``pruning[<curve>]["hard_check"]``: the two metrics' largest difference).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import get_args

import torch

from lit_svd.analysis.edge_options import CutOrder, DirectionStep


def swapped_answers(batch: dict) -> dict:
    """The batch with every other prompt asking for the other answer (IOI, GP: correct and wrong swapped; GT: the
    greater and the lesser years): its metric there is the negative of the batch's, no consistent task left."""
    a, b = ("correct_id", "wrong_id") if "correct_id" in batch else ("greater_mask", "lesser_mask")
    swap = torch.arange(len(batch[a]), device=batch[a].device) % 2 == 1
    swap = swap.view(-1, *[1] * (batch[a].dim() - 1))
    return batch | {a: torch.where(swap, batch[b], batch[a]), b: torch.where(swap, batch[a], batch[b])}


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="ioi")
    p.add_argument(
        "--config", default=None, help="an edge-circuit config: its model and data split (for --model, --task)"
    )
    p.add_argument("--n-train", type=int, default=64)
    p.add_argument("--n-test", type=int, default=64)
    p.add_argument("--n-curve", type=int, default=None, help="curve the first N test prompts only (default: all)")
    p.add_argument("--curve-split", default="test", choices=["test", "val"], help="the split curved (val: choose)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--curve", nargs="*", default=["directions_signed_raw"], help="curves (edge_curves.curve_specs)")
    p.add_argument("--sizes", type=float, nargs="+", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--scores", default=None, help="keep the scores in this folder, or read them back from it")
    p.add_argument(
        "--prune", nargs="*", default=[], choices=["faithful", "metric"],
        help="edge pruning from the head-level scores (edge_pruning): faithful -> curve pruned_abs_raw, metric ->"
        " pruned_signed_raw",
    )  # fmt: skip
    p.add_argument(
        "--prune-level",
        nargs="+",
        default=["units"],
        choices=["units", "directions"],
        help="edge pruning's level: units (head-level blocks: pruned_*_raw) and / or directions (block, writer and"
        " reader direction logits, the fair axis: prunedirs_*_fair)",
    )
    p.add_argument("--prune-direction-start", type=float, default=0.5, help="edge pruning, directions: x, y start")
    p.add_argument(
        "--prune-direction-step",
        default="adam",
        choices=get_args(DirectionStep),
        help="edge pruning, directions: how x, y step (adam, or in proportion to the gradient: PruneOptions)",
    )
    p.add_argument("--prune-direction-lr", type=float, help="edge pruning, directions: x, y rate (default: --prune-lr)")
    p.add_argument(
        "--prune-order",
        nargs="+",
        default=["blocks"],
        choices=get_args(CutOrder),
        help="edge pruning, directions: the curve's order (edge_pruning.order_cut; the first also orders nested keeps'"
        " training); a second order adds the curve"
        " <name>_<order> of the same logits",
    )
    p.add_argument(
        "--prune-from",
        default=None,
        help="edge pruning: read the learned logits back from DIR/logits_<curve>.pt (an earlier run's --out) instead"
        " of training",
    )
    p.add_argument("--prune-n", type=int, default=16, help="edge pruning: the first N training prompts")
    p.add_argument(
        "--prune-chunk", type=int, default=None,
        help="edge pruning: prompts per forward and backward (default: all --prune-n; the same gradient, less memory)",
    )  # fmt: skip
    p.add_argument(
        "--prune-swap",
        action="store_true",
        help="the null: swap the answers (correct / wrong; GT: greater / lesser years) of every other pruning prompt"
        " (no consistent task left)",
    )
    p.add_argument("--prune-steps", type=int, default=40)
    p.add_argument("--prune-lr", type=float, default=0.05)
    p.add_argument(
        "--prune-keep", type=float, nargs="+", default=[0.2],
        help="edge pruning: the fraction(s) of blocks trained (several: nested circuits trained together)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="torch threads (the cost targets are one thread)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from lit_svd.analysis.edge_curves import exit_on_sigterm
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.models import load_causal_lm
    from lit_svd.models import view as make_view

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    split = data_split(args)
    out: dict = {"model": args.model, "task": args.task, "threads": torch.get_num_threads(), "split": split}
    t0 = time.monotonic()
    model, tok = load_causal_lm(args.model)
    for param in model.parameters():
        param.requires_grad_(False)
    view = make_view(model)
    dm = TaskDataModule(args.task, tok, **split, batch_size=args.batch_size)
    train = dm.splits["train"].examples[: args.n_train]
    train_batches = [dm.collate(train[i : i + args.batch_size]) for i in range(0, len(train), args.batch_size)]
    test = dm.splits[args.curve_split].examples[: args.n_curve or args.n_test]
    test_batches = [dm.collate(test[i : i + args.batch_size]) for i in range(0, len(test), args.batch_size)]
    out["load_s"] = time.monotonic() - t0
    with exit_on_sigterm():  # SIGTERM unwinds, so the score files go
        run(args, out, view, train_batches, test_batches, t0, say)


def data_split(args) -> dict:
    """The data module's split options: the faithfulness configs' (``--n-test`` test prompts, the last of the space),
    or ``--config``'s data section (then ``args.model`` and ``args.task`` become the config's)."""
    if args.config is None:
        return dict(n_train=1000, n_val=64, n_test=args.n_test, test_last=True, seed=0)
    import yaml

    config = yaml.safe_load(Path(args.config).read_text())
    data = dict(config["data"]["init_args"])
    args.model, args.task = config["model"]["init_args"]["model"], data.pop("task")
    split = {k: v for k, v in data.items() if k not in ("tokenizer", "batch_size")}
    if args.n_test > split.get("n_test", args.n_test):
        raise SystemExit(f"--n-test {args.n_test}: the config's test split has {split['n_test']} prompts")
    return split


def run(args, out: dict, view, train_batches: list, test_batches: list, t0: float, say) -> None:
    """The universe, then the scores and gains in two files removed however the run ends."""
    from lit_svd.analysis.edge_curves import ScoreFile
    from lit_svd.analysis.edges import EdgeUniverse

    out["n_curve_prompts"] = sum(len(b["answer_pos"]) for b in test_batches)

    t = time.monotonic()
    universe = EdgeUniverse(view)
    out["universe_s"], out["counts"] = time.monotonic() - t, universe.counts()
    say(f"universe {out['universe_s']:.1f} s, {out['counts']}, peak {peak_gb():.2f} GiB")

    t = time.monotonic()
    meta = score_meta(args, universe, train_batches)
    saved = saved_meta(args.scores, meta)
    keep = args.scores is not None
    store, gains = ScoreFile(universe, args.scores, keep=keep), ScoreFile(universe, args.scores, "gains", keep=keep)
    try:
        score_and_curve(args, out, universe, train_batches, test_batches, store, gains, t, t0, say, meta, saved)
    finally:
        store.close()
        gains.close()


def score_meta(args, universe, train_batches: list) -> dict:
    """What the scores depend on: model, task, the training batches (their count and a digest of their tensors, so
    that a longer test split drawn after them, ``test_last``, reads the same scores back), steps, the universe's edge
    counts."""
    return {"model": args.model, "task": args.task, "n_train": args.n_train,
            "train_prompts": sum(len(b["answer_pos"]) for b in train_batches),
            "train_digest": batches_digest(train_batches), "steps": args.steps,
            "counts": universe.counts()}  # fmt: skip


def batches_digest(batches: list) -> str:
    """SHA-256 of the batches' tensors (keys in order, dtype, shape and values): equal batches, equal digest."""
    import hashlib

    h = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            value = batch[key]
            h.update(f"{key}:{value.dtype}:{tuple(value.shape)}".encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def saved_meta(folder: str | None, meta: dict) -> dict | None:
    """The saved scores' description in ``folder`` if there is one and it matches ``meta`` (None: attribute);
    otherwise exit with one line naming what differs."""
    path = None if folder is None else Path(folder) / "scores.json"
    if path is None or not path.exists():
        return None
    saved = json.loads(path.read_text())
    for key, value in meta.items():
        if json.loads(json.dumps(value)) != saved.get(key):
            raise SystemExit(f"--scores {folder}: saved for {key}={saved.get(key)!r}, this run has {key}={value!r}")
    return saved


def save_scores(folder: str, meta: dict, scores, store, gains) -> None:
    """The head-level scores and the description next to the score files (the description last: it marks them
    complete)."""
    import numpy as np

    np.save(Path(folder) / "units.npy", scores.units.double().cpu().numpy())
    saved = {**meta, "prompts": scores.prompts, "written": sorted(store.written), "gains": sorted(gains.written)}
    (Path(folder) / "scores.json").write_text(json.dumps(saved))


def load_scores(folder: str, saved: dict, universe, store, gains):
    """The ``EdgeScores`` of ``save_scores``: the files' units marked written, the head-level scores read back."""
    import numpy as np

    from lit_svd.analysis.edge_attribution import EdgeScores

    store.written, gains.written = set(saved["written"]), set(saved["gains"])
    units = torch.from_numpy(np.load(Path(folder) / "units.npy")).to(universe.device)
    return EdgeScores(universe, store, units, saved["prompts"], saved["steps"])


def score_and_curve(args, out, universe, train_batches, test_batches, store, gains, t, t0, say, meta, saved) -> None:
    """EAP-IG attribution (scores and gains to their files; ``saved``: read back from ``--scores``), then each curve,
    written as soon as it is done."""
    from lit_svd.analysis.edge_ablation import EdgeAblation
    from lit_svd.analysis.edge_attribution import attribute
    from lit_svd.analysis.edge_curves import MIB_SIZES, curve_specs, edge_curves
    from lit_svd.modules.edge_circuits import summarize

    if saved is None:
        scores = attribute(universe, train_batches, args.task, steps=args.steps, store=store, gains=gains)
        if args.scores:
            save_scores(args.scores, meta, scores, store, gains)
    else:
        scores = load_scores(args.scores, saved, universe, store, gains)
        out["scores_read_back"] = args.scores
    out["attribution_s"], out["scores_gb"] = time.monotonic() - t, store.nbytes / 2**30
    out["gains_gb"] = gains.nbytes / 2**30
    out["peak_rss_after_attribution_gb"] = peak_gb()
    say(f"attribution {out['attribution_s']:.1f} s{' (read back)' if saved else ''}, peak {peak_gb():.2f} GiB")
    write(out, args.out)

    ablation = EdgeAblation(universe, args.task, gains=gains)
    sizes = args.sizes or MIB_SIZES
    specs = curve_specs(universe, scores, args.curve)
    specs |= pruned_specs(args, out, ablation, train_batches, test_batches, scores.units, say)
    out["curves"] = {}
    ends: dict = {}  # the corrupted recordings and both ends, computed once for every curve
    for name, spec in specs.items():  # one curve at a time, each written as soon as it is done
        curves, info = edge_curves(ablation, test_batches, {name: spec}, sizes, progress=lambda m: say(m), ends=ends)
        out["curves"][name] = curves[name].row()
        out["info"] = info
        out["peak_rss_gb"] = peak_gb()
        out["wall_s"] = time.monotonic() - t0
        out["summary"] = summarize(out["curves"], info)  # with the paired intervals against head-level edges
        c = curves[name]
        say(f"{name}: CPR {c.cpr:.3f} {c.cpr_ci} CMD {c.cmd:.3f} {c.cmd_ci}, {c.seconds:.0f} s")
        write(out, args.out)
    print(json.dumps(out, indent=1))


def pruned_specs(args, out: dict, ablation, train_batches: list, test_batches: list, units, say) -> dict:
    """Edge pruning (``--prune``) on the first ``--prune-n`` training prompts from the head-level scores ``units``
    (``edge_pruning.pruned_curves``): the curves' specs; the runs (options, seconds, objective per step) and the
    peak memory after them in ``out["pruning"]``."""
    from lit_svd.analysis.edge_options import PruneOptions
    from lit_svd.analysis.edge_pruning import CURVE_OF, DIRECTION_CURVE_OF, direction_spec, pruned_curves

    if not args.prune:
        return {}
    batch = train_batches[0]
    if len(batch["answer_pos"]) < args.prune_n:
        raise SystemExit(f"--prune-n {args.prune_n}: needs --batch-size and --n-train of at least that")
    batch = {k: v[: args.prune_n] for k, v in batch.items()}  # the first prompts (padding kept: masked)
    if args.prune_swap:  # the label-swapped null
        batch = swapped_answers(batch)
        out["prune_swap"] = True
    start = args.prune_direction_start
    options = PruneOptions(
        steps=args.prune_steps, lr=args.prune_lr, keep=args.prune_keep, direction_start=start,
        direction_order=args.prune_order[0], direction_step=args.prune_direction_step,
        direction_lr=args.prune_direction_lr,
    )  # fmt: skip
    of = {"units": CURVE_OF, "directions": DIRECTION_CURVE_OF}
    names = [of[level][objective] for level in args.prune_level for objective in args.prune]
    learned: dict = {}

    def save(name, logits):
        learned[name] = logits
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            torch.save(logits, Path(args.out) / f"logits_{name}.pt")

    trained = {n: torch.load(Path(args.prune_from) / f"logits_{n}.pt") for n in names} if args.prune_from else {}
    if trained:
        say(f"prune: logits of {', '.join(trained)} read back from {args.prune_from}")
    specs, out["pruning"] = pruned_curves(
        ablation, batch, units.cpu(), names, options, lambda m: say(f"prune {m}"), save, trained, args.prune_chunk
    )
    for name, logits in learned.items():
        if isinstance(logits, tuple):  # direction level: the other curve orders, the soft path against the hard one
            for order in args.prune_order[1:]:
                specs[f"{name}_{order}"] = direction_spec(ablation.u, *logits, order=order)
            out["pruning"][name]["hard_check"] = hard_check(ablation, test_batches[0], logits, 8)
            say(f"prune {name}: soft vs hard path {out['pruning'][name]['hard_check']}")
    out["pruning_peak_rss_gb"] = peak_gb()
    write(out, args.out)
    return specs


def hard_check(ablation, batch: dict, logits: tuple, n: int) -> dict:
    """The trained direction circuit (``SoftDirections``, the logits above 0) on the first ``n`` prompts of ``batch``
    through the soft path and through the hard path (its keep masks): each one's metric and the largest
    difference."""
    from lit_svd.analysis.edge_ablation import UnitMasks
    from lit_svd.analysis.edge_pruning import SoftDirections

    batch = {k: v[:n] for k, v in batch.items()}
    u = ablation.u
    soft = SoftDirections(u, *logits)
    ref = ablation.reference(batch)
    t = time.monotonic()
    m_soft = ablation.metric(batch, soft, ref)
    t_soft, t = time.monotonic() - t, time.monotonic()
    m_hard = ablation.metric(batch, UnitMasks({r.index: soft.keep(r) for r in u.readers}), ref)
    diff = float((m_soft - m_hard).abs().max())
    means = {"soft_mean": float(m_soft.mean()), "hard_mean": float(m_hard.mean())}
    return {"prompts": n, **means, "max_abs_diff": diff, "soft_s": t_soft, "hard_s": time.monotonic() - t}


def write(out: dict, folder: str | None, name: str = "edge_bench.json") -> None:
    """``out`` as ``folder/name`` (nothing without a folder); the edge benches write partial results this way."""
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
