"""Cost of the exact split of one reader over every upstream writer, against a forward, on SmolLM2 IOI prompts.

    OMP_NUM_THREADS=1 python bench/decompose_bench.py                    # 16 IOI test prompts
    OMP_NUM_THREADS=1 python bench/decompose_bench.py --prompts 32 --layer 20 --head 4

One process, the same prompts for every path: the model's plain forward (no hooks; the logits only at the answer
rows), one cached forward with the points the decomposition needs (``view.run_with_cache(dec.points(mix=True))``,
eager attention), then the full split of one reader (one direction, on every prompt of the batch, over all
upstream writers: the embedding, every OV and MLP-output direction, every bias) for each read kind, at the
answer position (QK: toward the IO name's position, the query side and the key side of SAD's relative term).
Each path is timed ``--repeat`` times (median). Prints each time, the split's nodes and rows, the ratio of a
split to the plain forward, and the largest |pieces - coefficient| (exactness on the way).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from conditions import report_conditions  # bench/conditions.py


def timed(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--layer", type=int, default=None, help="reader layer (default: the last)")
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    report_conditions()

    from lit_svd.analysis.decompose import Decomposer, logit_reads, mlp_reads, ov_reads, qk_reads
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.metrics import task_scorer
    from lit_svd.models import load_causal_lm, view

    model, tok = load_causal_lm(args.model)
    v = view(model)
    layer = v.n_layers - 1 if args.layer is None else args.layer
    dm = TaskDataModule("ioi", tok, n_train=0, n_val=0, n_test=args.prompts, batch_size=args.prompts)
    batch = next(iter(dm.test_dataloader()))
    ids, mask, pos = batch["clean_ids"], batch["attention_mask"], batch["answer_pos"]
    rows = torch.arange(len(pos))
    io = torch.tensor([(ids[i, : pos[i]] == batch["correct_id"][i]).nonzero()[0, 0] for i in rows.tolist()])

    dec, t_build = timed(lambda: Decomposer(v), 1)
    with torch.no_grad():
        _, t_plain = timed(lambda: model(input_ids=ids, attention_mask=mask, logits_to_keep=pos.unique()), args.repeat)
    cache, t_cache = timed(lambda: v.run_with_cache(dec.points(mix=True), ids, mask), args.repeat)
    weights = task_scorer("ioi").logit_weights(torch.zeros(len(pos), v.vocab_size), batch)
    readers = {
        "QK query side (relative)": lambda: qk_reads(
            dec, cache, layer, args.head, rows, pos, io, mask, directions=[0], relative=True
        ),
        "QK key side (relative)": lambda: qk_reads(
            dec, cache, layer, args.head, rows, pos, io, mask, directions=[0], side="key", relative=True
        ),
        "OV input, mixed by the pattern": lambda: ov_reads(dec, cache, layer, args.head, rows, pos, [0], mix=True),
        "MLP input": lambda: mlp_reads(dec, cache, layer, rows, pos, [0]),
        "logit difference": lambda: logit_reads(dec, cache, rows, pos, weights),
    }
    print(
        f"{args.model}: {len(pos)} IOI prompts of {ids.shape[1]} tokens (padded); reader layer {layer}, head"
        f" {args.head}, direction 0; decomposer built in {t_build:.1f} s ({len(dec.nodes)} writer nodes)"
    )
    print(f"plain forward {t_plain:.3f} s; cached forward with the decomposition's points {t_cache:.3f} s")
    for name, make in readers.items():
        reads = make()
        split, t = timed(lambda reads=reads: dec.split(cache, reads), args.repeat)
        err = float((split.residual().abs() / split.values.abs().sum(-1).clamp_min(1e-30)).max())
        print(
            f"{name:>32}: {t:.3f} s = {t / t_plain:.2f} x a plain forward; {split.values.shape[0]} readers x"
            f" {split.values.shape[1]} nodes from {len(reads.batch)} rows; max |residual| / sum |pieces| {err:.1e}"
        )


if __name__ == "__main__":
    main()
