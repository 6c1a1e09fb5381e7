"""Direction-mask training step: low-rank masked forward+backward vs a plain forward+backward of the
unmasked model, and vs rebuilding every dense augmented masked matrix per step (the reference
implementation's cost), on the same batch. Times are interleaved round-robin in one process (best of
``--repeats``) so that load from other processes hits every mode alike; peak memory (max RSS) is
measured in a separate process per mode. Prints seconds per step, ratios and peak memory.

    python bench/mask_bench.py                          # SmolLM2 shapes, 6 layers, random weights
    python bench/mask_bench.py --model smollm2-135m     # the real SmolLM2 (30 layers; slow here)

The dense mode is the reference implementation's per-step work: every augmented matrix
``M(lambda) = U diag(S * lambda) V^T`` is rebuilt from its SVD and *applied* in place of the model's
own map (q, k, gate, up, down: ``[1, x] @ M``; OV per head: ``sum_h A_h [1, x] M_h`` from the eager
attention pattern), with the backward through both. Both masked modes act as training does: q and k
masks at every position, OV and MLP masks at the answer position. Its SVDs are taken of the unfolded
view, so at lambda = 1 it reproduces the model's logits; the bench checks that before timing. (The model's own
v and o projections still run underneath the replaced attention output: a small over-count, about
a tenth of a layer's linear work.) Llama-style models (SmolLM2 and its shapes) only.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager

import torch
from conditions import report_conditions  # bench/conditions.py
from torch import Tensor


def _model(name: str, layers: int):
    if name == "smollm2-shapes":
        from lit_svd.models.tiny import tiny_causal_lm

        return tiny_causal_lm(
            "llama",
            hidden_size=576,
            intermediate_size=1536,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            num_hidden_layers=layers,
        ).eval()
    from lit_svd.models.loading import load_causal_lm

    return load_causal_lm(name)[0]


def _augmented(x: Tensor) -> Tensor:
    return torch.cat([torch.ones_like(x[..., :1]), x], dim=-1)


def _rebuild(c, lam: Tensor) -> Tensor:
    """The dense masked matrices ``[G, d_in+1, d_out]`` of one component."""
    return (c.U * (c.S * lam).unsqueeze(-2)) @ c.V.mT


SITES = {"q": "q", "k": "k", "mlp_in": "up", "mlp_gate": "gate", "mlp_out": "down"}


def _dense(x: Tensor, c, lam: Tensor) -> Tensor:
    return torch.einsum("...d,gde->...ge", _augmented(x), _rebuild(c, lam)).flatten(-2)


@contextmanager
def dense_reference(view, comps: dict, lambdas: dict[str, Tensor], positions: Tensor | None = None):
    """Within the block the model runs on dense masked matrices rebuilt from ``comps`` (unfolded
    view). q and k maps are replaced at every position; OV (recomputed from the eager attention
    pattern) and the MLP maps at ``positions`` (one per example; None: everywhere), as in training."""
    from lit_svd.models.hooks import Hook, hooks
    from lit_svd.models.intervene import put_rows_at, rows_at

    specs = []
    with ExitStack() as stack:
        for name, c in comps.items():
            lam = lambdas[name]
            if c.kind == "ov":

                def hook(module, args, kwargs, out, c=c, lam=lam):
                    A = rows_at(out[1].transpose(1, 2), positions)  # [B, (T_query,) H, T_key]
                    mixed = torch.einsum("b...hj,bjd->b...hd", A, _augmented(kwargs["hidden_states"]))
                    written = torch.einsum("...hd,hde->...e", mixed, _rebuild(c, lam))
                    return (put_rows_at(out[0], positions, written),) + tuple(out[1:])

                specs.append(Hook(view.block(c.layer).self_attn, hook, "post"))
            elif c.kind in ("q", "k") or positions is None:  # replaced outright: the model's map never runs
                module = view.site_module(c.layer, SITES[c.kind])
                module.forward = lambda x, c=c, lam=lam: _dense(x, c, lam)
                stack.callback(module.__dict__.pop, "forward")
                continue
            else:
                specs.append(
                    Hook(
                        view.site_module(c.layer, SITES[c.kind]),
                        lambda module, args, kwargs, out, c=c, lam=lam: put_rows_at(
                            out, positions, _dense(rows_at(args[0], positions), c, lam)
                        ),
                        "post",
                    )
                )
        with hooks(*specs):
            yield


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
    raw = make_view(model, fold_norms=False)
    dense_comps = {c.name: c for c in build_components(raw)}
    ones = {n: torch.ones(c.shape) for n, c in dense_comps.items()}
    err = 0.0
    for at in (None, pos[:, 0]):
        with torch.no_grad(), dense_reference(raw, dense_comps, ones, at):
            rebuilt = model(input_ids=ids, logits_to_keep=pos).logits[:, 0]
        err = max(err, float((rebuilt - full).abs().max() / full.abs().max()))
    if err > 1e-3:
        raise AssertionError(f"dense reference at lambda = 1 differs from the model: relative error {err:.2e}")

    def plain():
        emb = model.get_input_embeddings()(ids).requires_grad_(True)
        logits = model(inputs_embeds=emb, logits_to_keep=pos).logits[:, 0]
        kl_divergence(logits, full).mean().backward()

    def masked(dense: bool = False):
        lambdas = {n: t.sigmoid() for n, t in theta.items()}
        at = pos[:, 0]  # as in training: q, k masks everywhere, OV and MLP masks at the answer position
        context = dense_reference(raw, dense_comps, lambdas, at) if dense else iv.apply(lambdas, positions=at)
        with context:
            logits = model(input_ids=ids, logits_to_keep=pos).logits[:, 0]
        loss = mask_loss(logits, full, lambdas, 2e-4)[0]
        loss.backward()
        for t in theta.values():
            t.grad = None

    steps = {"plain": plain, "masked": masked, "dense": lambda: masked(dense=True)}
    return steps, sum(c.n_directions for c in comps), err


def time_all(name: str, layers: int, batch: int, length: int, repeats: int) -> dict:
    """Seconds per step of each mode, interleaved round-robin in one process (best of ``repeats``),
    so that load from other processes hits every mode alike."""
    steps, n, err = setup(name, layers, batch, length)
    times = {m: [] for m in steps}
    for f in steps.values():
        f()  # warm-up
    for _ in range(repeats):
        for m, f in steps.items():
            t0 = time.perf_counter()
            f()
            times[m].append(time.perf_counter() - t0)
    return {"seconds": {m: min(t) for m, t in times.items()}, "n_directions": n, "dense_error": err}


def peak_memory(mode: str, name: str, layers: int, batch: int, length: int) -> float:
    """Peak RSS (MB) of a process that sets up and runs one step of ``mode`` only."""
    steps = setup(name, layers, batch, length)[0]
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
    report_conditions("each measured side runs in its own process with 1 torch thread")
    memory = {}
    for mode in ("plain", "masked", "dense"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--model",
                args.model,
                "--layers",
                str(args.layers),
                "--batch",
                str(args.batch),
                "--length",
                str(args.length),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        memory[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    res = time_all(args.model, args.layers, args.batch, args.length, args.repeats)
    sec = res["seconds"]
    for mode in ("plain", "masked", "dense"):
        print(f"{mode:>7}: {sec[mode]:.3f} s/step, peak RSS {memory[mode]:.0f} MB (own process)")
    print(
        f"model {args.model} ({args.layers if args.model == 'smollm2-shapes' else 'all'} layers), batch {args.batch}"
        f" x {args.length} tokens, {res['n_directions']} directions, one thread, best of {args.repeats} interleaved"
    )
    print(f"masked / plain forward+backward: {sec['masked'] / sec['plain']:.2f}x   (target <= 2x)")
    print(f"dense reference at lambda = 1 vs the model's logits: max relative error {res['dense_error']:.1e}")
    print(f"dense rebuild+apply / masked:    {sec['dense'] / sec['masked']:.2f}x   (target >= 5x)")


if __name__ == "__main__":
    main()
