"""docs/results.md from the stored runs in docs/results/: a number in the docs is the number of a stored run.

    python bench/make_results_md.py                                   # write docs/results.md
    python bench/make_results_md.py --check                           # exit 1 if docs/results.md is stale
    python bench/make_results_md.py --store RUN_FOLDER NAME           # store a run's results.json, then write

``--store`` copies a run's results.json to ``docs/results/NAME.json`` with one rule for size (``strip``): outside
the ``summary`` (the headline figures, never cut), a list of rows (dicts) keeps its first 16 rows and any other
list its first 64 items; every cut list is named in the file's ``stored.cut`` with its full length.

The page has one table per method (``experiment``): the headline number, its control, the command that ran,
and the provenance (lit_svd version, commit, date, device). Then the list of README figures that still come
from earlier runs whose results.json were not stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "results.md"
MAX_ROWS, MAX_ITEMS = 16, 64


# --- storing a run ----------------------------------------------------------------------------------------
def strip(data: Any, path: str = "", cut: dict | None = None) -> Any:
    """``data`` with long lists cut (rows to MAX_ROWS, other lists to MAX_ITEMS); ``cut`` collects path -> length."""
    cut = {} if cut is None else cut
    if path == "summary":  # the headline figures are never cut
        return data
    if isinstance(data, dict):
        return {k: strip(v, f"{path}.{k}" if path else k, cut) for k, v in data.items()}
    if isinstance(data, list):
        limit = MAX_ROWS if data and all(isinstance(v, dict) for v in data) else MAX_ITEMS
        if len(data) > limit:
            cut[path] = len(data)
            data = data[:limit]
        return [strip(v, f"{path}[{i}]", cut) for i, v in enumerate(data)]
    return data


def store(run: Path, name: str) -> Path:
    """Copy ``run``'s results.json (a folder or the file) to docs/results/NAME.json, stripped."""
    source = run / "results.json" if run.is_dir() else run
    if not source.is_file():
        found = sorted(run.glob("**/results.json"), key=lambda p: p.stat().st_mtime) if run.is_dir() else []
        if not found:
            raise SystemExit(f"error: {run}: no results.json\nhint: give a finished run's folder or its results.json")
        source = found[-1]
    cut: dict = {}
    data = strip(json.loads(source.read_text()), cut=cut)
    data["stored"] = {"rule": f"outside the summary: rows cut to {MAX_ROWS}, other lists to {MAX_ITEMS}", "cut": cut}
    STORED.mkdir(parents=True, exist_ok=True)
    target = STORED / f"{name}.json"
    target.write_text(json.dumps(data, indent=1) + "\n")
    return target


# --- headline and control per method ----------------------------------------------------------------------
def _f(x: Any, digits: int = 4) -> str:
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def toy_alignment(d: dict) -> tuple[str, str]:
    s = d["summary"]
    first = (d.get("history") or [{}])[0].get("mean_abs_cos")
    first = sum(first) / len(first) if isinstance(first, list) and first else first
    head = (
        f"mean \\|cos\\| {_f(s.get('mean_abs_cos'))}, {s.get('n_all_pairs_cos_ge_0.95')}/{d.get('n_instances')}"
        f" instances with every pair >= 0.95, sigma1/sigma2 >= {_f(s.get('min_sigma_ratio'))}"
    )
    return head, f"the same head at step {d['history'][0]['step']}: mean \\|cos\\| {_f(first)}"


def sad(d: dict) -> tuple[str, str]:
    s = d["summary"]
    head = (
        f"{s['n_heads_sparser_than_null']}/{s['n_heads_eligible']} heads sparser than their matched-spectrum"
        f" null (mean sparsity {_f(s['mean_sparsity'])})"
    )
    control = (
        f"matched null mean {_f(s['mean_sparsity_null'])} ({d.get('null_draws')} draws, every"
        f" {d.get('null_stride')} prompts); Haar rotation: {s['n_heads_sparser_than_rotated']}/{s['n_heads_eligible']}"
    )
    return head, control


def evaluate(d: dict) -> tuple[str, str]:
    heads, controls = [], []
    for t in d["tasks"]:
        metric = "logit_diff" if "logit_diff" in t else "prob_diff"
        acc = f"accuracy {_f(t['accuracy'])}, " if "accuracy" in t else ""
        heads.append(f"{t['task'].upper()} {acc}{metric} {_f(t.get(metric))}")
        acc = f"accuracy {_f(t['corrupt_accuracy'])}, " if "corrupt_accuracy" in t else ""
        controls.append(f"{t['task'].upper()} {acc}{metric} {_f(t.get('corrupt_' + metric))}")
    n = {t.get("n_test") for t in d["tasks"]}
    return f"{'; '.join(heads)} ({'/'.join(map(str, n))} test prompts)", "corrupted prompts: " + "; ".join(controls)


def circuit_graph(d: dict) -> tuple[str, str]:
    c = d["counts"]
    head = (
        f"{d['task'].upper()}, {d['n_prompts']} prompts: {c['nodes']} nodes, {c['edges']} edges; of the"
        f" {c['checked']} strongest edges {c['passes_z']} pass z, {c['passes']} also move >= 1 % of the gap"
    )
    rows = [
        f"{r['source']}: overlap {r['overlap']} vs chance {_f(r['expected'], 3)} (p {_f(r['p_value'], 2)})"
        for r in d.get("agreement") or []
    ]
    return head, "per edge 32 random readers of the same writer" + ("; agreement " + "; ".join(rows) if rows else "")


def faithfulness(d: dict) -> tuple[str, str]:
    cpr = {k: v["cpr"] for k, v in d["faithfulness"].items() if not k.startswith("random")}
    head = f"{d['task'].upper()} CPR: " + ", ".join(f"{k} {_f(v, 3)}" for k, v in cpr.items())
    r = d.get("random")
    if not r:  # a run of some rankings only: the random baseline is in the task's full run
        return head, "no random ranking in this run (same prompts and ablation as the task's full run)"
    return head, f"random rankings: CPR {_f(r['cpr_mean'], 3)} +- {_f(r['cpr_std'], 2)} ({r['seeds']} seeds)"


def tiled_mounts(d: dict) -> tuple[str, str]:
    found = [
        f"{site} {check}"
        for site, checks in (d.get("discriminating") or {}).items()
        for check, yes in checks.items()
        if yes
    ]
    head = f"{d['model']}: {d['n_pass']}/{d['n_site_layers']} site-layers pass every check ({d['n_tokens']} tokens)"
    null = f"structureless null (same spectra, Haar vectors): {d.get('n_pass_null')}/{d['n_site_layers']}"
    return head, f"{null}; checks where real beats null (Fisher, 5 %): {', '.join(found) or 'none'}"


HEADLINES = {
    "toy_alignment": toy_alignment,
    "tiled_mounts": tiled_mounts,
    "sad": sad,
    "evaluate": evaluate,
    "circuit_graph": circuit_graph,
    "faithfulness": faithfulness,
}
TITLES = {
    "circuit_graph": "Circuit graphs ([circuits.md](circuits.md))",
    "faithfulness": "Faithfulness curves ([circuits.md](circuits.md#faithfulness))",
    "toy_alignment": "Toy SVF alignment ([toy.md](toy.md))",
    "sad": "Sparse attention decomposition ([sad.md](sad.md))",
    "evaluate": "Task evaluation ([data.md](data.md))",
    "tiled_mounts": "Tiled-SVD mounts ([mounts.md](mounts.md), [scale.md](scale.md))",
}

# README figures whose runs were not stored (their numbers stay in the pages, marked as earlier runs).
NOT_STORED = [
    "Toy single pair over 16 seeds, multi-pair, Theorem 1 and its superposition sweep (toy.md)",
    "Views exact to the HF forward: max errors on SmolLM2 and Gemma-3 (models.md; re-measured by the tests)",
    "Directional circuits, SmolLM2 and Gemma-3 IOI / GP / GT, the paper's recipe, the sparsity-KL curve (masks.md)",
    "Blocks of near-equal singular values and the direction check of the IOI mask run (masks.md)",
    "Tiled mounts on SmolLM2 and Gemma-3 with their ceiling and null (mounts.md)",
    "SAD over training and the mechanisms-during-training callbacks (sad.md, training.md)",
    "Gemma-3 SAD (11/72) and task figures (sad.md, data.md)",
    "Every benchmark ratio (each method's page, its benchmark section)",
    "Faithfulness on SmolLM2 IOI with the 60-step mask and the TransformerLens comparison (circuits.md)",
]


def provenance(d: dict) -> tuple[str, str]:
    p = d.get("provenance") or {}
    argv = list(p.get("command") or [])
    if argv and argv[0].endswith("lit_svd/cli_tools.py"):  # run as python -m lit_svd.cli_tools
        argv[0] = "python -m lit_svd.cli_tools"
    command = " ".join(argv)
    commit = (p.get("git_commit") or "?")[:9] + (" (dirty)" if p.get("git_dirty") else "")
    when = (p.get("created") or "?")[:10]
    return command, f"lit_svd {p.get('lit_svd_version')}, {commit}, {when}, {p.get('device') or 'device not recorded'}"


def render() -> str:
    """The whole page, from the files in docs/results/ (sorted by name)."""
    runs = [(f.stem, json.loads(f.read_text())) for f in sorted(STORED.glob("*.json"))]
    lines = [
        "# Results of stored runs",
        "",
        "Every number on this page is read from a results.json stored in [results/](results/) by",
        "`bench/make_results_md.py`, which writes this page (a test checks that it matches). One table per",
        "method: the headline, its control, the command that ran it, and where it came from.",
        "",
    ]
    by_kind: dict[str, list] = {}
    for name, data in runs:
        by_kind.setdefault(data.get("experiment", "?"), []).append((name, data))
    for kind in sorted(by_kind):
        lines += [f"## {TITLES.get(kind, kind)}", "", "| run | headline | control | command | provenance |"]
        lines.append("|---|---|---|---|---|")
        for name, data in by_kind[kind]:
            head, control = HEADLINES[kind](data) if kind in HEADLINES else ("(no headline rule)", "")
            command, prov = provenance(data)
            lines.append(f"| [{name}](results/{name}.json) | {head} | {control} | `{command}` | {prov} |")
        lines.append("")
    lines += [
        "## Figures from earlier runs, not stored",
        "",
        "These README and docs figures come from runs whose results.json were not kept; rerun the page's",
        "command and store the run (`--store`) to move a figure here.",
        "",
        *(f"- {item}" for item in NOT_STORED),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", nargs=2, metavar=("RUN", "NAME"), help="store a run's results.json first")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/results.md is not what is written")
    args = parser.parse_args(argv)
    if args.store:
        print(f"stored {store(Path(args.store[0]), args.store[1])}")
    text = render()
    if args.check:
        same = PAGE.is_file() and PAGE.read_text() == text
        print("docs/results.md is up to date" if same else "docs/results.md is stale: run bench/make_results_md.py")
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
