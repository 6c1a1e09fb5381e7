"""Thin reporters: a report callback turns the module's rows into the result and writes it; it never runs the
model. Shown twice: statically (no report callback's code touches the model, its view, its interventions or
an evaluation), and by running each report callback's write again after the run with the module's model and
view replaced by objects that fail when touched: it writes the same results.json."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import lit_svd.callbacks as callbacks

REPORTERS = {  # file -> report callback classes
    "masks.py": ["DirectionMaskReport"],
    "sad.py": ["SADReport"],
    "mounts.py": ["MountsReport"],
    "direction_report.py": ["DirectionReport"],
    "circuits.py": ["CircuitReport"],
    "faithfulness.py": ["FaithfulnessReport"],
}
MODEL_NAMES = {
    "lm",
    "view",
    "_view",
    "intervention",
    "answer_logits",
    "reference",
    "evaluate",
    "evaluate_batch",
    "batch_scores",
    "most_effective_ov_direction",
    "forward",
    "analyse_batch",
}


@pytest.mark.parametrize("file", sorted(REPORTERS))
def test_no_report_callback_touches_the_model(file):
    tree = ast.parse((Path(callbacks.__file__).parent / file).read_text())
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in REPORTERS[file]]
    assert [c.name for c in classes] == REPORTERS[file]
    for cls in classes:
        touched = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)} & MODEL_NAMES
        assert not touched, f"{cls.name} touches {sorted(touched)}"
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in modules if m and m.startswith(("lit_svd.models", "lit_svd.analysis.masks"))}, modules
    assert "torch" not in imported or file == "masks.py"  # masks.py: torch.save of masks.pt only


class Untouchable(torch.nn.Module):
    """Stands in for the model and its view after the run: any use fails the test."""

    def forward(self, *args, **kwargs):
        raise AssertionError("a report callback ran the model")

    def __getattr__(self, name):
        if name.startswith("_") or name in ("training",):
            return super().__getattr__(name)
        raise AssertionError(f"a report callback read the model's {name!r}")


def _untouchable(module) -> None:
    module.lm = Untouchable()
    module._view = Untouchable()


def _trainer(tmp_path, callback, **kw):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        default_root_dir=str(tmp_path),
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[callback],
        **kw,
    )


def _content(path: Path) -> dict:
    out = json.loads(path.read_text())
    out.pop("provenance")
    return out


def test_mask_report_writes_from_the_module_rows_alone(tiny_dirs, tmp_path):
    from lit_svd.callbacks import DirectionMaskReport
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import DirectionMaskModule

    module = DirectionMaskModule(model=tiny_dirs["llama"], lr=0.5, alpha=1e-4, init=0.6, threshold=0.3)
    dm = TaskDataModule("ioi", tiny_dirs["llama"], n_train=8, n_val=4, n_test=4, batch_size=4)
    report = DirectionMaskReport(trajectory_every=1)
    trainer = _trainer(tmp_path, report, max_steps=2, limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, dm)
    path = Path(trainer.log_dir) / "results.json"
    first = _content(path)
    assert len(first["trajectory"]) == 2 and set(first["splits"]) == {"val", "test"} and first["receptors"]
    _untouchable(module)
    path.unlink()
    report.on_fit_end(trainer, module)  # the write again, with the model gone
    assert _content(path) == first


def test_sad_and_mounts_reports_write_from_the_module_rows_alone(tiny_dirs, tmp_path):
    from lit_svd.callbacks.mounts import MountsReport
    from lit_svd.callbacks.sad import SADReport
    from lit_svd.datamodules.tasks import TaskDataModule
    from lit_svd.modules import MountsAnalysisModule, SADAnalysisModule

    sad, report = SADAnalysisModule(model=tiny_dirs["llama"], min_pairs=1), SADReport()
    trainer = _trainer(tmp_path / "sad", report)
    trainer.test(sad, TaskDataModule("ioi", tiny_dirs["llama"], n_train=0, n_val=0, n_test=4, batch_size=4))
    path = Path(trainer.log_dir) / "results.json"
    first = _content(path)
    assert first["heads"] and "basis" in first["heads"][0]
    _untouchable(sad)
    path.unlink()
    report.on_test_end(trainer, sad)
    assert _content(path) == first

    ids = torch.randint(0, 1000, (8, 16), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader([{"input_ids": x, "attention_mask": torch.ones_like(x)} for x in ids], 4)
    mounts = MountsAnalysisModule(
        model=tiny_dirs["llama"],
        tile_widths={"q": 16, "k": 16, "v": 16, "o": 32, "gate": 32, "up": 32, "down": 64},
        modes_sweep=[1, 2],
        steer_texts=2,
        steer_mounts=2,
        steer_tokens=8,
        effective_paths=False,
    )
    report = MountsReport()
    trainer = _trainer(tmp_path / "mounts", report)
    trainer.test(mounts, loader)
    path = Path(trainer.log_dir) / "results.json"
    first = _content(path)
    assert first["sites"] and (path.parent / "sites.csv").is_file()
    _untouchable(mounts)
    path.unlink()
    report.on_test_end(trainer, mounts)
    assert _content(path) == first
