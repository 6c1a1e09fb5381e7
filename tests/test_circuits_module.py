"""``CircuitGraphModule`` (``modules/circuits.py``) on a tiny float64 Llama with a word-level tokenizer.

* one process: the module's merged graph and check rows equal the analysis functions called directly over the
  same test batches (``build_graph``, ``check_context`` / ``check_batch`` / ``judge_edge``), 1e-9 relative;
* two CPU processes (DDP, gloo) give the graph and the checks of one (gathered sums): the same edges, kept and
  expanded counts and pass verdicts, weights to 1e-7 relative (HF's eager softmax rounds to float32 and the ranks
  pad their batches to other lengths);
* bad options fail at construction in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from lit_svd.addresses import Address
from lit_svd.analysis.agreement import agreement_rows
from lit_svd.analysis.circuit_graph import METRIC, GraphOptions, build_graph
from lit_svd.analysis.edge_check import Edge, check_batch, check_context, judge_edge
from lit_svd.analysis.sad import (
    attention_inputs,
    attention_probs,
    causal_visibility,
    contributions_at,
    qk_heads_from_view,
    relative,
    scores,
    select_pairs,
)
from lit_svd.datamodules.tasks import TaskDataModule
from lit_svd.linalg import svd_factored
from lit_svd.modules.circuits import CircuitGraphModule, checkable
from tests.helpers import exact_rms_norms
from tests.test_sad_module import tiny_lm_dir  # noqa: F401  (the session fixture: tiny Llama + word tokenizer)

ROOT = Path(__file__).resolve().parents[1]
DATA = dict(task="ioi", n_train=0, n_val=0, n_test=10, batch_size=2, seed=0)
OPTIONS = dict(threshold=0.05, depth=2, n_check=4, n_random=8, dtype="float64")


def run_one(model_dir, tmp_path):
    module = CircuitGraphModule(model=model_dir, **OPTIONS)
    dm = TaskDataModule(tokenizer=model_dir, **DATA)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, default_root_dir=tmp_path
    )
    with exact_rms_norms(module.lm):  # RMSNorms in float64 too (HF's compute in float32 whatever the dtype)
        trainer.test(module, datamodule=dm)
    return module, dm


def same_edges(a, b, rel=1e-9):
    key = lambda e: (e["writer"], e["reader"], e["reader_kind"])  # noqa: E731
    A, B = {key(e): e for e in a}, {key(e): e for e in b}
    assert A.keys() == B.keys()
    scale = max(abs(e["weight"]) for e in a)
    for k in A:
        assert A[k]["kept_in"] == B[k]["kept_in"] and A[k]["expanded_in"] == B[k]["expanded_in"], k
        assert abs(A[k]["weight"] - B[k]["weight"]) <= rel * scale, (A[k], B[k])
        assert abs(A[k]["abs_weight"] - B[k]["abs_weight"]) <= rel * scale, (A[k], B[k])


def same_checks(a, b, rel=1e-9):
    assert [(r["writer"], r["reader"], r["reader_kind"]) for r in a] == [
        (r["writer"], r["reader"], r["reader_kind"]) for r in b
    ]
    for x, y in zip(a, b):
        for k in ("effect", "null_mean", "gap", "gap_fraction"):
            assert x[k] == pytest.approx(y[k], rel=rel, abs=1e-9), (k, x, y)
        assert x["prompts"] == y["prompts"] and x["passes"] == y["passes"] and x["passes_z"] == y["passes_z"]


def test_module_equals_the_analysis_functions(tiny_lm_dir, tmp_path):  # noqa: F811
    module, dm = run_one(tiny_lm_dir, tmp_path)
    batches = list(dm.test_dataloader())
    with exact_rms_norms(module.lm):
        G, sums, per = build_graph(module.dec, "ioi", batches, GraphOptions(threshold=0.05, depth=2))
        ctxs = [check_context(module.dec, batch, "ioi") for batch in batches]
    same_edges(module.edge_rows(), sums.edges())
    assert module.graph.number_of_edges() == G.number_of_edges() > 10
    edges = [Edge.of(e) for e in sums.edges() if checkable(e)][:4]
    totals = {}
    with exact_rms_norms(module.lm):
        for ctx, graphs in zip(ctxs, per):
            for e, t in check_batch(module.dec, ctx, graphs, edges, "ioi", 8).items():
                totals[e] = totals[e].add(t) if e in totals else t
    same_checks(module.checks, [judge_edge(e, totals[e]) for e in edges if e in totals])
    assert len(module.checks) == 4
    rows = module.graph_rows()
    assert rows["facts"]["n_prompts"] == 10 and rows["facts"]["options"]["min_gap_fraction"] == 0.01
    assert rows["facts"]["metric"]["gap"] == pytest.approx(
        rows["facts"]["metric"]["clean"] - rows["facts"]["metric"]["corrupted"]
    )
    assert {n["node"] for n in rows["nodes"]} == set(module.graph.nodes)
    assert module.graph.graph["task"] == "ioi"
    check_sad_terms(module, batches)


def check_sad_terms(module, batches):
    """The module's per-head mean |c_k| equals a recount from SAD's full term tensor (``contributions_at``) on
    inputs taken by a separate hooked forward (``attention_inputs``), pairs chosen by ``select_pairs``: 1e-7 (the
    two forwards differ at float32 rounding after the first layer: HF's eager softmax computes in float32)."""
    view = module.view
    sums, counts = {}, {}
    with exact_rms_norms(module.lm):
        for batch in batches:
            ids, mask = batch["clean_ids"], batch["attention_mask"]
            xs = attention_inputs(view, ids, mask, list(range(view.n_layers)))
            for layer, x in xs.items():
                qk = qk_heads_from_view(view, layer).to(torch.float64)
                U = svd_factored(qk.A_q, qk.A_k).U
                visible = causal_visibility(mask, view.window(layer))
                l = scores(x, x, qk)
                rel = relative(l, visible)
                pairs = select_pairs(attention_probs(l, visible, qk.softcap), rel, visible)
                c = contributions_at(x, x, visible, qk, U, pairs).abs()
                head = pairs.nonzero()[:, 1]
                for h in range(view.n_heads):
                    sums[layer, h] = sums.get((layer, h), 0) + c[head == h].sum(0)
                    counts[layer, h] = counts.get((layer, h), 0) + int((head == h).sum())
    expected = {k: (sums[k] / counts[k]).tolist() for k in sums if counts[k]}
    assert module.sad_terms.keys() == expected.keys() and len(expected) >= view.n_layers
    for k, v in expected.items():
        assert module.sad_terms[k] == pytest.approx(v, rel=1e-7, abs=1e-12), k
    # the report's agreement row compares the graph's QK nodes with each graph head's top terms
    nodes = [Address.parse(n) for n in module.graph.nodes if n != METRIC]
    (row,) = agreement_rows("ioi", nodes, sad_terms=module.sad_terms)
    assert row["source"] == "sad" and row["n_source"] == 4 * row["units"] // len(next(iter(expected.values())))


def test_ddp_two_processes_equal_one(tiny_lm_dir, tmp_path):  # noqa: F811
    module, _ = run_one(tiny_lm_dir, tmp_path / "one")
    out = tmp_path / "two.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests/ddp_circuits_script.py"), str(out), tiny_lm_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads(out.read_text())
    # 1e-7: HF's eager softmax computes in float32 whatever the dtype, and the ranks pad other batches
    same_edges(module.edge_rows(), two["edges"], rel=1e-7)
    same_checks(module.checks, two["checks"], rel=1e-5)  # the gap: a difference of near-equal metrics here
    assert two["facts"]["n_prompts"] == 10
    assert two["facts"]["metric"]["gap"] == pytest.approx(module.facts["metric"]["gap"], abs=1e-8)


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"threshold": 1.5}, "threshold"),
        ({"depth": 0}, "depth"),
        ({"readers": ["mlp"]}, "readers"),
        ({"unit": "head"}, "n_check"),
        ({"n_random": 1}, "n_random"),
        ({"n_check": -1}, "n_check"),
    ],
)
def test_bad_options_fail_at_construction(tiny_lm_dir, kw, key):  # noqa: F811
    with pytest.raises(ValueError) as err:
        CircuitGraphModule(model=tiny_lm_dir, **{**OPTIONS, **kw})
    assert key in str(err.value) and "\n" not in str(err.value)
