"""Figures and the page of single-direction results: the causal check of a mask run's claims
(``DirectionCheckResult``: ``directions_z.png``, ``directions.html``) and the comparison of two models'
directions (``CompareDirectionsResult``: ``compare_directions.png``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lit_svd.figures import pages
from lit_svd.figures.base import new_figure
from lit_svd.results.base import draws
from lit_svd.results.directions import COLUMNS, CompareDirectionsResult, DirectionCheckResult, direction_row


@draws(DirectionCheckResult)
def figures(result: DirectionCheckResult) -> dict:
    """``directions_z``: z against the isolation gap, one point per direction (none without directions)."""
    return {"directions_z": z_against_gap(result)} if result.directions else {}


def z_against_gap(result: DirectionCheckResult):
    rows = result.directions
    fig, ax = new_figure(figsize=(6, 4))
    for isolated, marker in ((True, "o"), (False, "x")):
        pick = [r for r in rows if r["isolated"] == isolated]
        if pick:
            ax.scatter(
                [max(r["gap"], 1e-4) for r in pick],
                [r["z"] for r in pick],
                s=10,
                marker=marker,
                c=["tab:green" if r["passes"] else "tab:red" for r in pick],
                label=f"{'isolated' if isolated else 'in a block'} ({len(pick)})",
            )
    ax.axhline(
        result.z_pass, color="k", lw=0.8, ls="--", label=f"z = {result.z_pass:.2f} (one-sided {result.level:.0%})"
    )
    ax.set_xscale("log")
    ax.set_xlabel("isolation gap (relative, to the nearest singular value outside the block)")
    ax.set_ylabel("z of |effect| against random directions")
    ax.set_title("claimed directions: green passes the causal check")
    ax.legend(fontsize=8)
    return fig


@draws(CompareDirectionsResult)
def compare_figures(result: CompareDirectionsResult) -> dict:
    """``compare_directions``: per kind, layers x heads, the fraction of the top directions that keep their
    identity (kept or block)."""
    kinds = list(result.per_kind)
    fig, axes = new_figure(1, len(kinds), figsize=(3.2 * len(kinds) + 1, 3.6), squeeze=False)
    im = None
    for ax, kind in zip(axes[0], kinds):
        mine = [r for r in result.matrices if r["matrix"] == kind]
        layers = sorted({r["layer"] for r in mine})
        heads = sorted({r["head"] or 0 for r in mine})
        grid = np.full((len(layers), len(heads)), np.nan)
        for r in mine:
            grid[layers.index(r["layer"]), heads.index(r["head"] or 0)] = (r["n_kept"] + r["n_block"]) / len(r["state"])
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_title(f"{kind}: top {result.top} directions held", fontsize=9)
        ax.set_xlabel("head" if len(heads) > 1 else "")
        ax.set_xticks(range(len(heads)) if len(heads) > 1 else [])
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(layers)), layers, fontsize=6)
    fig.colorbar(im, ax=axes[0].tolist(), fraction=0.03)
    fig.suptitle(f"{Path(result.model_a).name} -> {Path(result.model_b).name}", fontsize=9)
    return {"compare_directions": fig}


FACTS = (
    "run",
    "model",
    "task",
    "claims",
    "n_directions",
    "fraction_isolated",
    "fraction_pass",
    "fraction_pass_isolated",
    "level",
    "n_random",
    "n_prompts",
    "rel_gap",
    "wall_s",
)


def html_page(result: DirectionCheckResult) -> str:
    """The static, offline page of a direction check: its facts as a list, then the sortable table of its
    directions (inline CSS and JavaScript, no network; ``figures/pages.py``)."""
    content = result.to_dict()
    title = f"{result.model} {result.task}: {result.claims} directions, blocks, causal check, readouts"
    about = (
        f"Each direction of the component (one head's OV map, or an MLP map) is patched alone at the answer"
        f" position toward the corrupted prompt's coefficient; effect = mean change of the task metric."
        f" z = (|effect| - mean |null|) / std |null| over random unit directions of the same head; passes"
        f" at z &ge; {result.z_pass:.3f} (one-sided {result.level:.0%}). Block: neighbours within the relative"
        f" gap share a block; a direction in a block of size &gt; 1 is not identifiable alone. Readout: top tokens of"
        f" +/- the direction (write side: through the final norm and unembedding; read side: token"
        f" embeddings through the layer's norm). Click a column header to sort."
    )
    rows = [{**direction_row(r), "_passes": r["passes"]} for r in result.directions]
    table = pages.sortable_table(
        "directions",
        COLUMNS,
        rows,
        row_attrs=lambda r: f'class="{"pass" if r["_passes"] else "fail"}"',
        cell_class=lambda c: "tokens" if c.startswith("readout_") else ("passes" if c == "passes" else ""),
    )
    body = f"{pages.facts({k: content[k] for k in FACTS})}\n<p>{about}</p>\n{table}"
    return pages.page(title, body)
