"""What the two faithfulness benches share (``faithfulness_bench.py``, ``faithfulness_diagnose.py``): the options
every one of them takes, the frozen model with its universe of directions and the patch, and the JSON they print."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def parser(doc: str) -> argparse.ArgumentParser:
    """The command line's parser (described by ``doc``'s first paragraph) with ``--model``, ``--task`` and ``--out``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="ioi")
    p.add_argument("--out", default=None, help="a folder: the printed JSON is also written there")
    return p


def frozen_universe(name: str):
    """``(model, view, components, universe, patch)``: ``name`` loaded with its weights frozen, one torch thread, every
    direction of the faithfulness universe (``analysis.faithfulness``) and the patch that ablates them."""
    import torch

    from lit_svd.analysis.faithfulness import Universe, universe_components
    from lit_svd.models import load_causal_lm
    from lit_svd.models import view as make_view
    from lit_svd.models.patching import CircuitPatch

    torch.set_num_threads(1)
    model, _ = load_causal_lm(name)
    for param in model.parameters():
        param.requires_grad_(False)
    view = make_view(model)
    comps = universe_components(view)
    return model, view, comps, Universe(comps), CircuitPatch(view, comps)


def finish(out: dict, folder: str | None, name: str) -> None:
    """Print ``out`` as JSON and, with ``--out``, write it as ``<folder>/<name>.json``."""
    print(json.dumps(out, indent=1))
    if folder:
        from lit_svd.output import write_json

        Path(folder).mkdir(parents=True, exist_ok=True)
        write_json(Path(folder) / f"{name}.json", out)
