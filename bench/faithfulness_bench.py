"""Speed of the faithfulness machinery on SmolLM2-135M IOI, side by side in one process (docs/circuits.md,
"Faithfulness", "Cost"): the patched forward against a plain forward that computes only the answer logits, direction
EAP-IG over every direction, one curve, peak memory. Prints one JSON object (and writes it with ``--out``).

    OMP_NUM_THREADS=1 heavy python bench/faithfulness_bench.py --out runs/faithfulness_bench

* ``forward``: a plain forward of ``--batch-size`` test prompts with the answer logits only
  (``metrics.forward_answer_logits``) and patched forwards (``models.patching.CircuitPatch``) of random circuits at
  several sizes, interleaved ``--repeats`` times (median seconds each; ratios to the plain forward);
* ``attribution``: direction EAP-IG (``--steps`` points, joint path) over all directions on ``--n-prompts`` training
  prompts, EAP coming with it (its point 1), and head-level EAP-IG (the writers' directions only);
* ``curve``: one random ranking's curve and one attribution ranking's (MIB's 10 sizes, ``--n-prompts`` test prompts,
  both size axes: every distinct kept count one forward), seconds each;
* ``peak_rss_gib``: the process's peak resident memory.

``--compare``: the patched forwards and the curves also through the output routes alone
(``CircuitPatch(..., input_route=False)``, every site's module run), interleaved with the default patch in the same
process (``*_output_routes``).

Targets (issue 32): patched forward <= 1.5x the plain one; EAP-IG over all directions (5 steps, 64 prompts) < 60 s;
one curve < 30 s. Timings on a shared machine move with its load: the ratios, measured interleaved, are what counts.
"""

from __future__ import annotations

import os
import resource
import statistics
import time

import torch
from faithfulness_setup import finish, frozen_universe, parser  # bench/faithfulness_setup.py


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--n-prompts", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fractions", type=float, nargs="+", default=[0.001, 0.01, 0.1, 0.5, 0.9])
    p.add_argument("--compare", action="store_true", help="also the output routes alone (input_route=False)")
    args = p.parse_args()

    from torch.utils.data import DataLoader, Subset

    from lit_svd.analysis import faithfulness as fa
    from lit_svd.analysis.direction_attribution import WRITER_KINDS, alphas, direction_attributions
    from lit_svd.analysis.rankings import attribution_rankings, random_ranking
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import forward_answer_logits
    from lit_svd.models.patching import CircuitPatch

    t0 = time.monotonic()
    model, view, comps, universe, patch = frozen_universe(args.model)
    dm = TaskDataModule(args.task, args.model, n_train=1000, n_val=64, n_test=args.n_prompts, test_last=True,
                        batch_size=args.batch_size)  # fmt: skip
    test = list(dm.test_dataloader())
    train = list(
        DataLoader(Subset(dm.splits["train"], range(args.n_prompts)), batch_size=args.batch_size, collate_fn=dm.collate)
    )
    out: dict = {"model": args.model, "task": args.task, "n_directions": len(universe), "threads": 1}
    out.update(omp_num_threads=os.environ.get("OMP_NUM_THREADS"), load_and_svds_s=time.monotonic() - t0)
    patches = {"": patch, **({"_output_routes": CircuitPatch(view, comps, input_route=False)} if args.compare else {})}

    batch = test[0]
    ids, mask, pos = batch["clean_ids"], batch["attention_mask"], batch["answer_pos"]
    with torch.no_grad():
        reference = patch.record(batch["corrupt_ids"], mask)

        def plain():
            forward_answer_logits(model, ids, mask, pos)

        def patched(keep, patch):
            def run():
                with patch.apply(keep, reference):
                    forward_answer_logits(model, ids, mask, pos)

            return run

        g = torch.Generator().manual_seed(0)
        circuits = {f: universe.split(torch.rand(len(universe), generator=g) < f) for f in args.fractions}
        runs = {(f, route): patched(keep, p) for f, keep in circuits.items() for route, p in patches.items()}
        plain()  # warm up
        times: dict = {"plain": [], **{key: [] for key in runs}}
        for _ in range(args.repeats):  # interleaved: the machine's load moves all of them alike
            times["plain"].append(median_seconds(plain, 1))
            for key, run in runs.items():
                times[key].append(median_seconds(run, 1))
        t_plain = statistics.median(times["plain"])
        out["forward"] = {
            "prompts": len(pos),
            "tokens": int(ids.shape[1]),
            "plain_answer_logits_s": t_plain,
            "record_reference_s": median_seconds(lambda: patch.record(batch["corrupt_ids"], mask), 1),
        }
        for route in patches:
            out["forward"][f"patched_s{route}"] = {str(f): statistics.median(times[f, route]) for f in circuits}
            out["forward"][f"patched_ratio{route}"] = {
                str(f): statistics.median(times[f, route]) / t_plain for f in circuits
            }

    start = time.monotonic()
    ig = direction_attributions(patch, universe, train, args.task, steps=args.steps)
    t_ig = time.monotonic() - start
    start = time.monotonic()
    direction_attributions(patch, universe, train, args.task, steps=args.steps, kinds=WRITER_KINDS)
    out["attribution"] = {
        "prompts": args.n_prompts,
        "steps": len(alphas(args.steps)),
        "eap_ig_all_directions_s": t_ig,
        "eap_ig_writers_s": time.monotonic() - start,
        "ratio_to_plain_forwards": t_ig / (t_plain * len(train)),
    }

    rankings = {"random": random_ranking(len(universe), 0), "eap_ig_signed": attribution_rankings(ig.scores)["signed"]}
    plan = fa.plan_curves(rankings, fa.MIB_SIZES, len(universe), fa.AXES, fa.fair_weights(universe))
    for route, p in patches.items():  # faithfulness_curves' loop, with this patch
        start = time.monotonic()
        sums = fa.CurveSums()
        for b in fa.by_length(test):
            sums.add(fa.batch_sums(p, universe, b, plan, args.task))
        curves, info = fa.curves_from_sums(sums, plan)
        out[f"curve{route}"] = {
            "prompts": info["n_prompts"],
            "sizes": len(fa.MIB_SIZES),
            "axes": len(fa.AXES),
            "seconds": {name: c["raw"].seconds for name, c in curves.items()},
            "forwards": {name: len(set(plan.circuits(name)) - {0, len(universe)}) for name in curves},
            "cpr_raw": {name: c["raw"].cpr for name, c in curves.items()},
            "wall_s": time.monotonic() - start,
        }
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out["wall_s"] = time.monotonic() - t0
    finish(out, args.out, "faithfulness_bench")


if __name__ == "__main__":
    main()
