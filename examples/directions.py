# %% [markdown]
# # Which kept directions to trust: the direction check
#
# A kept direction is a claim. The check patches each kept OV direction alone toward the corrupted prompt
# and compares the change of the task metric with that of random unit directions of the same head (one-sided
# 1 %); it also says whether the direction is isolated or part of a block of near-equal singular values, and
# what it reads out (docs/masks.md).

# %%
import os

import lit_svd as ls

MODEL = os.environ.get("LIT_SVD_EXAMPLE_MODEL", "smollm2-135m")
OUT = os.environ.get("LIT_SVD_EXAMPLE_OUT", "runs/examples")
FAST = os.environ.get("LIT_SVD_EXAMPLE_FAST") == "1"  # the tests: a tiny model, a few steps

# %% [markdown]
# First a mask run on IOI (short here), then the check of its kept directions. `ls.directions` takes the
# result (or the run folder) and uses the run's own test prompts, as the check requires.

# %%
settings = {"max_steps": 8, "soft_steps": 2, "n_train": 16, "n_val": 8, "n_test": 8, "batch_size": 4}
if not FAST:
    settings = {"max_steps": 48, "soft_steps": 16, "n_train": 256, "n_val": 32, "n_test": 64}
ioi = ls.masks(MODEL, task="ioi", max_time=None, out=f"{OUT}/masks_ioi", **settings)
check = ls.directions(ioi, n_random=8 if FAST else 32, out=f"{OUT}/directions_ioi")

# %%
print(f"{check.n_pass} of {check.n_directions} kept OV directions pass (level {check.level})")
print(
    f"isolated: {check.n_isolated}; pass rate isolated {check.fraction_pass_isolated},"
    f" in blocks {check.fraction_pass_in_blocks}"
)

# %% [markdown]
# One row per checked direction; `directions.html` in the run folder is the same table as a page.

# %%
table = check.table()
print(table.sort_values("z", ascending=False)[["component", "head", "direction", "z", "passes", "isolated"]].head())
print("page:", check.folder / "directions.html")
