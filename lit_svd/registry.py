"""What every way in offers, in one place and without torch: the methods and the tools.

``METHODS``: one entry per method. The Python API reads it (``ls.<name>(model, task=..., **keys)`` and
``m.<name>(...)`` on a model object), the report reads it (its steps, their quick settings and headline figures)
and the command line lists it (``lit-svd --help``). Adding a method is one entry here (and its configs). ``TOOLS``:
the command-line tools beside the LightningCLI (``lit-svd <tool> ...``, ``lit_svd.cli_tools``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from lit_svd import CONFIGS


@dataclass(frozen=True)
class Step:
    """One step of the report: the method on ``task``; ``after``: the step whose run it reads (the method's
    ``reads`` keyword gets that run's folder); ``optional``: skipped, not failed, when the model has no config."""

    name: str
    task: str | None = None
    minutes: float = 1.0  # expected wall minutes on SmolLM2 with the shipped config (the ETA's weights)
    quick_minutes: float = 0.5  # the same with --quick
    title: str = ""
    after: str | None = None
    optional: bool = False
    method: str = ""  # the method's name (``report_steps`` sets it)


@dataclass(frozen=True)
class Method:
    """A method as every way in knows it.

    ``folder`` / ``pattern``: its configs, ``configs/<folder>/<pattern>`` (``{prefix}``: the model's config prefix,
    ``{task}``); ``task``: the default task (None: the method takes none); ``reads``: the keyword naming a finished
    run the method reads, whose model and task it takes (the direction check: ``run``, a mask run); ``report``: its
    steps in the report; ``quick``: the report's ``--quick`` keywords; ``headline``: the figure a report shows first.
    """

    name: str
    summary: str
    folder: str
    pattern: str = "{prefix}_{task}.yaml"
    task: str | None = "ioi"
    reads: str | None = None
    report: tuple[Step, ...] = ()
    quick: dict[str, Any] = field(default_factory=dict)
    headline: str | None = None
    aliases: tuple[str, ...] = ()


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "sad",
            "sparse attention decomposition of every head on task prompts (a SADResult)",
            "sad",
            report=(Step("sad", "ioi", 2.0, 0.3, "Sparse attention decomposition (IOI)"),),
            quick={"n_test": 16, "batch_size": 8, "null_draws": 4},
            headline="sad_heatmap",
        ),
        Method(
            "masks",
            "directional circuits: masks over the singular directions learned for a task (a MaskResult)",
            "masks",
            report=(
                Step("masks_ioi", "ioi", 14.0, 5.0, "Directional circuits: masks (IOI)"),
                Step("masks_gp", "gp", 12.0, 5.0, "Directional circuits: masks (gender pronoun)"),
                Step("masks_gt", "gt", 15.0, 5.0, "Directional circuits: masks (greater-than)"),
            ),
            # SmolLM2 keeps every direction after 24 steps (measured): 64 steps (docs/masks.md: 6.5 % kept)
            quick={
                "max_steps": 64,
                "soft_steps": 8,
                "n_train": 64,
                "n_val": 16,
                "n_test": 32,
                "batch_size": 8,
                "trajectory_every": 4,
            },
            headline="masks_kept_ov",
        ),
        Method(
            "directions",
            "the direction check of a finished mask run: kept directions patched against random ones (a"
            " DirectionCheckResult)",
            "masks",
            "{prefix}_{task}_directions.yaml",
            reads="run",
            report=(Step("directions_ioi", "ioi", 7.0, 1.0, "Direction check (IOI masks)", after="masks_ioi"),),
            quick={"n_random": 8, "max_claims": 256},  # a 64-step mask can keep most directions
            headline="directions_z",
        ),
        Method(
            "mounts",
            "tiled-SVD mounts of every linear site on WikiText (a MountsResult)",
            "mounts",
            "{prefix}_wikitext.yaml",
            task=None,
            report=(Step("mounts", None, 12.0, 2.0, "Tiled-SVD mounts"),),
            quick={"test_tokens": 1024, "batch_size": 4, "steer_texts": 2, "steer_mounts": 2, "modes_sweep": [1, 2, 4]},
            headline="mounts_lift_depth",
        ),
        Method(
            "circuits",
            "a circuit graph of singular directions, its strongest edges checked causally (a CircuitResult)",
            "circuits",
            report=(Step("circuits_ioi", "ioi", 10.0, 2.0, "Circuit graph (IOI)", optional=True),),
            aliases=("circuit",),
        ),
        Method(
            "edge_circuits",
            "edge circuits between directions: EAP-IG edge scores, MIB curves under the edge ablation against"
            " head-level edges and random, the graph of the attribution circuit (an EdgeCircuitResult; heavy: not"
            " in the report)",
            "edge_circuits",
            aliases=("edges",),
        ),
        Method(
            "faithfulness",
            "faithfulness curves (MIB's grid, CPR / CMD) of rankings of directions: attribution patching, a mask"
            " run, a circuit graph, random (a FaithfulnessResult; give mask_run / graph_run or methods)",
            "faithfulness",
        ),
    )
}

# the command-line tools (``lit_svd.cli_tools``): name -> one line
TOOLS: dict[str, str] = {
    "evaluate": "a model's clean and corrupted metrics on the test split of one or more tasks",
    "mask-curve": "several mask runs (e.g. one per alpha) as one sparsity / KL curve",
    "mask-blocks": "a finished mask run's kept directions annotated with blocks of near-equal singular values",
    "mask-thresholds": "a finished mask run's hard masks re-cut at several lambda thresholds (chosen on validation)",
    "compare-directions": "the top singular directions of one model followed into another of the same architecture",
    "mounts-merge": "mounts runs over disjoint layers of one model joined into one table",
}


def method_named(name: str) -> Method:
    """The method ``name`` (or an alias of one); an unknown name fails in one line naming the methods."""
    for m in METHODS.values():
        if name == m.name or name in m.aliases:
            return m
    raise ValueError(f"method={name!r}: no such method; allowed: {', '.join(METHODS)}")


def report_steps() -> tuple[Step, ...]:
    """Every report step (``method`` set), in the registry's order."""
    return tuple(replace(s, method=m.name) for m in METHODS.values() for s in m.report)


def experiments() -> list[str]:
    """One line per shipped config (configs/<method>/<name>.yaml): subcommand, path, its first comment sentence."""
    if not CONFIGS.is_dir():
        return []
    lines = []
    for method in sorted(p for p in CONFIGS.iterdir() if p.is_dir()):
        for cfg in sorted(method.glob("*.yaml")):
            text = cfg.read_text()
            about = next((ln.lstrip("# ").strip() for ln in text.splitlines() if ln.startswith("#")), "")
            about = re.split(r"\. | \(needs", about)[0].rstrip(".,")
            about = about if len(about) <= 72 else about[:69].rsplit(" ", 1)[0] + " ..."
            command = "fit " if "max_steps" in text else "test"
            lines.append(f"  {command} {cfg.relative_to(CONFIGS.parent)!s:<38} {about}")
    return lines
