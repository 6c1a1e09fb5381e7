"""Every example in examples/ runs (runpy, in this process) on a tiny model with its fast settings, so that the
tutorials cannot rot."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # whole (tiny) runs
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_method_has_an_example():
    assert {p.stem for p in EXAMPLES} >= {"toy", "sad", "masks", "directions", "mounts"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_on_a_tiny_model(path, tmp_path, monkeypatch, wikitext_valid):
    monkeypatch.setenv("LIT_SVD_EXAMPLE_MODEL", "tiny-llama")
    monkeypatch.setenv("LIT_SVD_EXAMPLE_OUT", str(tmp_path))
    monkeypatch.setenv("LIT_SVD_EXAMPLE_FAST", "1")
    monkeypatch.setenv("LIT_SVD_SHARED", str(Path(wikitext_valid).parents[2]))  # the mounts config's ../shared
    monkeypatch.chdir(tmp_path)  # a notebook's working folder is anywhere: configs and data are found anyway
    scope = runpy.run_path(str(path), run_name="__main__")
    assert list(tmp_path.rglob("results.json")), "the example wrote no run"
    results = [v for v in scope.values() if hasattr(v, "summary") and hasattr(v, "folder")]
    assert results and all((r.folder / "results.json").is_file() for r in results)
