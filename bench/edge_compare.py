"""Compare edge curves stored by ``bench/edge_bench.py --out`` (the same prompts, one run or several), on all their
prompts or a slice of them: each curve's CPR and CMD with its 95 % BCa interval over the prompts, and the paired
difference of the first curve against each other one (``analysis.area_intervals``, the intervals of the runs'
``summary``). It reads the per-prompt metrics the runs stored, so it runs in seconds and needs no model.

    python bench/edge_compare.py RUN/edge_bench.json:directions_abs_fair RUN/edge_bench.json:units_abs_raw
    python bench/edge_compare.py A.json:prunedirs_abs_fair B.json:units_abs_raw --prompts 64:256
    python bench/edge_compare.py RUN/edge_bench.json:directions_abs_fair RUN/edge_bench.json:units_abs_raw \
        --figure curves.png --title "SmolLM2 IOI"

``--prompts LO:HI`` keeps prompts ``LO`` to ``HI - 1`` of the curved split (a longer test split drawn last keeps
its first prompts: the new ones alone are ``64:``, the old ones of a shorter run ``:64``). Curves of different runs
are compared only where they curved the same prompts with the same model (per-prompt ``m(full)`` and ``m(empty)``
equal on the kept prompts); otherwise it exits naming the two. Prints one JSON object (each curve's f per size on
the kept prompts too); ``--figure`` draws those f with their 95 % bands (the module's ``edge_curves.png`` panels).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from lit_svd.analysis.area_intervals import area_intervals


def load(specs: list[str]) -> tuple[dict, dict]:
    """``(curves, ends)``: each ``FILE:CURVE`` spec's curve row and its run's per-prompt ends (``prompt_full``,
    ``prompt_empty``), both keyed by the spec; exits on a malformed spec or an unknown curve."""
    runs: dict[str, dict] = {}
    curves, ends = {}, {}
    for spec in specs:
        path, _, name = spec.rpartition(":")
        if not path or not name:
            sys.exit(f"{spec!r}: want FILE:CURVE (an edge_bench.py output and one of its curves)")
        run = runs.setdefault(path, json.loads(Path(path).read_text()))
        if name not in run.get("curves", {}):
            sys.exit(f"{spec!r}: no curve {name!r} in {path} (it has {sorted(run.get('curves', {}))})")
        curves[spec] = run["curves"][name]
        ends[spec] = [run["info"][k] for k in ("prompt_full", "prompt_empty")]
    return curves, ends


def compare(curves: dict, ends: dict, lo: int = 0, hi: int | None = None) -> dict:
    """Each curve's CPR / CMD and interval on prompts ``lo:hi``, and the first curve less each other one (paired);
    exits unless every run has the same ends on those prompts."""
    keep = slice(lo, hi)
    sliced = {spec: [e[keep] for e in two] for spec, two in ends.items()}
    first, *others = curves
    for other in others:  # one run's longer split may go on past another's: the kept prompts must agree
        if sliced[other] != sliced[first]:
            sys.exit(f"{other} and {first} curved other prompts here (or another model): m(full) / m(empty) differ")
    full, empty = (torch.tensor(e, dtype=torch.float64) for e in sliced[first])
    metrics = {s: torch.tensor(c["prompt_metric"], dtype=torch.float64)[:, keep] for s, c in curves.items()}
    sizes = next(iter(curves.values()))["sizes"]
    if any(c["sizes"] != sizes for c in curves.values()):
        sys.exit("the curves were scored at different sizes")
    pairs = [(first, o) for o in others]
    ci = area_intervals(sizes, metrics, full, empty, pairs)
    point = ci["points"]
    out: dict = {"prompts": [lo, lo + len(full)], "method": ci["method"], "curves": {}, "differences": {}}
    for s, c in curves.items():
        out["curves"][s] = {a: point[f"{s}/{a}"] for a in ("cpr", "cmd")}
        out["curves"][s] |= {f"{a}_ci": ci["curves"][s][a] for a in ("cpr", "cmd")}
        out["curves"][s] |= {"sizes": sizes, "weighted": c.get("weighted"), "values_ci": ci["curves"][s]["f"]}
        out["curves"][s]["values"] = [point[f"{s}/f{i}"] for i in range(len(sizes))]
    for a, b in pairs:
        key = f"{a} - {b}"
        out["differences"][key] = {x: point[f"{key}/{x}"] for x in ("cpr", "cmd")}
        out["differences"][key] |= {f"{x}_ci": ci["pairs"][key][x] for x in ("cpr", "cmd")}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("curves", nargs="+", help="FILE:CURVE, two or more; the first is compared with each other one")
    p.add_argument("--prompts", default=":", help="LO:HI, a slice of the curved prompts (default: all)")
    p.add_argument("--figure", default=None, help="PNG: the curves' f on these prompts with their 95 %% bands")
    p.add_argument("--title", default="", help="the figure's title")
    args = p.parse_args(argv)
    if len(args.curves) < 2:
        p.error("give two curves or more")
    lo, _, hi = args.prompts.partition(":")
    curves, ends = load(args.curves)
    out = compare(curves, ends, int(lo or 0), int(hi) if hi else None)
    if args.figure:
        draw(out, args.figure, args.title)
    print(json.dumps(out, indent=1))
    return out


def draw(out: dict, path: str, title: str) -> None:
    """``edge_curves.png``'s two panels (``figures.edge_circuits.curves_figure``) of the compared curves, their f and
    bands recomputed on the kept prompts; each curve named by its curve name, which must be distinct."""
    from lit_svd.figures.edge_circuits import curves_figure
    from lit_svd.output import figure_png

    rows = {spec.rpartition(":")[2]: row for spec, row in out["curves"].items()}
    if len(rows) < len(out["curves"]):
        sys.exit("--figure names each curve by its curve name: give curves of distinct names")
    prompts = f"prompts {out['prompts'][0]}-{out['prompts'][1] - 1}"
    Path(path).write_bytes(figure_png(curves_figure(rows, f"{title} ({prompts})" if title else prompts)))


if __name__ == "__main__":
    main()
