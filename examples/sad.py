# %% [markdown]
# # Sparse attention decomposition (SAD) of every head
#
# A head's attention logit between two tokens is a sum over the head's singular directions. SAD measures how
# few of those terms carry it (Rolls-Tovee sparsity, N_recon) and compares every head with controls that keep
# its spectrum: a matched-spectrum null (random heads with the same singular values), the same head on pairs
# it does not attend to, and a rotated basis (docs/sad.md).

# %%
import os

import lit_svd as ls

MODEL = os.environ.get("LIT_SVD_EXAMPLE_MODEL", "smollm2-135m")
OUT = os.environ.get("LIT_SVD_EXAMPLE_OUT", "runs/examples")
FAST = os.environ.get("LIT_SVD_EXAMPLE_FAST") == "1"  # the tests: a tiny model, few prompts

# %% [markdown]
# Same settings as `python -m lit_svd test --config configs/sad/smollm2_ioi.yaml`, on fewer prompts.

# %%
sad = ls.sad(MODEL, task="ioi", n_test=8 if FAST else 32, batch_size=4 if FAST else 16, out=f"{OUT}/sad")

# %% [markdown]
# `print(sad)` gives the kind, the model, the headline numbers and the folder; `sad.headline` is those numbers.

# %%
print(sad)
s = sad.headline
print(f"{s['n_heads_sparser_than_null']} of {s['n_heads_eligible']} heads are sparser than their matched null")
print(f"median N_recon: {s['n_recon_median']:g} (matched null {s['n_recon_median_null']:g})")

# %% [markdown]
# One row per head. The sparsest heads, against the 5th percentile of their null:

# %%
heads = sad.table()
cols = ["layer", "head", "n_pairs", "sparsity", "sparsity_null_p05", "sparser_than_null", "n_recon_median"]
print(heads.sort_values("sparsity")[cols].head(10).to_string(index=False))

# %% [markdown]
# The figures (in Jupyter, evaluating `sad` shows the numbers, the table's head and these figures).

# %%
print("figures:", ", ".join(sad.figures))
sad  # noqa: B018  (Jupyter shows the result)
