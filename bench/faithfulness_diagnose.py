"""Where and why a direction circuit loses to the head circuit that contains it (docs/circuits.md, "Where and why
the direction curve loses to head EAP-IG"). SmolLM2-135M IOI by default; rankings from the first 64 training
prompts, every measurement on the validation split (never the test prompts). Prints one JSON object (``--out``:
also written). Checked end to end on a tiny model (``--model <folder>``, tests/test_faithfulness_diagnose.py);
the parts run on SmolLM2 and Gemma-3 IOI are in docs/circuits.md.

    OMP_NUM_THREADS=1 heavy python bench/faithfulness_diagnose.py --out runs/diagnose

* ``paths``: the mean metric along interpolation paths, ``alpha`` from 0 (corrupted) to 1 (clean): every
  direction at once (``joint``), only the writers (``ov``, ``mlp_out``: the head-level EAP-IG path), only the
  readers (``q``, ``k``, ``mlp_in``, ``mlp_gate``), the residual entering layer 0 (``inputs``, MIB's EAP-IG-inputs).
  A sharp transition between two of MIB's five points is what a 5-step Riemann sum misses.
* ``steps``: the sum of the joint path's attributions against ``m(clean) - m(corrupt)`` for 5, 10 and 20 steps
  (completeness), from one 20-step run (the 5- and 10-step points are subsets).
* ``kinds``: one kind ranked at a time, every other direction kept: ``f`` with 5 / 20 / 50 % of that kind's
  directions kept, by direction EAP-IG (10 steps), by head-level EAP-IG's unit order, and at random.
* ``positions``: the same circuits (fair sizes; ``--position-rankings``) scored with the patch at every position, at
  the answer position only, and at every position but the answer.
* ``compare``: the chosen direction ranking ``eap_ig_units`` (A) against head-level EAP-IG (B), signed and / or
  absolute (``--compare-variants``), on MIB's grid (fair axis): at each size what each circuit keeps (fair size per
  kind, per layer and unit type, the units one keeps whole and the other does not) and ``f`` of A, of B and of
  A with B's choice on one part of the model (B's MLPs, B's attention, B's directions in one third of the layers):
  where a part's swap moves A's ``f`` to B's, that part is where the two rankings differ in effect.
* ``unit_scores``: per unit (query head, KV head, MLP layer) the sum of its directions' joint-path EAP-IG per kind,
  over its fair size (what ``eap_ig_units`` ranks by), and head-level EAP-IG's writer-path score of heads and MLPs.
* ``candidates`` (``--candidates``: which): the merged unit / direction rankings (``rankings.unit_rankings``) beside
  ``eap_ig_fair`` and head-level EAP-IG, scored on the fair axis (MIB's grid): CPR of each signed ranking, CMD of
  each absolute one; how ``eap_ig_units`` and ``eap_ig_hybrid`` were chosen (docs/circuits.md).
* ``layer_path`` (``--layer-path``, slow: ``n_layers x 5`` backwards per batch): per-layer EAP-IG (one layer's
  directions interpolated at a time: IG per node, the node a layer, 5 steps) beside the joint path's (5 and 10
  steps, the same training prompts), each ranked as ``eap_ig_units`` (signed and absolute) and scored on the fair
  axis.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import torch
from faithfulness_setup import finish, frozen_universe, parser  # bench/faithfulness_setup.py

KINDS = ("q", "k", "ov", "mlp_in", "mlp_gate", "mlp_out")
MLP_KINDS = ("mlp_in", "mlp_gate", "mlp_out")
RANKING_NAMES = ("eap_ig_units/signed", "eap_ig_units/absolute", "eap_ig_heads/signed", "eap_ig_heads/absolute",
                 "eap_ig_fair/absolute", "eap_ig/absolute", "random")  # fmt: skip
POSITION_RANKINGS = RANKING_NAMES[:4]
PATHS = {"joint": KINDS, "writers": ("ov", "mlp_out"), "readers": ("q", "k", "mlp_in", "mlp_gate"), "inputs": None}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data-config", default=None, help="a run config whose data section draws the splits (its "
                   "task, tokenizer, sizes, prepend_bos: Gemma-3 needs its BOS); default: SmolLM2 IOI's")  # fmt: skip
    p.add_argument("--n-train", type=int, default=64)
    p.add_argument("--n-val", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--alphas", type=float, nargs="+", default=[0, 0.2, 0.4, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.2, 0.5])
    p.add_argument("--sizes", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.2, 0.5])
    p.add_argument("--parts", nargs="+", default=["paths", "steps", "kinds", "positions"])
    p.add_argument("--position-rankings", nargs="+", default=list(POSITION_RANKINGS), choices=RANKING_NAMES)
    p.add_argument("--compare-variants", nargs="+", default=["signed", "absolute"], choices=["signed", "absolute"])
    p.add_argument("--layer-path", action="store_true")
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    args = p.parse_args()
    if ("steps" in args.parts or args.layer_path) and 20 % args.steps:
        p.error(f"--steps {args.steps}: the steps and layer-path parts take it from a 20-step run; give 5, 10 or 20")

    from torch.utils.data import DataLoader, Subset

    from lit_svd.analysis import direction_attribution as da
    from lit_svd.analysis.faithfulness import circuit_metric, fair_weights, faithfulness_curves, kept_counts
    from lit_svd.analysis.rankings import (
        UNIT_TYPES,
        attribution_rankings,
        eap_ranking,
        per_weight,
        random_ranking,
        unit_rankings,
    )
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import forward_answer_logits, task_scorer
    from lit_svd.models.hooks import Hook, first_input, hooks
    from lit_svd.models.patching import CircuitPatch

    t0 = time.monotonic()
    model, view, comps, universe, patch = frozen_universe(args.model)
    weights = fair_weights(universe)
    data = {"task": args.task, "tokenizer": args.model, "n_train": 1000, "n_val": args.n_val, "n_test": 64,
            "test_last": True}  # fmt: skip
    if args.data_config:
        import yaml

        data = {**yaml.safe_load(Path(args.data_config).read_text())["data"]["init_args"], "batch_size": 32}
        if data["n_val"] < args.n_val:
            p.error(f"--n-val {args.n_val}: {args.data_config} holds {data['n_val']} validation prompts")
        args.task = data["task"]
    dm = TaskDataModule(**{**data, "batch_size": 32})

    def batches(split: str, n: int) -> list[dict]:
        return list(DataLoader(Subset(dm.splits[split], range(n)), batch_size=32, collate_fn=dm.collate))

    train, val = batches("train", args.n_train), batches("val", args.n_val)
    task = task_scorer(args.task)
    out: dict = {"model": args.model, "task": args.task, "n_train": args.n_train, "n_val": args.n_val, "data": data}

    def save() -> None:
        """Write what is measured so far (a run cut short keeps its finished parts)."""
        if args.out:
            from lit_svd.output import write_json

            Path(args.out).mkdir(parents=True, exist_ok=True)
            write_json(Path(args.out) / "faithfulness_diagnose.json", {**out, "wall_s": time.monotonic() - t0})

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
            save()

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
    save()
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
        save()

    writers = da.direction_attributions(patch, universe, train, task, args.steps, kinds=da.WRITER_KINDS)
    heads = da.unit_attributions(universe, writers.scores, view.n_layers, view.n_heads, args.n_train)
    chosen = ig[args.steps]
    units = unit_rankings(universe, chosen, weights, UNIT_TYPES, within="score")  # the eap_ig_units method
    rankings = {
        "eap_ig_units/signed": units["signed"],
        "eap_ig_units/absolute": units["absolute"],
        "eap_ig_heads/signed": eap_ranking(universe, heads, view.n_kv_heads, signed=True)[0],
        "eap_ig_heads/absolute": eap_ranking(universe, heads, view.n_kv_heads)[0],
        "eap_ig_fair/absolute": attribution_rankings(per_weight(chosen, weights))["absolute"],
        "eap_ig/absolute": attribution_rankings(chosen)["absolute"],
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
            for name, ranking in (("eap_ig", "eap_ig/absolute"), ("eap_ig_heads", "eap_ig_heads/absolute"),
                                  ("random", "random")):  # fmt: skip
                order = rankings[ranking][mine[rankings[ranking]]]
                vals = []
                for fraction in args.fractions:
                    keep = ~mine
                    keep[order[: int(fraction * int(mine.sum()))]] = True
                    vals.append(f_of(keep, m_full, m_empty))
                row[name] = vals
            out["kinds"][kind] = row
            print(kind, row, flush=True)
            save()

    if "positions" in args.parts:
        where: dict = {}

        class PositionPatch(CircuitPatch):
            """The same patch at the positions ``where["mask"]`` only, through the output routes (no module skipped)."""

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

        positioned = PositionPatch(view, comps, input_route=False)  # output routes: the mask picks positions

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
            for name in args.position_rankings:
                vals = []
                for count in kept_counts(rankings[name], args.sizes, "fair", weights):
                    keep = none.clone()
                    keep[rankings[name][:count]] = True
                    vals.append((metric_at(keep, mode) - empty) / (full - empty))
                row[name] = vals
            out["positions"][mode] = row
            print(mode, row, flush=True)
            save()

    if "compare" in args.parts:
        out["compare"] = {}
        for variant in args.compare_variants:
            a, b = rankings[f"eap_ig_units/{variant}"], rankings[f"eap_ig_heads/{variant}"]
            got = compare_circuits(universe, weights, a, b, lambda keep: f_of(keep, m_full, m_empty), view.n_layers)
            out["compare"][variant] = got
            print("compare", variant, {k: [round(v, 3) for v in vals] for k, vals in got["f"].items()}, flush=True)
            save()

    if "unit_scores" in args.parts:
        out["unit_scores"] = unit_scores(universe, weights, chosen, heads)
        save()

    if "candidates" in args.parts:
        out["candidates"] = candidate_scores(view, comps, universe, weights, val, task, chosen, heads, args.candidates)
        print("candidates", out["candidates"], flush=True)
        save()

    if args.layer_path:
        start = time.monotonic()
        layer = da.direction_attributions(patch, universe, train, task, 5, path="layer").scores
        out["layer_path_s"] = time.monotonic() - start
        compare = {}
        for name, s in (("layer5", layer), ("joint5", ig[5]), ("joint10", ig[10])):
            pair = unit_rankings(universe, s, weights, UNIT_TYPES, within="score")
            compare[f"{name}/signed"], compare[f"{name}/absolute"] = pair["signed"], pair["absolute"]
        curves, _ = faithfulness_curves(view, comps, val, compare, task, axes=("fair",))
        out["layer_path"] = {name: {"cpr": by["fair"].cpr, "cmd": by["fair"].cmd, "f": by["fair"].values}
                             for name, by in curves.items()}  # fmt: skip
        print("layer path", out["layer_path"], flush=True)

    out["wall_s"] = time.monotonic() - t0
    finish(out, None, "faithfulness_diagnose")
    save()


def model_parts(universe, n_layers: int) -> dict:
    """``{part: [N] bool}``: the directions of the MLPs (``mlp_in``, ``mlp_gate``, ``mlp_out``), of the attention
    (``q``, ``k``, ``ov``) and of each third of the layers (``L0-9``: layers 0 to 9), the parts ``compare_circuits``
    swaps."""
    mlp = torch.zeros(len(universe), dtype=torch.bool)
    layer = torch.zeros(len(universe), dtype=torch.long)
    for c in universe.components:
        mlp[universe.slice(c.name)] = c.kind in MLP_KINDS
        layer[universe.slice(c.name)] = c.layer
    parts = {"mlp": mlp, "attention": ~mlp}
    cuts = [round(i * n_layers / 3) for i in range(4)]
    for lo, hi in zip(cuts, cuts[1:]):
        if hi > lo:
            parts[f"L{lo}-{hi - 1}"] = (layer >= lo) & (layer < hi)
    return parts


def composition(universe, weights, keep, n_layers: int) -> dict:
    """What the circuit ``keep: [N]`` (bool) holds: its fair size (``weights[keep].sum()``), split per kind and, per
    layer, into attention and MLP directions; and per unit (``rankings.direction_units``: a query head's ``q`` and
    ``ov``, a KV head's ``k``, an MLP layer) the fraction of its directions kept, for the units it touches."""
    from lit_svd.analysis.rankings import direction_units

    unit, _, names = direction_units(universe)
    w = torch.where(keep, weights, torch.zeros_like(weights))
    by_kind = {kind: 0.0 for kind in KINDS}
    by_layer = {"attention": [0.0] * n_layers, "mlp": [0.0] * n_layers}
    for c in universe.components:
        share = float(w[universe.slice(c.name)].sum())
        by_kind[c.kind] += share
        by_layer["mlp" if c.kind in MLP_KINDS else "attention"][c.layer] += share
    kept = torch.zeros(len(names), dtype=torch.float64).index_add_(0, unit, keep.double())
    total = torch.zeros(len(names), dtype=torch.float64).index_add_(0, unit, torch.ones_like(keep, dtype=torch.float64))
    fraction = kept / total
    units = {names[i]: round(float(fraction[i]), 4) for i in torch.nonzero(fraction > 0).flatten().tolist()}
    return {"fair_size": float(w.sum()), "by_kind": by_kind, "by_layer": by_layer, "units": units}


def compare_circuits(universe, weights, a, b, f_of, n_layers: int, sizes=None) -> dict:
    """Rankings ``a`` and ``b`` (the universe's flat indices, best first) compared circuit by circuit on the fair axis
    at ``sizes`` (MIB's grid): ``f`` (``f_of(keep)``) of A's circuit, of B's, and of A's circuit with B's choice on one
    part of the model (``a+b:PART``, ``model_parts``: A's directions outside the part, B's inside it), with each
    circuit's fair size; what A's and B's circuits keep (``composition``) and the units one holds whole that the other
    does not touch (``only_a``, ``only_b``). Equal circuits are scored once."""
    from lit_svd.analysis.faithfulness import MIB_SIZES, areas, kept_counts

    sizes = list(MIB_SIZES if sizes is None else sizes)
    parts = model_parts(universe, n_layers)
    seen: dict[bytes, float] = {}

    def f_cached(keep: torch.Tensor) -> float:
        key = keep.numpy().tobytes()
        if key not in seen:
            seen[key] = f_of(keep)
        return seen[key]

    def circuits(ranking) -> list[torch.Tensor]:
        out = []
        for count in kept_counts(ranking, sizes, "fair", weights):
            keep = torch.zeros(len(universe), dtype=torch.bool)
            keep[ranking[:count]] = True
            out.append(keep)
        return out

    names = ["a", "b", *(f"a+b:{part}" for part in parts)]
    f: dict[str, list[float]] = {name: [] for name in names}
    fair: dict[str, list[float]] = {name: [] for name in names}
    kept = []
    for keep_a, keep_b in zip(circuits(a), circuits(b)):
        made = {"a": keep_a, "b": keep_b}
        made.update({f"a+b:{part}": torch.where(inside, keep_b, keep_a) for part, inside in parts.items()})
        for name, keep in made.items():
            f[name].append(f_cached(keep))
            fair[name].append(float(weights[keep].sum()))
        ca, cb = composition(universe, weights, keep_a, n_layers), composition(universe, weights, keep_b, n_layers)
        ca["only"] = sorted(u for u, x in ca["units"].items() if x == 1 and u not in cb["units"])
        cb["only"] = sorted(u for u, x in cb["units"].items() if x == 1 and u not in ca["units"])
        kept.append({"a": ca, "b": cb})
    scores = {name: dict(zip(("cpr", "cmd"), areas(sizes, f[name]))) for name in names}
    return {"sizes": sizes, "parts": list(parts), "f": f, "fair_size": fair, "areas": scores, "kept": kept,
            "forwards": len(seen)}  # fmt: skip


def unit_scores(universe, weights, scores, heads) -> dict:
    """Per unit (``rankings.direction_units``' names) the sum of ``scores`` (direction EAP-IG) over its directions of
    each kind, the total over the unit's fair size (``eap_ig_units``' key) and, for heads and MLP layers, head-level
    EAP-IG's score ``heads`` (``Attributions``: the writer path)."""
    from lit_svd.analysis.rankings import direction_units

    unit, _, names = direction_units(universe)
    scores = torch.nan_to_num(torch.as_tensor(scores, dtype=torch.float64), nan=0.0)
    out: dict = {name: {"joint": {}} for name in names}
    for c in universe.components:
        part = universe.slice(c.name)
        for i in unit[part].unique().tolist():
            mine = unit[part] == i
            out[names[i]]["joint"][c.kind] = float(scores[part][mine].sum())
    size = torch.zeros(len(names), dtype=torch.float64).index_add_(0, unit, weights.double())
    for i, name in enumerate(names):
        row = out[name]
        row["fair_size"] = float(size[i])
        row["per_fair_size"] = sum(row["joint"].values()) / row["fair_size"]
        layer, tail = int(name.split(".")[0][1:]), name.split(".")[1]
        if tail == "mlp":
            row["writer"] = float(heads.mlps[layer])
        elif tail.startswith("h"):
            row["writer"] = float(heads.heads[layer, int(tail[1:])])
    return out


CANDIDATES = ("eap_ig_fair", "mixed_all", "mixed_out", "mixed_heads", "units_by_score", "hybrid", "hybrid_heads",
              "units_writer", "eap_ig_heads")  # fmt: skip


def candidate_scores(view, comps, universe, weights, val, task, scores, heads, names=CANDIDATES) -> dict:
    """Fair-axis CPR (signed ranking) and CMD (absolute ranking) on ``val`` of the candidate rankings ``names`` of
    direction EAP-IG ``scores``: per unit of fair size (``eap_ig_fair``), MLP layers kept whole with the attention side
    by direction (their unit score: the sum over all their directions, over their ``mlp_out`` directions, or
    head-level EAP-IG's ``heads``: ``mixed_*``), every unit kept whole with its directions by their own score (unit
    scores: the sum of their directions' scores, ``units_by_score``; head-level EAP-IG for the MLPs, ``hybrid``, for
    the MLPs and query heads, ``hybrid_heads``, for every unit, a KV head by its query heads' sum, ``units_writer``),
    and head-level EAP-IG."""
    from lit_svd.analysis.faithfulness import faithfulness_curves
    from lit_svd.analysis.rankings import (
        UNIT_TYPES,
        attribution_rankings,
        eap_ranking,
        per_weight,
        unit_rankings,
        writer_unit_scores,
    )

    def units(writer):
        unit_scores = writer_unit_scores(universe, heads, view.n_kv_heads, writer)
        return lambda: unit_rankings(universe, scores, weights, UNIT_TYPES, unit_scores, within="score")

    mlp_out = {f"L{c.layer}.mlp": float(scores[universe.slice(c.name)].sum()) for c in comps if c.kind == "mlp_out"}
    head_mlps = writer_unit_scores(universe, heads, view.n_kv_heads, ("mlp",))
    build = {
        "eap_ig_fair": lambda: attribution_rankings(per_weight(scores, weights)),
        "mixed_all": lambda: unit_rankings(universe, scores, weights),
        "mixed_out": lambda: unit_rankings(universe, scores, weights, unit_scores=mlp_out),
        "mixed_heads": lambda: unit_rankings(universe, scores, weights, unit_scores=head_mlps),
        "units_by_score": units(()),
        "hybrid": units(("mlp",)),
        "hybrid_heads": units(("head", "mlp")),
        "units_writer": units(UNIT_TYPES),
        "eap_ig_heads": lambda: {v: eap_ranking(universe, heads, view.n_kv_heads, v == "signed")[0]
                                 for v in ("signed", "absolute")},
    }  # fmt: skip
    pairs = {name: build[name]() for name in names}
    rankings = {f"{name}/{v}": r for name, pair in pairs.items() for v, r in pair.items()}
    curves, info = faithfulness_curves(view, comps, val, rankings, task, axes=("fair",))
    out: dict = {"m_full": info["m_full"], "m_empty": info["m_empty"], "wall_s": info["wall_s"]}
    for name in pairs:
        signed, absolute = curves[f"{name}/signed"]["fair"], curves[f"{name}/absolute"]["fair"]
        out[name] = {"cpr": signed.cpr, "cmd": absolute.cmd, "signed": signed.values, "absolute": absolute.values}
    return out


if __name__ == "__main__":
    main()
