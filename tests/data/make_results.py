"""Write tests/data/results/<experiment>.json: a results.json of each result type that no stored run in docs/results/
or bench/results_equivalence_reference.json holds (and of faithfulness, whose stored runs predate its two size axes),
from runs on the tiny random Llama (seed 0), loaded once: a 6-step IOI mask run, then its mask-thresholds,
mask-blocks, mask-curve, direction check and faithfulness curves (attribution, the mask, random), compare-directions
of the tiny Llama against itself, and a small edge-circuits run. Long lists are cut as docs/results/ cuts them
(bench/make_results_md.py's ``strip``).

    PYTHONPATH=. python tests/data/make_results.py      # ~1 min on two cores; tests/test_results_show.py reads them
    PYTHONPATH=. python tests/data/make_results.py edges   # only the edge-circuits run
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results"
MASKS = dict(max_steps=6, max_time=None, soft_steps=2, steps_per_batch=2, n_train=16, n_val=8, n_test=8, batch_size=4)
QUIET = dict(enable_progress_bar=False, enable_model_summary=False)
# the mask run's data (its test prompts are apart from its training split), two attribution methods, the mask, random
FAITHFULNESS = dict(
    methods=["eap_ig", "eap_heads", "mask", "random"], random_seeds=[0, 1], sizes=[0.01, 0.1, 0.5, 1.0],
    attribution_prompts=8, ig_steps=2, n_train=16, n_val=8, n_test=8, batch_size=4, limit_test_batches=None,
)  # fmt: skip
EDGES = dict(n_train=12, n_val=2, n_test=6, batch_size=3, n_attribution=6, sizes=[0.01, 0.1, 0.5, 1.0], n_check=2)


def strip_rule():
    spec = importlib.util.spec_from_file_location("make_results_md", ROOT / "bench" / "make_results_md.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.strip


def store(folder: Path, strip, names: dict[str, str]) -> Path:
    """The run's results.json, stripped, with the temporary and cache folders named (``names``: path -> name)."""
    text = (folder / "results.json").read_text()
    for path, name in names.items():
        text = text.replace(path, name)
    data = json.loads(text)
    cut: dict = {}
    data = strip(data, cut=cut)
    data.setdefault("stored", {"rule": "bench/make_results_md.py's strip", "cut": cut})
    target = OUT / f"{data['experiment']}.json"
    target.write_text(json.dumps(data, indent=1) + "\n")
    return target


def main(only: list[str]) -> None:
    import lit_svd as ls
    from lit_svd.cli_tools import run_tool
    from lit_svd.models.loading import cache_root

    strip = strip_rule()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        written = []
        if not only or "masks" in only:
            tiny = ls.model("tiny-llama")  # loaded once: the mask run, its check, the faithfulness
            masks = tiny.masks(task="ioi", out=work / "masks", trajectory_every=2, **MASKS, **QUIET)
            run = str(masks.folder)
            written.append(tiny.directions(masks, n_random=4, out=work / "check", **QUIET).folder)
            for name, args in (
                ("thresholds", ["mask-thresholds", run, "--thresholds", "0.01", "0.5", "0.9"]),
                ("blocks", ["mask-blocks", run, "--rel-gaps", "0.01", "0.05"]),
                ("curve", ["mask-curve", run]),
                ("compare", ["compare-directions", "tiny-llama", "tiny-llama", "--top", "4"]),
            ):
                run_tool([*args, "--out", str(work / name)])
                written.append(work / name)
            faithfulness = tiny.faithfulness(task="ioi", out=work / "faith", mask_run=run, **FAITHFULNESS, **QUIET)
            written.append(faithfulness.folder)
        if not only or "edges" in only:
            written.append(ls.edge_circuits("tiny-llama", task="ioi", out=work / "edges", n_random=3, **EDGES).folder)
        names = {tmp: "<tmp>", str(cache_root()): "<cache>"}
        for folder in written:
            print(store(Path(folder), strip, names))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
