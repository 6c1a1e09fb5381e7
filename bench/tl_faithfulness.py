"""TransformerLens 4.3 node attribution beside lit_svd's faithfulness curves, SmolLM2-135M IOI: the same 64 test
prompts, the same ablation and sizes. Prints one JSON object and, with ``--out DIR``, writes it and a figure there.

    pip install -e '.[peers]'      # transformer-lens==4.3.0, in a separate venv (bench only; lit_svd never imports it)
    OMP_NUM_THREADS=1 python bench/tl_faithfulness.py --out DIR

What it runs:

1. lit_svd loads SmolLM2 and the 64 IOI test prompts of ``bench/faithfulness_bench.py`` (``TaskDataModule(task="ioi",
   n_train=1000, n_val=64, n_test=64, test_last=True, seed=0)``, two batches of 32); a ``TransformerBridge`` is
   booted on a copy of the same HF model (``bench/tl_bench.py``).
2. TL's own utilities (``transformer_lens.tools.analysis``): edge-granularity ``attribution_patch`` and
   ``faithfulness`` are tried on one prompt pair; what they refuse (GQA: 9 query heads on 3 KV heads) is recorded
   verbatim under ``tl_refuses``. Node granularity runs.
3. Two TL-side head / MLP attributions, each per prompt (TL's gradient cache runs ``model(tokens)``, no attention
   mask, so every prompt is cut to its own length: with right padding and a causal model nothing before the cut
   changes), mean over the prompts, summed over positions:
   - ``tl_hooks``: ``cache_activation_and_gradient`` (TL's hooks) on the clean prompt with the gradient of the
     logit difference, on the corrupted one without; ``a = grad_clean(hook_z) . (z_clean - z_corrupt)`` per head,
     ``hook_mlp_out`` likewise per MLP: lit_svd's definition (``lit_svd/analysis/attribution.py``), gradient at
     the clean run.
   - ``tl_attribution_patch``: TL's ``attribution_patch(..., EdgeAttributionConfig("node"))`` as shipped, its
     node scores summed over positions. TL takes the gradient on the *corrupted* run (its "denoising"
     convention), so it is a different first-order estimate, not expected to equal ours.
4. Both are compared with lit_svd's ``eap_heads`` attributions (Pearson, Spearman, max |difference| / max |ours|
   over the 270 heads and 30 MLPs), expanded into direction rankings by ``eap_ranking`` and scored with
   ``faithfulness_curves`` (lit_svd's all-position node ablation, MIB's sizes) beside ``eap_heads`` and
   ``random_0``: CPR / CMD and seconds per curve.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from conditions import conditions  # noqa: E402  (bench/conditions.py)


def prompt_pairs(batches):
    """One ``(clean [1, n], corrupt [1, n], metric_fn)`` per prompt, cut to its ``n`` real tokens; ``metric_fn``:
    the logit difference (correct - wrong) at the answer position of ``[1, n, V]`` logits."""
    for b in batches:
        for i, n in enumerate(b["attention_mask"].sum(1).tolist()):
            a, c, w = (int(b[k][i]) for k in ("answer_pos", "correct_id", "wrong_id"))
            yield b["clean_ids"][i : i + 1, :n], b["corrupt_ids"][i : i + 1, :n], _logit_diff(a, c, w)


def _logit_diff(a: int, c: int, w: int):
    return lambda logits: logits[0, a, c] - logits[0, a, w]


def tl_refusals(bridge, clean, corrupt, metric_fn) -> dict:
    """What TL's edge-level utilities say on this model (the exception's type and message; None: it ran), and a
    silent trap: gradients cached at ``hook_z`` alone come back None (no backward hook fires)."""
    from transformer_lens.tools.analysis import EdgeAttributionConfig, attribution_patch, faithfulness
    from transformer_lens.tools.analysis.attribution_patching import cache_activation_and_gradient

    tries = {
        "attribution_patch(granularity='edge')": lambda: attribution_patch(
            bridge, clean, corrupt, metric_fn, EdgeAttributionConfig(granularity="edge")
        ),
        "faithfulness(circuit=[])": lambda: faithfulness(bridge, clean, corrupt, metric_fn, []),
    }
    z = [f"blocks.{l}.attn.hook_z" for l in range(bridge.cfg.n_layers)]
    grads = cache_activation_and_gradient(bridge, clean, metric_fn, z).gradients
    n_none = sum(g is None for g in grads.values())
    out = {
        "cache_activation_and_gradient(names_filter=hook_z only)": f"no error, but {n_none} of {len(grads)}"
        " gradients are None (with hook_embed in the filter, as TL's default, none are)"
    }
    for name, fn in tries.items():
        try:
            fn()
            out[name] = None
        except Exception as e:  # noqa: BLE001  (recorded, whatever it is)
            out[name] = f"{type(e).__name__}: {e}"
    return out


def tl_attributions(bridge, batches, n_layers: int, n_heads: int) -> tuple[dict, dict]:
    """``({"tl_hooks": Attributions, "tl_attribution_patch": Attributions}, info)`` (module docstring, item 3)."""
    from transformer_lens.tools.analysis.attribution_patching import attribution_patch, cache_activation_and_gradient

    from lit_svd.analysis.attribution import Attributions

    z, mlp = [f"blocks.{l}.attn.hook_z" for l in range(n_layers)], [f"blocks.{l}.hook_mlp_out" for l in range(n_layers)]
    sums = {
        k: (torch.zeros(n_layers, n_heads, dtype=torch.float64), torch.zeros(n_layers, dtype=torch.float64))
        for k in ("tl_hooks", "tl_attribution_patch")
    }
    metrics, n = {"clean": 0.0, "corrupt": 0.0}, 0
    for clean, corrupt, metric_fn in prompt_pairs(batches):
        # names_filter None: TL's node set (hook_embed, hook_z, hook_mlp_out); hook_embed must be in it (tl_refusals)
        c = cache_activation_and_gradient(bridge, clean, metric_fn)
        x = cache_activation_and_gradient(bridge, corrupt, metric_fn, compute_gradient=False)
        heads, mlps = sums["tl_hooks"]
        for l in range(n_layers):
            dz, dm = c.activations[z[l]] - x.activations[z[l]], c.activations[mlp[l]] - x.activations[mlp[l]]
            heads[l] += (c.gradients[z[l]].double() * dz.double()).sum((0, 1, 3))  # [1, n, H, d_head] -> [H]
            mlps[l] += (c.gradients[mlp[l]].double() * dm.double()).sum()
        heads, mlps = sums["tl_attribution_patch"]
        for node, score in attribution_patch(bridge, clean, corrupt, metric_fn).node_scores.items():
            if node.kind == "attn_head_out":
                heads[node.layer, node.head] += score
            elif node.kind == "mlp_out":
                mlps[node.layer] += score
        metrics["clean"] += float(c.metric)
        metrics["corrupt"] += float(x.metric)
        n += 1
    attr = {k: Attributions(h / n, m / n, n) for k, (h, m) in sums.items()}
    return attr, {"tl_metric_clean_mean": metrics["clean"] / n, "tl_metric_corrupt_mean": metrics["corrupt"] / n}


def agreement(ours, theirs) -> dict:
    """Pearson, Spearman and max |difference| relative to max |ours| over every head and MLP."""
    a = torch.cat([ours.heads.flatten(), ours.mlps])
    b = torch.cat([theirs.heads.flatten(), theirs.mlps])

    def ranks(v):
        return v.argsort().argsort().double()

    return {
        "pearson": float(torch.corrcoef(torch.stack([a, b]))[0, 1]),
        "spearman": float(torch.corrcoef(torch.stack([ranks(a), ranks(b)]))[0, 1]),
        "max_abs_diff_rel": float((a - b).abs().max() / a.abs().max()),
        "n_units": len(a),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--name", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="the name TL boots it under")
    p.add_argument("--n-test", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--sizes", type=float, nargs="+", default=None, help="default: MIB's grid")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    from importlib.metadata import version

    from transformer_lens.model_bridge import TransformerBridge

    from lit_svd.analysis.attribution import attributions
    from lit_svd.analysis.faithfulness import MIB_SIZES, Universe, faithfulness_curves, universe_components
    from lit_svd.analysis.rankings import eap_ranking, random_ranking
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.models import load_causal_lm
    from lit_svd.models import view as make_view

    start = conditions()
    t0 = time.monotonic()
    model, tok = load_causal_lm(args.model)
    for param in model.parameters():
        param.requires_grad_(False)
    view = make_view(model)
    dm = TaskDataModule(
        task="ioi",
        tokenizer=args.model,
        n_train=1000,
        n_val=64,
        n_test=args.n_test,
        test_last=True,
        batch_size=args.batch_size,
        seed=0,
    )
    batches = list(dm.test_dataloader())
    comps = universe_components(view, progress=True)
    universe = Universe(comps)
    timing = {"load_and_svds_s": time.monotonic() - t0}

    t = time.monotonic()
    tl_model = copy.deepcopy(model).requires_grad_(True)  # TL's gradients need a graph: frozen weights give none
    bridge = TransformerBridge.boot_transformers(args.name, hf_model=tl_model, tokenizer=tok)
    bridge.eval()
    timing["tl_boot_s"] = time.monotonic() - t
    clean, corrupt, metric_fn = next(prompt_pairs(batches))
    refuses = tl_refusals(bridge, clean, corrupt, metric_fn)

    t = time.monotonic()
    attr = {"eap_heads": attributions(view, batches, "ioi")}
    timing["eap_heads_attribution_s"] = time.monotonic() - t
    t = time.monotonic()
    tl_attr, tl_info = tl_attributions(bridge, batches, view.n_layers, view.n_heads)
    attr.update(tl_attr)
    timing["tl_attributions_s"] = time.monotonic() - t  # both TL attributions: 4 forwards + 2 backwards per prompt
    agree = {k: agreement(attr["eap_heads"], a) for k, a in tl_attr.items()}
    for k, a in agree.items():
        assert math.isfinite(a["pearson"]) and math.isfinite(a["spearman"]), (k, a)

    rankings, info = {}, {}
    for k, a in attr.items():
        rankings[k], info[k] = eap_ranking(universe, a, view.n_kv_heads)
    rankings["random_0"] = random_ranking(len(universe), 0)
    sizes = args.sizes or MIB_SIZES
    curves, summary = faithfulness_curves(view, comps, batches, rankings, "ioi", sizes, progress=True, axes=["raw"])
    rows = {name: c["raw"].row() for name, c in curves.items()}
    out = {
        "model": args.model,
        "tl_name": args.name,
        "transformer_lens": version("transformer-lens"),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "n_prompts": summary["n_prompts"],
        "n_directions": summary["n_directions"],
        "m_full": summary["m_full"],
        "m_empty": summary["m_empty"],
        **tl_info,
        "tl_refuses": refuses,
        "agreement_with_eap_heads": agree,
        "identical_ranking_to_eap_heads": {k: bool(torch.equal(rankings[k], rankings["eap_heads"])) for k in tl_attr},
        "cpr_cmd": {k: {"cpr": r["cpr"], "cmd": r["cmd"], "seconds": r["seconds"]} for k, r in rows.items()},
        "curves": rows,
        "rankings": info,
        "attributions": {k: {"heads": a.heads.tolist(), "mlps": a.mlps.tolist()} for k, a in attr.items()},
        "timing": {**timing, "curves_wall_s": summary["wall_s"], "total_s": time.monotonic() - t0},
        "conditions": {"start": start, "end": conditions()},
    }
    for k, a in agree.items():
        print(f"{k} vs eap_heads: pearson {a['pearson']:.6f} spearman {a['spearman']:.6f}", file=sys.stderr)
    print(json.dumps(out, indent=1))
    if args.out:
        from lit_svd.figures.faithfulness import curves_figure
        from lit_svd.modules.faithfulness import method_results
        from lit_svd.output import write_json

        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "tl_faithfulness.json", out)
        title = (
            f"SmolLM2-135M IOI, {summary['n_prompts']} test prompts: lit_svd EAP vs TransformerLens node attribution"
        )
        curves_figure(method_results(curves), title).savefig(
            folder / "tl_faithfulness.png", dpi=130, bbox_inches="tight"
        )


if __name__ == "__main__":
    main()
