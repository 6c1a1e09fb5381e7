# %% [markdown]
# # Tiled-SVD mounts of every linear site
#
# Each weight matrix is cut into column tiles; the SVD of each tile gives "mounts" (a trigger v, a write u and
# a strength sigma). A site-layer passes when its tiled mounts explain the full write better than the
# whole-matrix SVD, column sampling and random directions, and steer the unembedding causally. The
# structureless null (same singular values, random vectors) is scored by the same rules (docs/mounts.md).

# %%
import os

import lit_svd as ls

MODEL = os.environ.get("LIT_SVD_EXAMPLE_MODEL", "smollm2-135m")
OUT = os.environ.get("LIT_SVD_EXAMPLE_OUT", "runs/examples")
FAST = os.environ.get("LIT_SVD_EXAMPLE_FAST") == "1"  # the tests: a tiny model, a few tokens

# %% [markdown]
# The shipped config scores 16,384 WikiText tokens; 2,048 give a first look in a few minutes.

# %%
settings = {"test_tokens": 512, "batch_size": 2, "steer_texts": 2, "steer_mounts": 2, "modes_sweep": [1, 2, 4]}
settings = settings if FAST else {}  # (a tiny model's tiles are 4 wide: at most 4 modes)
mounts = ls.mounts(MODEL, **{"test_tokens": 2048, **settings}, out=f"{OUT}/mounts")

# %%
print(f"{mounts.n_pass} of {mounts.n_site_layers} site-layers pass; the null: {mounts.n_pass_null}")
print("tile widths:", mounts.tile_widths)

# %% [markdown]
# One row per site-layer: lifts of each strategy, the checks, and the null's columns (`null_*`).

# %%
sites = mounts.table()
print(sites.groupby("site")[["pass", "null_pass"]].sum())
print(sites[["site", "layer", "lift_tiled", "lift_whole", "lift_random", "pass"]].head(8).to_string(index=False))
