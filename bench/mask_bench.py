"""Direction-mask training step: low-rank masked forward+backward vs a plain forward+backward of the
unmasked model, and vs rebuilding every dense augmented masked matrix per step (the reference
implementation's cost), on the same batch. Each mode runs in its own process so that its peak
memory (max RSS) is its own. Prints seconds per step, ratios and peak memory.

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


def run_mode(mode: str, name: str, layers: int, batch: int, length: int, repeats: int) -> dict:
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
    comps = build_components(view) if mode != "plain" else []
    iv = Intervention(view, comps)
    theta = {n: t.requires_grad_(True) for n, t in initial_logits(comps, 0.9).items()}

    def step():
        if mode == "plain":
            emb = model.get_input_embeddings()(ids).requires_grad_(True)
            logits = model(inputs_embeds=emb, logits_to_keep=pos).logits[:, 0]
            kl_divergence(logits, full).mean().backward()
            return
        lambdas = {n: t.sigmoid() for n, t in theta.items()}
        with iv.apply(lambdas, positions=pos[:, 0]):
            logits = model(input_ids=ids, logits_to_keep=pos).logits[:, 0]
        loss = mask_loss(logits, full, lambdas, 2e-4)[0]
        if mode == "dense":  # the reference rebuilds every augmented matrix with its mask, every step
            for c in comps:
                dense = (c.U * (c.S * lambdas[c.name]).unsqueeze(-2)) @ c.V.mT
                loss = loss + 0.0 * dense.sum()
        loss.backward()
        for t in theta.values():
            t.grad = None

    step()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"mode": mode, "seconds": min(times), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "n_directions": sum(c.n_directions for c in comps)}


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
        print(json.dumps(run_mode(args.mode, args.model, args.layers, args.batch, args.length, args.repeats)))
        return
    results = {}
    for mode in ("plain", "masked", "dense"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--model", args.model, "--layers", str(args.layers),
                              "--batch", str(args.batch), "--length", str(args.length), "--repeats", str(args.repeats)],
                             capture_output=True, text=True, check=True)
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[mode]
        print(f"{mode:>7}: {r['seconds']:.3f} s/step, peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
    plain, masked, dense = (results[m]["seconds"] for m in ("plain", "masked", "dense"))
    print(f"model {args.model} ({args.layers if args.model == 'smollm2-shapes' else 'all'} layers), batch {args.batch}"
          f" x {args.length} tokens, {results['masked']['n_directions']} directions, one thread, best of {args.repeats}")
    print(f"masked / plain forward+backward: {masked / plain:.2f}x   (target <= 2x)")
    print(f"dense rebuild / masked:          {dense / masked:.2f}x   (target >= 5x; a lower bound, see docstring)")


if __name__ == "__main__":
    main()
