# %% [markdown]
# # One model, many questions: the notebook workflow
#
# `ls.model(...)` loads a model once: the Hugging Face model, its view (per-head weights, norms folded) and a
# cache of the sign-fixed SVD of every map, computed on first use and shared by every method. Each method then
# runs on it without reloading, and writes the same results.json as the command line with the same settings
# (`m.sad(...)` is `lit-svd test --config configs/sad/smollm2_ioi.yaml ...`; docs/api.md).

# %%
import os

import lit_svd as ls

MODEL = os.environ.get("LIT_SVD_EXAMPLE_MODEL", "smollm2-135m")
OUT = os.environ.get("LIT_SVD_EXAMPLE_OUT", "runs/notebook")
FAST = os.environ.get("LIT_SVD_EXAMPLE_FAST") == "1"  # the tests: a tiny model, a few prompts and steps

# The keywords of each call (bench/notebook_bench.py runs the same four as CLI commands, and times both ways).
SETTINGS = {
    "sad": {"n_test": 32, "batch_size": 16, "null_draws": 4},
    "masks": {"max_steps": 64, "soft_steps": 8, "n_train": 64, "n_val": 16, "n_test": 32, "batch_size": 8},
    "directions": {"n_random": 8, "max_claims": 256},
    "circuits": {"n_test": 32, "batch_size": 16, "n_check": 4, "n_random": 8},
}
if FAST:
    SETTINGS = {
        "sad": {"n_test": 8, "batch_size": 4, "null_draws": 4, "min_pairs": 2},
        "masks": {"max_steps": 6, "soft_steps": 2, "n_train": 16, "n_val": 8, "n_test": 8, "batch_size": 4},
        "directions": {"n_random": 4},
        "circuits": {"n_test": 8, "batch_size": 4, "depth": 1, "n_check": 2, "n_random": 4},
    }

# %% [markdown]
# Load once. Any loading option of the command line's model section can be given here (`dtype="bfloat16"`,
# `device_map=...`); a model already loaded in the notebook is handed in as `ls.model(hf_model, tokenizer)`.

# %%
m = ls.model(MODEL)
print(m)

# %% [markdown]
# Sparse attention decomposition of every head on IOI prompts, against its matched-spectrum null.

# %%
sad = m.sad(task="ioi", out=f"{OUT}/sad", **SETTINGS["sad"])
s = sad.headline
print(f"{s['n_heads_sparser_than_null']} of {s['n_heads_eligible']} heads are sparser than their matched null")

# %% [markdown]
# A 64-step IOI mask over the singular directions (the report's quick setting), then the direction check of
# its kept OV directions on the mask run's own test prompts.

# %%
ioi = m.masks(task="ioi", max_time=None, out=f"{OUT}/masks_ioi", **SETTINGS["masks"])
print(f"kept {ioi.kept} of {ioi.n_directions} directions; KL(full || hard) {ioi.kl_hard:.4f} ({ioi.eval_split})")

check = m.directions(ioi, out=f"{OUT}/directions_ioi", **SETTINGS["directions"])
print(f"{check.n_pass} of {check.n_directions} kept OV directions pass their causal check")

# %% [markdown]
# The circuit graph of IOI in singular directions, its strongest edges checked causally.

# %%
graph = m.circuit(task="ioi", out=f"{OUT}/circuits_ioi", **SETTINGS["circuits"])
print(f"graph: {graph.counts['nodes']} nodes, {graph.counts['edges']} edges, {graph.counts['passes']} edges pass")

# %% [markdown]
# Every map was decomposed once, whatever read it (masks, the direction check, SAD's QK bases):

# %%
print(m)
assert set(m.svds.computed.values()) == {1}
