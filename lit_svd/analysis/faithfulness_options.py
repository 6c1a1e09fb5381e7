"""The faithfulness module's options, their allowed values and their one check, without torch: ``FaithfulnessModule``'s
constructor and the command line's fast check (``config_check``, before torch is imported) run the same
``check_faithfulness_options``; the rankings (``Method``: the one list of their names), MIB's grid of sizes and the
EAP-IG paths are named here for the analysis and the module to read."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from lit_svd.choices import check_choice, choices
from lit_svd.option_checks import check_indices, is_int

Method = Literal[
    "eap_ig",
    "eap",
    "eap_ig_fair",
    "eap_fair",
    "eap_ig_units",
    "eap_ig_mixed",
    "eap_ig_hybrid",
    "eap_ig_hybrid_heads",
    "eap_ig_heads",
    "eap_heads",
    "mask",
    "graph",
    "graph_mlp",
    "random",
]
AttributionSplit = Literal["train", "val"]
IGPath = Literal["joint", "layer", "inputs"]
MIB_SIZES: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
GRAPH_RANKINGS = {"graph": False, "graph_mlp": True}  # method name -> graph_ranking's mlp_inputs


def check_sizes(sizes: Sequence[float]) -> list[float]:
    """Sizes as floats, strictly increasing, in (0, 1]; one-line error otherwise."""
    out = [float(s) for s in sizes]
    if not out or any(not 0 < s <= 1 for s in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"sizes={list(sizes)!r}: give fractions in (0, 1], strictly increasing (MIB: {MIB_SIZES})")
    return out


def check_methods(methods: Sequence[str], mask_run: str | None, graph_run: str | None, seeds: Sequence[int]) -> None:
    """Known methods, each with what it needs; one-line errors naming the key."""
    allowed = choices(Method)
    if not methods:
        raise ValueError(f"methods=[]: give at least one of {', '.join(allowed)}")
    for m in methods:
        if m not in allowed:
            raise ValueError(f"methods: {m!r} unknown; allowed: {', '.join(allowed)}")
    if "mask" in methods and mask_run is None:
        raise ValueError("methods has 'mask' but mask_run is null; give the folder of a finished direction-mask run")
    for m in GRAPH_RANKINGS:
        if m in methods and graph_run is None:
            raise ValueError(
                f"methods has {m!r} but graph_run is null; give the folder of a finished circuit-graph run"
            )
    if "random" in methods and not seeds:
        raise ValueError("methods has 'random' but random_seeds is empty; give seeds, e.g. [0, 1, 2]")


def check_faithfulness_options(
    mask_run: str | None = None,
    graph_run: str | None = None,
    methods: Sequence[str] | str = ("eap_ig", "eap", "eap_ig_heads", "eap_heads", "random"),
    random_seeds: Sequence[int] = (0, 1, 2),
    sizes: Sequence[float] = MIB_SIZES,
    layers: Sequence[int] | None = None,
    attribution_split: str = "train",
    attribution_prompts: int = 64,
    ig_steps: int = 5,
    ig_path: str = "joint",
    n_layers: int | None = None,
) -> tuple[list[str], list[float]]:
    """Every option of ``FaithfulnessModule`` that can be judged before the model loads, one line naming the key
    otherwise (``n_layers``: the model's, when known, bounds ``layers``; the model's name, given or read from a
    run, is the constructor's); returns the methods as a list and the sizes
    as floats."""
    methods = [methods] if isinstance(methods, str) else list(methods)
    check_methods(methods, mask_run, graph_run, random_seeds)
    out_sizes = check_sizes(sizes)
    check_choice("attribution_split", attribution_split, AttributionSplit)
    check_choice("ig_path", ig_path, IGPath)
    if not is_int(attribution_prompts) or attribution_prompts < 1:
        raise ValueError(f"attribution_prompts={attribution_prompts}: give at least 1")
    if not is_int(ig_steps) or ig_steps < 1:
        raise ValueError(f"ig_steps={ig_steps}: give at least 1 (1 is plain EAP)")
    check_indices("layers", "layer", layers or (), n_layers)
    for key, run, what in (("mask_run", mask_run, "direction-mask"), ("graph_run", graph_run, "circuit-graph")):
        if run is not None and not Path(run).is_dir():
            raise ValueError(f"{key}={str(run)!r}: not a folder; give the folder of a finished {what} run")
    return methods, out_sizes
