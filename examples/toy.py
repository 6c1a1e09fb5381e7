# %% [markdown]
# # The toy model: singular vectors align with the features a head attends between
#
# A sparse-feature autoencoder is trained jointly with one attention head whose template says "feature 0
# attends to feature 1". After training, the top singular vectors of the head's Omega = W_Q^T W_K point along
# those two features (docs/toy.md). This runs the shipped config `configs/toy/single_pair.yaml` from Python.
#
# Run as a script (`python examples/toy.py`) or cell by cell (VS Code / Jupyter with Jupytext: `# %%` cells).

# %%
import os

import lit_svd as ls

OUT = os.environ.get("LIT_SVD_EXAMPLE_OUT", "runs/examples")
FAST = os.environ.get("LIT_SVD_EXAMPLE_FAST") == "1"  # the tests: a few steps only

# %% [markdown]
# `ls.run` takes any config file; every key can be overridden by keyword (`max_steps` is the Trainer's,
# `lr` the module's, `batch_size` the data module's: docs/api.md has the scheme).

# %%
toy = ls.run("configs/toy/single_pair.yaml", max_steps=20 if FAST else 600, out=f"{OUT}/toy")
print(type(toy).__name__, "in", toy.folder)

# %% [markdown]
# `.headline` holds the headline numbers (`print(toy)` shows them with the kind and the folder; `.summary` is the
# whole results.json content).

# %%
print(toy)
head = toy.headline
print(f"mean |cos| of the top singular vectors with the template's features: {head['mean_abs_cos']:.3f}")
print(f"sigma_1 / sigma_2: {head['min_sigma_ratio']:.1f}")

# %% [markdown]
# `.table()` is one row per trained instance (a pandas DataFrame); `.figures` the run's figures.

# %%
table = toy.table()
print(table[["seed", "mean_abs_cos", "sigma_ratio", "max_singular_index"]])
print("figures:", ", ".join(toy.figures))
