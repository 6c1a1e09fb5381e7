# %% [markdown]
# # Directional circuits: which singular directions a task needs
#
# Every QK, OV and MLP matrix is split into its singular directions; a mask over the directions is trained so
# that the masked model keeps the full model's answer distribution (KL) with as few directions as possible
# (L1). The kept directions are the task's circuit, direction by direction (docs/masks.md).

# %%
import os

import lit_svd as ls

MODEL = os.environ.get("LIT_SVD_EXAMPLE_MODEL", "smollm2-135m")
OUT = os.environ.get("LIT_SVD_EXAMPLE_OUT", "runs/examples")
FAST = os.environ.get("LIT_SVD_EXAMPLE_FAST") == "1"  # the tests: a tiny model, a few steps

# %% [markdown]
# The shipped recipe trains 240 steps (~15 min for SmolLM2 on two cores); here a short run on the
# gender-pronoun task. `max_time=None` lifts the config's time limit.

# %%
settings = {"max_steps": 8, "soft_steps": 2, "n_train": 16, "n_val": 8, "n_test": 8, "batch_size": 4}
if not FAST:
    settings = {"max_steps": 48, "soft_steps": 16, "n_train": 256, "n_val": 32, "n_test": 64}
gp = ls.masks(MODEL, task="gp", max_time=None, trajectory_every=4, out=f"{OUT}/masks_gp", **settings)

# %%
print(f"kept {gp.kept} of {gp.n_directions} directions ({gp.kept_fraction:.2%})")
print(f"KL(full || hard-masked) on {gp.eval_split}: {gp.kl_hard:.4f}")
print(f"{gp.metric}: full {gp.logit_diff_full:.3f}, hard-masked {gp.logit_diff_hard:.3f}")
print("per kind:", {k: v["kept"] for k, v in gp.per_kind.items()})

# %% [markdown]
# One row per kept direction, with its block of near-equal singular values:

# %%
kept = gp.table()
print(kept.groupby("kind").size())
print(kept.sort_values("sigma", ascending=False)[["component", "group", "direction", "sigma", "isolated"]].head())
