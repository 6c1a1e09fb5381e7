"""Causal check throughput: claimed directions per second, batched over directions against one at a time.

    OMP_NUM_THREADS=1 python bench/causal_bench.py --run runs/masks_ioi            # a finished SmolLM2 IOI mask run
    OMP_NUM_THREADS=1 python bench/causal_bench.py --run runs/masks_ioi --layers 3 15 27 --n-random 8

On the run's test prompts (the first ``--prompts``) and the kept OV directions of ``--layers`` (default: three
layers that have kept directions, early / middle / late), three paths over the same probes (each claim plus
``--n-random`` random directions per head):

* ``batched``: ``analysis.causal.patched_metrics`` with ``--rows`` (prompt, direction) rows per forward: prefix
  cached once, the last token fanned out from the component's layer (what the ``test`` config runs);
* ``one-at-a-time``: the same code with one direction per forward (prefix cache and fan-out still on);
* ``full forward``: one direction per full padded forward through ``Intervention.apply`` (no cache, no fan-out;
  only the answer rows unembedded; timed on ``--full`` directions of the layer with the most claims).

The three are checked to agree (max |difference| of the metric printed) and timed in turn, in one process
under the same load. Prints directions/s (claims only, null draws included in the time), (prompt, direction)
rows/s, and the ratios.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import yaml
from conditions import report_conditions  # bench/conditions.py


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="folder of a finished direction-mask run (masks.pt, config.yaml)")
    p.add_argument("--layers", type=int, nargs="*", default=None)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n-random", type=int, default=8)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--full", type=int, default=4, help="directions timed on the full-forward path")
    args = p.parse_args()
    report_conditions()

    from lit_svd.analysis.causal import corrupted_coefficients, patched_metrics, probe_set
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.models import view as make_view
    from lit_svd.models.fanout import unembed_columns
    from lit_svd.models.hooks import capture
    from lit_svd.models.intervene import Intervention, build_components
    from lit_svd.models.loading import load_causal_lm
    from lit_svd.modules.direction_check import run_claims

    run = Path(args.run)
    state, claims, _ = run_claims(run, "kept", ["ov"])
    data = dict(yaml.safe_load((run / "config.yaml").read_text())["data"]["init_args"])
    data.pop("num_workers", None)
    dm = TaskDataModule(**data)
    test = dm.splits["test"]
    batch = dm.collate([test[i] for i in range(min(args.prompts, len(test)))])
    task = test.task
    model, _ = load_causal_lm(state["model"])
    view = make_view(model)
    have = sorted(int(n.split(".")[0][1:]) for n in claims)
    layers = sorted(set(args.layers or [have[0], have[len(have) // 2], have[-1]]))
    comps = build_components(view, ["ov"], layers)
    comps = [c for c in comps if c.name in claims]
    refs = corrupted_coefficients(view, comps, batch)
    n_claims = sum(len(claims[c.name]) for c in comps)
    probes = {c.name: probe_set(c, claims[c.name], args.n_random) for c in comps}
    n_probes = sum(len(p) for p in probes.values())
    n = len(batch["answer_pos"])
    print(
        f"{n_claims} kept OV directions of layers {[c.layer for c in comps]}, {n_probes} probes with"
        f" {args.n_random} random per head, {n} test prompts ({task})",
        flush=True,
    )

    def timed(rows: int):
        start = time.monotonic()
        out = {c.name: patched_metrics(view, probes[c.name], batch, refs[c.name], task, rows) for c in comps}
        return out, time.monotonic() - start

    batched, t_batched = timed(args.rows)
    single, t_single = timed(1)  # one direction per forward (a group of prompts per forward)
    # full padded forward per direction through Intervention.apply, on the first --full claims of the component
    # with the most claims; only the answer rows go through the unembedding (as the batched path)
    c = max(comps, key=lambda c: len(claims[c.name]))
    iv = Intervention(view, [c])
    cols = torch.stack([batch["correct_id"], batch["wrong_id"]], -1)
    start = time.monotonic()
    full = []
    for g, k in claims[c.name][: args.full]:
        scales = iv.ones()
        scales[c.name][g, k] = 0.0
        with (
            torch.no_grad(),
            iv.apply(scales, positions=batch["answer_pos"], reference=refs),
            capture({"final": view.norm_module("final", None)}, "pre") as got,
        ):
            model(input_ids=batch["clean_ids"], attention_mask=batch["attention_mask"], logits_to_keep=1)
        logits = unembed_columns(view, got["final"][torch.arange(n), batch["answer_pos"]], cols)
        full.append(logits[:, 0] - logits[:, 1])
    t_full = (time.monotonic() - start) / len(full)  # per direction
    diff_single = max(float((batched[k] - single[k]).abs().max()) for k in batched)
    diff_full = float((torch.stack(full, 1) - batched[c.name][:, 1 : 1 + len(full)]).abs().max())
    per_probe = {"batched": t_batched / n_probes, "one-at-a-time": t_single / n_probes, "full forward": t_full}
    print(f"agreement: batched vs one-at-a-time max |d metric| {diff_single:.2e}; vs full forward {diff_full:.2e}")
    for name, t in per_probe.items():
        claims_per_s = n_claims / (t * n_probes)
        print(
            f"{name:>14}: {t * 1e3:8.1f} ms per direction ({n} prompts), {n / t:8.1f} rows/s,"
            f" {claims_per_s:6.3f} claimed directions/s (with their null)"
        )
    print(
        f"ratio batched / one-at-a-time: {per_probe['one-at-a-time'] / per_probe['batched']:.1f}x faster;"
        f" batched / full forward: {per_probe['full forward'] / per_probe['batched']:.1f}x faster"
    )
    print(
        f"wall: batched {t_batched:.1f} s, one-at-a-time {t_single:.1f} s, full forward {t_full * len(full):.1f} s"
        f" for {len(full)} directions"
    )


if __name__ == "__main__":
    main()
