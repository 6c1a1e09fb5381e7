"""How fast the task and text datasets are built, against the model's forward pass on the same data.

    .venv/bin/python bench/data_bench.py [--model smollm2-135m] [--n 512] [--forward-batches 2] [--threads 1]

For each task (IOI, GP, GT) it times building ``--n`` test prompts through ``TaskDataModule`` (the
tokenizer already loaded), then times SmolLM2's forward pass on batches of the same prompts (clean
only), and prints prompts/s and tokens/s for both and the ratio forward time / build time per prompt.
The text row builds a 16,384-token WikiText subsample from the local file and times the forward pass
on some of its windows, per token. Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from conditions import report_conditions  # bench/conditions.py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lit_svd.datamodules.tasks import TaskDataModule  # noqa: E402
from lit_svd.datamodules.text import TextDataModule  # noqa: E402
from lit_svd.models.loading import load_causal_lm  # noqa: E402

WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2" / "valid.txt"


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


@torch.no_grad()
def forward_seconds(model, batches) -> tuple[float, int, int]:
    """Seconds, items and real tokens of one forward pass over each batch."""
    seconds, items, tokens = 0.0, 0, 0
    for ids, mask in batches:
        _, s = timed(lambda: model(input_ids=ids, attention_mask=mask).logits)
        seconds, items, tokens = seconds + s, items + ids.shape[0], tokens + int(mask.sum())
    return seconds, items, tokens


def row(name, n_items, n_tokens, build_s, fwd_s, fwd_items):
    build_per, fwd_per = build_s / n_items, fwd_s / fwd_items
    print(
        f"{name:5s} build {n_items / build_s:10.0f} items/s {n_tokens / build_s:11.0f} tokens/s | forward"
        f" {fwd_items / fwd_s:8.1f} items/s | forward/build per item {fwd_per / build_per:8.1f}x"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--forward-batches", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is fastest on a busy machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    report_conditions()
    model, tok = load_causal_lm(args.model)
    print(f"model {args.model}, torch threads {torch.get_num_threads()}, {args.n} prompts per task")
    for task in ("ioi", "gp", "gt"):
        dm, build_s = timed(
            lambda: TaskDataModule(task, tok, n_train=0, n_val=0, n_test=args.n, batch_size=args.batch_size)
        )
        examples = dm.splits["test"].examples
        n_tokens = sum(len(e.clean_ids) + len(e.corrupt_ids) for e in examples)
        batches = [
            (b["clean_ids"], b["attention_mask"]) for b, _ in zip(dm.test_dataloader(), range(args.forward_batches))
        ]
        fwd_s, fwd_items, _ = forward_seconds(model, batches)
        row(task, len(examples), n_tokens, build_s, fwd_s, fwd_items)
    if WIKITEXT.is_file():
        dm, build_s = timed(lambda: TextDataModule(tok, path=str(WIKITEXT), seq_len=128, n_tokens=16384, batch_size=4))
        batches = [
            (b["input_ids"], b["attention_mask"]) for b, _ in zip(dm.test_dataloader(), range(args.forward_batches))
        ]
        fwd_s, _, fwd_tokens = forward_seconds(model, batches)
        # per token: building tokenizes the whole file (available_tokens), not only the 16,384 kept
        build_per, fwd_per = build_s / dm.available_tokens, fwd_s / fwd_tokens
        print(
            f"text  build {dm.available_tokens / build_s:10.0f} tokens/s (whole file, {dm.available_tokens} tokens;"
            f" {build_s:.2f} s for the 16,384-token subsample) | forward {fwd_tokens / fwd_s:8.0f} tokens/s |"
            f" forward/build per token {fwd_per / build_per:8.1f}x"
        )


if __name__ == "__main__":
    main()
