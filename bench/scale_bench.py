"""Cost of each method at the sizes researchers study: time and peak memory per layer and for the whole model.

    python bench/scale_bench.py --models gpt2 pythia-160m gemma-2-2b llama-3.1-8b --layers 1 2
    python bench/scale_bench.py --exponents           # growth in d_model, layers and tokens (log-log fits)

Every model is ``arch:NAME?n_layers=N`` (``lit_svd.models.architectures``): random weights of the named model's
exact architecture, so the figures are the real dimensions' without the weights. Each measurement runs in its
own process (``--one``) so that its peak RSS is its own: the model build, then one method, timed alone:

* ``sad``: SAD of every head of every layer over IOI prompts (the shipped config's 16 null draws, null stride 4,
  pair null), bases included;
* ``mask``: one optimiser step of the direction mask over every layer's QK / OV / MLP directions (batch of 16
  IOI prompts, patch ablation), after one warm-up step; the component SVDs are timed apart (``setup_s``);
* ``mounts``: one site-layer (``--site``, layer 0) scored at ``--tokens`` WikiText-2 tokens, controls (null,
  ceiling) and steering included, plans included;
* ``mounts_all``: every site of every layer (the paper's setting), one layer per pass (``layers_per_pass: 1``);
* ``decompose``: the exact decomposition of one reader (a QK read of the last layer's head 0, query side, 8
  pairs of 8 IOI prompts) into every upstream write.

Per model the layers given (e.g. 1 and 2) give a per-layer slope (time and peak RSS) and a linear projection to
the model's full depth: ``whole = measured(n) + (L - n) * slope``. The exponents fit ``log cost`` against
``log size`` over 2-3 sizes: d_model (Llama-shaped models of 1 layer, widths 512 / 1024 / 2048, head 64 or 128,
MLP 3.5 d), layers (1 / 2 / 4 of the named model) and tokens (mounts at 1/2/4 x ``--tokens``; SAD at 16 / 32 / 64
prompts). Times are one torch thread's (``--threads``); on a shared machine they move with the load (printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = (
    Path(os.environ.get("LIT_SVD_SHARED", ROOT / ".." / "shared")) / "data" / "wikitext-2" / "valid.txt"
).resolve()
METHODS = ("sad", "mask", "mounts", "decompose", "mounts_all")
GiB = 1024**3


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _ioi(tokenizer, n: int, batch: int):
    from lit_svd.datamodules.tasks import TaskDataModule

    dm = TaskDataModule("ioi", tokenizer, n_train=0, n_val=0, n_test=n, batch_size=batch, seed=0)
    dm.setup("test")
    return list(dm.test_dataloader())


def one(method: str, model: str, dtype: str, size: int, site: str) -> dict:
    """Run one method once in this process; its times and the process's peak RSS."""
    import lightning.pytorch as pl
    import torch

    t0 = time.perf_counter()
    out: dict = {}
    if method == "sad":
        from lit_svd.modules.sad import SADAnalysisModule

        m = SADAnalysisModule(model=model, dtype=dtype, null_draws=16, null_stride=4, min_pairs=1)
        built = time.perf_counter()
        batches = _ioi(m.tokenizer, size, 16)
        start = time.perf_counter()
        with torch.no_grad():
            m._load_pass(0)
            for i, b in enumerate(batches):
                m.analyse_batch(b["clean_ids"], b["attention_mask"], b.get("index"), i)
        out["method_s"] = time.perf_counter() - start
        out["units"] = f"{size} prompts"
    elif method == "mask":
        from lit_svd.datamodules.tasks import TaskDataModule
        from lit_svd.modules.direction_mask import DirectionMaskModule

        m = DirectionMaskModule(model=model, dtype=dtype, ablation="patch", straight_through=True, soft_steps=1)
        built = time.perf_counter()
        out["setup_s"] = built - t0  # model build + component SVDs
        times: list[float] = []

        class Clock(pl.Callback):
            def on_train_batch_start(self, *a):
                self.t = time.perf_counter()

            def on_train_batch_end(self, *a):
                times.append(time.perf_counter() - self.t)

        dm = TaskDataModule("ioi", m.tokenizer, n_train=32, n_val=0, n_test=0, batch_size=16, seed=0)
        trainer = pl.Trainer(
            max_steps=2,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            callbacks=[Clock()],
        )
        start = time.perf_counter()
        trainer.fit(m, dm)
        out["method_s"] = times[-1]  # the second step (the first warms up)
        out["units"] = "1 step, 16 prompts"
    elif method in ("mounts", "mounts_all"):
        from lit_svd.datamodules.text import TextDataModule
        from lit_svd.modules.mounts import MountsAnalysisModule

        where = dict(layers=[0], sites=[site]) if method == "mounts" else dict(layers_per_pass=1)
        m = MountsAnalysisModule(model=model, dtype=dtype, null_stride=8, steer_texts=8, **where)
        built = time.perf_counter()
        dm = TextDataModule(tokenizer=m.tokenizer, path=str(WIKITEXT), seq_len=128, n_tokens=0, test_tokens=size)
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        start = time.perf_counter()
        trainer.test(m, dm, verbose=False)
        out["method_s"] = time.perf_counter() - start
        out["units"] = f"L0.{site} at {size} tokens" if method == "mounts" else f"every site-layer at {size} tokens"
    elif method == "decompose":
        from lit_svd.analysis.decompose import Decomposer, qk_reads
        from lit_svd.models import view as make_view
        from lit_svd.models.loading import load_causal_lm

        lm, tok = load_causal_lm(model, dtype=dtype)
        built = time.perf_counter()
        batch = _ioi(tok, 8, 8)[0]
        ids, mask = batch["clean_ids"], batch["attention_mask"]
        start = time.perf_counter()
        v = make_view(lm)
        dec = Decomposer(v)
        cache = v.run_with_cache(dec.points(mix=True), ids, mask)
        last = v.n_layers - 1
        n = mask.sum(1) - 1
        b = torch.arange(len(ids))
        split = dec.split(cache, qk_reads(dec, cache, last, 0, b, n, n - 1, mask, side="query"))
        out["method_s"] = time.perf_counter() - start
        out["units"] = f"{len(b)} pairs x {split.values.shape[-1]} nodes"
    else:
        raise ValueError(f"method={method!r}; allowed: {', '.join(METHODS)}")
    out["build_s"] = built - t0
    out["peak_rss_gib"] = rss_bytes() / GiB
    return out


def measure(method: str, model: str, dtype: str, size: int, site: str, threads: int) -> dict:
    """``one`` in a fresh process (its own peak RSS)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    env["OMP_NUM_THREADS"], env["TQDM_DISABLE"] = str(threads), "1"
    cmd = [sys.executable, __file__, "--one", method, model, dtype, str(size), site]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        errors = [l for l in proc.stderr.splitlines() if "Error" in l or "Killed" in l]
        return {"error": f"exit {proc.returncode}: " + (errors[-1][:200] if errors else "no error line (killed?)")}
    return json.loads(lines[-1])


def fit_exponent(sizes: list[float], costs: list[float]) -> float:
    """Least-squares slope of log cost against log size."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(c, 1e-9)) for c in costs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def full_layers(arch: str) -> int:
    from lit_svd.models.architectures import LAYER_KEYS, arch_config_dict

    cfg = arch_config_dict(arch)
    return next(cfg[k] for k in LAYER_KEYS if k in cfg)


def size_of(method: str, opts) -> int:
    return {"sad": opts.prompts, "mask": 16, "mounts": opts.tokens, "mounts_all": opts.tokens, "decompose": 8}[method]


def table(opts) -> list[dict]:
    """Per model and method: measured at each layer count, per-layer slope, projection to the full depth."""
    rows = []
    for arch in opts.models:
        L = full_layers(arch)
        for method in opts.methods:
            got = {}
            for n in opts.layers:
                r = measure(
                    method, f"arch:{arch}?n_layers={n}", opts.dtype, size_of(method, opts), opts.site, opts.threads
                )
                got[n] = r
                print(json.dumps({"model": arch, "method": method, "layers": n, "dtype": opts.dtype, **r}), flush=True)
            ok = {n: r for n, r in got.items() if "error" not in r}
            row = {"model": arch, "method": method, "dtype": opts.dtype, "full_layers": L, "measured": got}
            if len(ok) >= 2:
                (a, ra), (b, rb) = sorted(ok.items())[0], sorted(ok.items())[-1]
                for key in ("method_s", "peak_rss_gib"):
                    slope = (rb[key] - ra[key]) / (b - a)
                    row[f"{key}_per_layer"] = slope
                    row[f"{key}_whole"] = rb[key] + (L - b) * slope
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "measured"}), flush=True)
    return rows


def llama_width(d: int) -> str:
    """A one-layer Llama-shaped model of width ``d`` (head 64 up to 1024, then 128; 4 KV groups; MLP 3.5 d), saved
    as a local folder (the sizes scan of d_model)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_svd.models.loading import load_tokenizer

    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"scale_bench_llama_d{d}"
    if not (folder / "config.json").is_file():
        head = 64 if d <= 1024 else 128
        cfg = LlamaConfig(
            vocab_size=49152,
            hidden_size=d,
            num_hidden_layers=1,
            num_attention_heads=d // head,
            num_key_value_heads=max(1, d // head // 4),
            head_dim=head,
            intermediate_size=int(3.5 * d) // 64 * 64,
            tie_word_embeddings=True,
        )
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(folder)
        load_tokenizer("smollm2-135m").save_pretrained(folder)
    return str(folder)


def _setup_fit(sizes: list[int], runs: list[dict]) -> dict:
    """The mask's setup (model build + component SVDs) exponent, where the runs time it."""
    if all("setup_s" in r for r in runs):
        return {"setup": fit_exponent(sizes, [r["setup_s"] for r in runs])}
    return {}


def exponents(opts) -> dict:
    """Fitted growth exponents of time and peak RSS in d_model, layers and tokens (prompts for SAD)."""
    fits: dict = {}
    widths = [512, 1024, 2048]
    for method in opts.methods:
        res = [
            measure(method, llama_width(d), "float32", size_of(method, opts), opts.site, opts.threads) for d in widths
        ]
        print(json.dumps({"scan": "d_model", "method": method, "sizes": widths, "runs": res}), flush=True)
        if all("error" not in r for r in res):
            fits.setdefault(method, {})["d_model"] = {
                "time": fit_exponent(widths, [r["method_s"] for r in res]),
                "sizes": widths,
                **_setup_fit(widths, res),
            }
        arch = opts.models[0]
        depth = [1, 2, 4]
        res = [
            measure(method, f"arch:{arch}?n_layers={n}", opts.dtype, size_of(method, opts), opts.site, opts.threads)
            for n in depth
        ]
        print(json.dumps({"scan": "layers", "method": method, "model": arch, "sizes": depth, "runs": res}), flush=True)
        if all("error" not in r for r in res):
            fits.setdefault(method, {})["layers"] = {
                "time": fit_exponent(depth, [r["method_s"] for r in res]),
                "model": arch,
                **_setup_fit(depth, res),
            }
        if method in ("sad", "mounts"):
            base = size_of(method, opts)
            sizes = [base, 2 * base, 4 * base]
            res = [measure(method, f"arch:{arch}?n_layers=1", opts.dtype, s, opts.site, opts.threads) for s in sizes]
            print(json.dumps({"scan": "tokens", "method": method, "sizes": sizes, "runs": res}), flush=True)
            if all("error" not in r for r in res):
                fits[method]["tokens"] = {"time": fit_exponent(sizes, [r["method_s"] for r in res]), "sizes": sizes}
    print(json.dumps({"exponents": fits}), flush=True)
    return fits


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        method, model, dtype, size, site = sys.argv[2:7]
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        print(json.dumps(one(method, model, dtype, int(size), site)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "pythia-160m", "gemma-2-2b", "llama-3.1-8b"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS[:4]), choices=METHODS)
    parser.add_argument("--layers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--prompts", type=int, default=16, help="SAD: IOI prompts")
    parser.add_argument("--tokens", type=int, default=2048, help="mounts: tokens scored")
    parser.add_argument("--site", default="up", help="mounts: the site scored (layer 0)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--exponents", action="store_true", help="fit the growth exponents instead of the table")
    opts = parser.parse_args()
    load = os.getloadavg()
    print(f"scale_bench: {opts.threads} thread(s), load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}", flush=True)
    start = time.perf_counter()
    if opts.exponents:
        exponents(opts)
    else:
        table(opts)
    print(f"scale_bench: {time.perf_counter() - start:.0f} s, load at the end {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
