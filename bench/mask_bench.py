"""Direction-mask training step: low-rank masked forward+backward vs a plain forward+backward of the
unmasked model, and vs rebuilding every dense augmented masked matrix per step (the reference
implementation's cost), on the same batch. Times are interleaved round-robin in one process (best of
``--repeats``) so that load from other processes hits every mode alike; peak memory (max RSS) is
measured in a separate process per mode. Prints seconds per step, ratios and peak memory.

    python bench/mask_bench.py                          # SmolLM2 shapes, 6 layers, random weights
    python bench/mask_bench.py --model smollm2-135m     # the real SmolLM2 (30 layers; slow here)

The dense mode times only the rebuild of ``U diag(S * lambda) V^T`` for every component (with its
backward) on top of the masked step, so its ratio is a lower bound on what the reference pays (it
also applies the dense matrices).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def _model(name: str, layers: int):
    if name == "smollm2-shapes":
        from lit_svd.models.tiny import tiny_causal_lm

        return tiny_causal_lm("llama", hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                              num_key_value_heads=3, head_dim=64, num_hidden_layers=layers).eval()
    from lit_svd.models.loading import load_causal_lm

    return load_causal_lm(name)[0]


def setup(name: str, layers: int, batch: int, length: int):
    """Model, batch, components and the three step functions (plain, masked, dense)."""
    from lit_svd.analysis.masks import initial_logits, mask_loss
    from lit_svd.metrics import kl_divergence
    from lit_svd.models import view as make_view
    from lit_svd.models.intervene import Intervention, build_components

    torch.set_num_threads(1)
    model = _model(name, layers)
    for p in model.parameters():
        p.requires_grad_(False)
    ids = torch.randint(0, 10000, (batch, length), generator=torch.Generator().manual_seed(0))
    pos = torch.full((batch, 1), length - 1)
    with torch.no_grad():
        full = model(input_ids=ids, logits_to_keep=pos).logits[:, 0]
    view = make_view(model)
    comps = build_components(view)
    iv = Intervention(view, comps)
    theta = {n: t.requires_grad_(True) for n, t in initial_logits(comps, 0.9).items()}

    def plain():
        emb = model.get_input_embeddings()(ids).requires_grad_(True)
        logits = model(inputs_embeds=emb, logits_to_keep=pos).logits[:, 0]
        kl_divergence(logits, full).mean().backward()

    def masked(dense: bool = False):
        lambdas = {n: t.sigmoid() for n, t in theta.items()}
        with iv.apply(lambdas, positions=pos[:, 0]):
            logits = model(input_ids=ids, logits_to_keep=pos).logits[:, 0]
        loss = mask_loss(logits, full, lambdas, 2e-4)[0]
        if dense:  # the reference rebuilds every augmented matrix with its mask, every step
            for c in comps:
                loss = loss + 0.0 * ((c.U * (c.S * lambdas[c.name]).unsqueeze(-2)) @ c.V.mT).sum()
        loss.backward()
        for t in theta.values():
            t.grad = None

    steps = {"plain": plain, "masked": masked, "dense": lambda: masked(dense=True)}
    return steps, sum(c.n_directions for c in comps)


def time_all(name: str, layers: int, batch: int, length: int, repeats: int) -> dict:
    """Seconds per step of each mode, interleaved round-robin in one process (best of ``repeats``),
    so that load from other processes hits every mode alike."""
    steps, n = setup(name, layers, batch, length)
    times = {m: [] for m in steps}
    for m, f in steps.items():
        f()  # warm-up
    for _ in range(repeats):
        for m, f in steps.items():
            t0 = time.perf_counter()
            f()
            times[m].append(time.perf_counter() - t0)
    return {"seconds": {m: min(t) for m, t in times.items()}, "n_directions": n}


def peak_memory(mode: str, name: str, layers: int, batch: int, length: int) -> float:
    """Peak RSS (MB) of a process that sets up and runs one step of ``mode`` only."""
    steps, _ = setup(name, layers, batch, length)
    steps[mode]()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-shapes")
    parser.add_argument("--layers", type=int, default=6, help="layers of the random smollm2-shapes model")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(peak_memory(args.mode, args.model, args.layers, args.batch, args.length)))
        return
    memory = {}
    for mode in ("plain", "masked", "dense"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--model", args.model, "--layers", str(args.layers),
                              "--batch", str(args.batch), "--length", str(args.length)],
                             capture_output=True, text=True, check=True)
        memory[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    res = time_all(args.model, args.layers, args.batch, args.length, args.repeats)
    sec = res["seconds"]
    for mode in ("plain", "masked", "dense"):
        print(f"{mode:>7}: {sec[mode]:.3f} s/step, peak RSS {memory[mode]:.0f} MB (own process)")
    print(f"model {args.model} ({args.layers if args.model == 'smollm2-shapes' else 'all'} layers), batch {args.batch}"
          f" x {args.length} tokens, {res['n_directions']} directions, one thread, best of {args.repeats} interleaved")
    print(f"masked / plain forward+backward: {sec['masked'] / sec['plain']:.2f}x   (target <= 2x)")
    print(f"dense rebuild / masked:          {sec['dense'] / sec['masked']:.2f}x   (target >= 5x; a lower bound, see docstring)")

if __name__ == "__main__":
    main()
