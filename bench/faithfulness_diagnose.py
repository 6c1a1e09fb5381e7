"""Where and why a direction circuit loses to the head circuit that contains it (docs/circuits.md, "Where and why
the direction curve loses to head EAP-IG"). SmolLM2-135M IOI by default; rankings from the first 64 training
prompts, every measurement on the validation split (never the test prompts). Prints one JSON object (``--out``:
also written). Checked end to end on a tiny model (``--model <folder>``); the ``candidates`` part was run on
SmolLM2 IOI (docs/circuits.md), the others not yet.

    OMP_NUM_THREADS=1 heavy python bench/faithfulness_diagnose.py --out runs/diagnose

* ``paths``: the mean metric along interpolation paths, ``alpha`` from 0 (corrupted) to 1 (clean): every
  direction at once (``joint``), only the writers (``ov``, ``mlp_out``: the head-level EAP-IG path), only the
  readers (``q``, ``k``, ``mlp_in``, ``mlp_gate``), the residual entering layer 0 (``inputs``, MIB's EAP-IG-inputs).
  A sharp transition between two of MIB's five points is what a 5-step Riemann sum misses.
* ``steps``: the sum of the joint path's attributions against ``m(clean) - m(corrupt)`` for 5, 10 and 20 steps
  (completeness), from one 20-step run (the 5- and 10-step points are subsets).
* ``kinds``: one kind ranked at a time, every other direction kept: ``f`` with 5 / 20 / 50 % of that kind's
  directions kept, by direction EAP-IG (10 steps), by head-level EAP-IG's unit order, and at random.
* ``positions``: the same circuits (fair sizes) scored with the patch at every position, at the answer position
  only, and at every position but the answer.
* ``candidates``: the merged unit / direction rankings (``rankings.unit_rankings``) beside ``eap_ig_fair`` and
  head-level EAP-IG, scored on the fair axis (MIB's grid): CPR of each signed ranking, CMD of each absolute one; how
  the ``eap_ig_mixed`` method's variant was chosen (docs/circuits.md).
* ``layer_path`` (``--layer-path``, slow: ``n_layers x steps`` backwards per batch): per-layer EAP-IG (one layer's
  directions interpolated at a time: IG per node, the node a layer) beside the joint path's, both ranked and scored.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from faithfulness_setup import finish, frozen_universe, parser  # bench/faithfulness_setup.py

KINDS = ("q", "k", "ov", "mlp_in", "mlp_gate", "mlp_out")
PATHS = {"joint": KINDS, "writers": ("ov", "mlp_out"), "readers": ("q", "k", "mlp_in", "mlp_gate"), "inputs": None}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--n-train", type=int, default=64)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--alphas", type=float, nargs="+", default=[0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.2, 0.5])
    p.add_argument("--sizes", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2, 0.5])
    p.add_argument("--parts", nargs="+", default=["paths", "steps", "kinds", "positions"])
    p.add_argument("--layer-path", action="store_true")
    args = p.parse_args()
    if ("steps" in args.parts or args.layer_path) and 20 % args.steps:
        p.error(f"--steps {args.steps}: the steps and layer-path parts take it from a 20-step run; give 5, 10 or 20")

    from torch.utils.data import DataLoader, Subset

    from lit_svd.analysis import direction_attribution as da
    from lit_svd.analysis.faithfulness import circuit_metric, fair_weights, faithfulness_curves, kept_counts
    from lit_svd.analysis.rankings import attribution_rankings, eap_ranking, per_weight, random_ranking
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import forward_answer_logits, task_scorer
    from lit_svd.models.hooks import Hook, first_input, hooks
    from lit_svd.models.patching import CircuitPatch

    t0 = time.monotonic()
    model, view, comps, universe, patch = frozen_universe(args.model)
    weights = fair_weights(universe)
    dm = TaskDataModule(args.task, args.model, n_train=1000, n_val=args.n_val, n_test=64, test_last=True, batch_size=32)

    def batches(split: str, n: int) -> list[dict]:
        return list(DataLoader(Subset(dm.splits[split], range(n)), batch_size=32, collate_fn=dm.collate))

    train, val = batches("train", args.n_train), batches("val", args.n_val)
    task = task_scorer(args.task)
    out: dict = {"model": args.model, "task": args.task, "n_train": args.n_train, "n_val": args.n_val}

    def mean_metric(hook_specs_of) -> float:
        total = 0.0
        for b in val:
            with torch.no_grad(), hooks(*hook_specs_of(b)):
                logits = forward_answer_logits(model, b["clean_ids"], b["attention_mask"], b["answer_pos"])
            total += float(task.metric(logits, b).sum())
        return total / args.n_val

    references = [patch.record(b["corrupt_ids"], b["attention_mask"]) for b in val]

    if "paths" in args.parts:
        embeds = [da._record_embedding(patch, b["corrupt_ids"], b["attention_mask"]) for b in val]

        def path_hooks(kinds, alpha):
            def specs(b):
                i = next(j for j, v in enumerate(val) if v is b)
                if kinds is None:
                    ref = embeds[i]

                    def pre(module, a, kw):
                        x = first_input(a, kw)
                        return (ref + alpha * (x - ref), *a[1:]), kw

                    return [Hook(view.block(0), pre, "pre")]
                found = []
                for c in comps:
                    if c.kind not in kinds:
                        continue
                    module, read, write = patch.io[(c.layer, c.site)]
                    own_ref = references[i].own[c.name]

                    def hook(module, a, kw, o, read=read, write=write, own_ref=own_ref):
                        own = read(o)
                        return write(o, own_ref + alpha * (own - own_ref))

                    found.append(Hook(module, hook, "post"))
                return found

            return specs

        out["paths"] = {"alphas": args.alphas}
        for name, kinds in PATHS.items():
            out["paths"][name] = [mean_metric(path_hooks(kinds, a)) for a in args.alphas]
            print(name, [round(v, 2) for v in out["paths"][name]], flush=True)

    start = time.monotonic()
    n_points = 20 if "steps" in args.parts or args.layer_path else args.steps  # 5 and 10 are subsets of 20
    points = da.alphas(n_points)
    sums = None
    for b in train:
        got = da.batch_integrands(patch, b, task, points, "joint")
        sums = got if sums is None else [{n: s[n] + g[n] for n in s} for s, g in zip(sums, got)]
    assert sums is not None
    per_point = [universe.flatten({n: v / args.n_train for n, v in s.items()}) for s in sums]
    ig = {k: torch.stack(per_point[n_points // k - 1 :: n_points // k]).mean(0) for k in (5, 10, 20, n_points)
          if n_points % k == 0}  # fmt: skip
    out["attribution_s"] = time.monotonic() - start
    if "steps" in args.parts:
        gap = 0.0
        for b in train:
            with torch.no_grad():
                clean = forward_answer_logits(model, b["clean_ids"], b["attention_mask"], b["answer_pos"])
                corrupt = forward_answer_logits(model, b["corrupt_ids"], b["attention_mask"], b["answer_pos"])
            gap += float((task.metric(clean, b) - task.metric(corrupt, b)).sum())
        out["steps"] = {"gap": gap / args.n_train, **{f"sum_{k}": float(v.sum()) for k, v in ig.items()},
                        "eap_sum": float(per_point[-1].sum())}  # fmt: skip
        print("steps", out["steps"], flush=True)

    writers = da.direction_attributions(patch, universe, train, task, args.steps, kinds=da.WRITER_KINDS)
    heads = da.unit_attributions(universe, writers.scores, view.n_layers, view.n_heads, args.n_train)
    chosen = ig[args.steps]
    rankings = {
        "eap_ig_fair": attribution_rankings(per_weight(chosen, weights))["absolute"],
        "eap_ig": attribution_rankings(chosen)["absolute"],
        "eap_ig_heads": eap_ranking(universe, heads, view.n_kv_heads)[0],
        "random": random_ranking(len(universe), 0),
    }

    def f_of(keep: torch.Tensor, full: float, empty: float, patch_=patch) -> float:
        total = sum(float(circuit_metric(patch_, universe, b, keep, r, task).sum()) for b, r in zip(val, references))
        return (total / args.n_val - empty) / (full - empty)

    n = len(universe)
    every, none = torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    m_full = sum(float(circuit_metric(patch, universe, b, every, r, task).sum()) for b, r in zip(val, references))
    m_empty = sum(float(circuit_metric(patch, universe, b, none, r, task).sum()) for b, r in zip(val, references))
    m_full, m_empty = m_full / args.n_val, m_empty / args.n_val

    if "kinds" in args.parts:
        kind_of = torch.zeros(n, dtype=torch.long)
        for c in comps:
            kind_of[universe.slice(c.name)] = KINDS.index(c.kind)
        out["kinds"] = {"fractions": args.fractions}
        for k, kind in enumerate(KINDS):
            mine = kind_of == k
            row = {"none_kept": f_of(~mine, m_full, m_empty)}
            for name in ("eap_ig", "eap_ig_heads", "random"):
                order = rankings[name][mine[rankings[name]]]
                vals = []
                for fraction in args.fractions:
                    keep = ~mine
                    keep[order[: int(fraction * int(mine.sum()))]] = True
                    vals.append(f_of(keep, m_full, m_empty))
                row[name] = vals
            out["kinds"][kind] = row
            print(kind, row, flush=True)

    if "positions" in args.parts:
        where: dict = {}

        class PositionPatch(CircuitPatch):
            """The same patch at the positions ``where["mask"]`` only (no MLP skipped: it acts on all positions)."""

            def _hook(self, c, p, key, reference):
                inner = super()._hook(c, p, key, reference)
                _, read, write = self.io[key]

                def hook(module, a, kw, o):
                    own = read(o)
                    return write(o, torch.where(where["mask"][..., None], read(inner(module, a, kw, o)), own))

                return hook

            @contextmanager
            def apply(self, keep, reference):
                plans = {name: self.plan(self.components[name], k.to(torch.bool)) for name, k in keep.items()}
                specs = [Hook(self.io[key][0], self._hook(c, plans[c.name], key, reference), "post")
                         for key, c in self.sites.items() if plans.get(c.name) is not None]  # fmt: skip
                with hooks(*specs):
                    yield

        positioned = PositionPatch(view, comps)

        def metric_at(keep, mode) -> float:
            total = 0.0
            for b, r in zip(val, references):
                B, T = b["clean_ids"].shape
                answer = torch.zeros(B, T, dtype=torch.bool)
                answer[torch.arange(B), b["answer_pos"]] = True
                where["mask"] = {"all": torch.ones(B, T, dtype=torch.bool), "answer": answer, "before": ~answer}[mode]
                total += float(circuit_metric(positioned, universe, b, keep, r, task).sum())
            return total / args.n_val

        out["positions"] = {"sizes": args.sizes}
        for mode in ("all", "answer", "before"):
            full, empty = metric_at(every, mode), metric_at(none, mode)
            row = {"m_full": full, "m_empty": empty}
            for name in ("eap_ig_fair", "eap_ig_heads"):
                vals = []
                for count in kept_counts(rankings[name], args.sizes, "fair", weights):
                    keep = none.clone()
                    keep[rankings[name][:count]] = True
                    vals.append((metric_at(keep, mode) - empty) / (full - empty))
                row[name] = vals
            out["positions"][mode] = row
            print(mode, row, flush=True)

    if "candidates" in args.parts:
        out["candidates"] = candidate_scores(view, comps, universe, weights, val, task, chosen, heads)
        print("candidates", out["candidates"], flush=True)

    if args.layer_path:
        start = time.monotonic()
        layer = da.direction_attributions(patch, universe, train, task, 5, path="layer").scores
        out["layer_path_s"] = time.monotonic() - start
        compare = {}
        for name, s in (("layer5", layer), ("joint5", ig[5]), ("joint10", ig[10])):
            pair = attribution_rankings(s)
            compare[f"{name}/signed"], compare[f"{name}/absolute"] = pair["signed"], pair["absolute"]
            compare[f"{name}/fair_absolute"] = attribution_rankings(per_weight(s, weights))["absolute"]
        curves, _ = faithfulness_curves(view, comps, val, compare, task)
        out["layer_path"] = {name: {axis: [c.cpr, c.cmd] for axis, c in by.items()} for name, by in curves.items()}
        print("layer path", out["layer_path"], flush=True)

    out["wall_s"] = time.monotonic() - t0
    finish(out, args.out, "faithfulness_diagnose")


def candidate_scores(view, comps, universe, weights, val, task, scores, heads) -> dict:
    """Fair-axis CPR (signed ranking) and CMD (absolute ranking) on ``val`` of the candidate rankings of direction
    EAP-IG ``scores``: per unit of fair size (``eap_ig_fair``), MLP layers kept whole with the attention side by
    direction (their unit score: the sum over all their directions, over their ``mlp_out`` directions, or head-level
    EAP-IG's ``heads``), every unit kept whole with its directions by their own score, and head-level EAP-IG."""
    from lit_svd.analysis.faithfulness import faithfulness_curves
    from lit_svd.analysis.rankings import attribution_rankings, eap_ranking, per_weight, unit_rankings

    mlp_out = {f"L{c.layer}.mlp": float(scores[universe.slice(c.name)].sum()) for c in comps if c.kind == "mlp_out"}
    head_mlps = {f"L{c.layer}.mlp": float(heads.mlps[c.layer]) for c in comps if c.kind == "mlp_out"}
    pairs = {
        "eap_ig_fair": attribution_rankings(per_weight(scores, weights)),
        "mixed_all": unit_rankings(universe, scores, weights),
        "mixed_out": unit_rankings(universe, scores, weights, unit_scores=mlp_out),
        "mixed_heads": unit_rankings(universe, scores, weights, unit_scores=head_mlps),
        "units_by_score": unit_rankings(universe, scores, weights, whole=("head", "kv", "mlp"), within="score"),
        "eap_ig_heads": {v: eap_ranking(universe, heads, view.n_kv_heads, v == "signed")[0]
                         for v in ("signed", "absolute")},
    }  # fmt: skip
    rankings = {f"{name}/{v}": r for name, pair in pairs.items() for v, r in pair.items()}
    curves, info = faithfulness_curves(view, comps, val, rankings, task, axes=("fair",))
    out: dict = {"m_full": info["m_full"], "m_empty": info["m_empty"], "wall_s": info["wall_s"]}
    for name in pairs:
        signed, absolute = curves[f"{name}/signed"]["fair"], curves[f"{name}/absolute"]["fair"]
        out[name] = {"cpr": signed.cpr, "cmd": absolute.cmd, "signed": signed.values, "absolute": absolute.values}
    return out


if __name__ == "__main__":
    main()
