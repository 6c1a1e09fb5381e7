"""Every registered result type reads well: a result of each type, read from a stored run (docs/results/,
bench/results_equivalence_reference.json, tests/data/results/ from tiny runs), prints in at most 15 lines (kind,
model, headline, table, folder), names its headline numbers as results.json holds them, draws its figures and
shows itself as HTML with those figures inline."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure

import lit_svd.figures  # noqa: F401  (registers every type's figures function)
from lit_svd import results as R
from lit_svd.results.base import FIGURES
from lit_svd.results.show import MAX_LINES, pick, result_html
from lit_svd.runs import load_run

ROOT = Path(__file__).resolve().parents[1]
STORED = [*sorted((ROOT / "docs" / "results").glob("*.json")), *sorted((ROOT / "tests/data/results").glob("*.json"))]


def stored_contents() -> dict[type, dict]:
    """One stored results.json content per result type (the first found)."""
    contents = [json.loads(p.read_text()) for p in STORED]
    contents += json.loads((ROOT / "bench" / "results_equivalence_reference.json").read_text()).values()
    out: dict[type, dict] = {}
    for content in contents:
        out.setdefault(R.result_type(content.get("experiment")), content)
    return out


CONTENTS = stored_contents()


def raw_value(cls: type[R.Result], content: dict, path: str):
    """A headline path read from the results.json content itself: the field's JSON key, then keys and indices."""
    keys = {f.name: cls.json_key(f) for f in cls.content_fields()}
    first, *rest = path.split("/")
    value = content[keys[first]]
    for part in rest:
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def test_every_registered_type_has_a_stored_run_a_drawer_and_the_short_repr():
    assert set(CONTENTS) == set(R.TYPES), "a result type without a stored run: tests/data/make_results.py"
    assert set(FIGURES) == set(R.TYPES)
    for cls in R.TYPES:  # a subclass decorated without repr=False would print its whole dataclass
        assert cls.__repr__ is R.Result.__repr__, f"{cls.__name__}: @dataclass(kw_only=True, repr=False)"


# a second stored run where a type's layout changed: the first found above reads through its conversion (faithfulness:
# one curve per method, before the two size axes), this one is today's layout (tests/data/make_results.py)
TODAYS = [(R.FaithfulnessResult, ROOT / "tests/data/results/faithfulness.json")]
CASES = [(cls, "stored") for cls in R.TYPES] + [(cls, str(path)) for cls, path in TODAYS]


@pytest.mark.parametrize(
    "cls, source", CASES, ids=[f"{c.__name__}-{Path(s).stem if s != 'stored' else s}" for c, s in CASES]
)
def test_repr_headline_figures_and_html(cls, source):
    content = CONTENTS[cls] if source == "stored" else json.loads(Path(source).read_text())
    assert R.result_type(content.get("experiment")) is cls
    result = R.load_result(content)
    text = repr(result)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES and len(text) < 2000
    assert lines[0].startswith(f"{cls.__name__} '{result.experiment_name()}'")
    model = content.get("model") or content.get("model_a")
    if model:
        assert str(model) in lines[0]
    headline = result.headline
    assert headline and all(isinstance(v, (int, float, str, type(None))) for v in headline.values())
    for key in cls.headline_keys:  # declared numbers are what results.json holds
        name, path = key.split("=", 1) if "=" in key else (key.rsplit("/", 1)[-1], key)
        if name in headline:
            assert headline[name] == raw_value(cls, content, path), name
    shown = [line.split()[0] for line in lines[1:] if line.startswith("  ") and not line.startswith("  ...")]
    assert shown == list(headline)[: len(shown)] and len(shown) >= min(len(headline), MAX_LINES - 5)
    assert f"table(): {len(result.rows())} row" in text

    figures = result.figures
    assert figures and all(isinstance(k, str) and isinstance(f, Figure) for k, f in figures.items())
    page = result._repr_html_()
    assert page.count("data:image/png;base64,") == len(figures) and "<table" in page
    assert all(f">{name}<" in page for name in headline)


def test_a_large_result_still_prints_in_a_few_lines():
    """The SmolLM2 SAD run with every head (270 rows, as the run writes it): the dataclass's own repr is the
    whole content; the short one does not grow with the rows."""
    content = dict(CONTENTS[R.SADResult])
    content["heads"] = [dict(h, head=i) for i in range(270) for h in content["heads"][:1]]
    result = R.load_result(content)
    whole = dataclasses.dataclass(kw_only=True)(type("Whole", (R.SADResult,), {}))  # the repr the types had
    assert len(repr(whole.from_dict(content)).splitlines()) == 1 and len(repr(whole.from_dict(content))) > 50_000
    assert len(repr(result).splitlines()) <= MAX_LINES and len(repr(result)) < 1000


def test_the_folder_is_where_the_result_was_read_or_saved(tmp_path):
    result = R.load_result(CONTENTS[R.MountsResult])
    assert result.folder is None and "folder: none" in repr(result)
    result.save(tmp_path / "run")
    assert result.folder == tmp_path / "run" and f"folder: {tmp_path / 'run'}" in repr(result)
    assert R.load_result(tmp_path / "run").folder == tmp_path / "run"
    assert R.load_result(tmp_path / "run" / "results.json").folder == tmp_path / "run"
    assert load_run(tmp_path / "run").result.folder == tmp_path / "run"
    assert result == R.load_result(tmp_path / "run")  # the folder is not part of the result's value


def test_a_headline_value_that_is_absent_or_none_is_left_out():
    result = R.load_result(CONTENTS[R.MountsResult])
    result.n_pass_null = None
    assert "n_pass_null" not in result.headline and result.headline["n_pass"] == result.n_pass
    assert "n_pass_null" not in repr(result)
    result.pass_table.pop("all", None)
    assert pick(result, ("x=pass_table/all", "n_pass")) == {"n_pass": result.n_pass}


def test_html_without_figures_is_the_numbers_and_the_table():
    result = R.load_result(CONTENTS[R.CircuitResult])
    page = result_html(result, head=3, figures=False)
    assert "data:image/png" not in page and page.count("<tr>") >= 3 + 1


def test_results_without_the_figures_package_show_and_say_where_figures_come_from(tmp_path):
    """The results layer never imports figures: a result read where ``lit_svd.figures`` is not imported shows itself
    (HTML without figures) and its ``figures`` name the package that registers them; ``ls.load`` imports it."""
    import subprocess
    import sys

    path = tmp_path / "results.json"  # a run folder's
    path.write_text((ROOT / "docs" / "results" / "smollm2_sad_ioi.json").read_text())
    code = (
        "import sys; from lit_svd import results as R; import lit_svd as ls\n"
        f"r = R.load_result({str(path)!r}); html = r._repr_html_()\n"
        "try:\n    r.figures\nexcept TypeError as e:\n    print(e)\n"
        "print('lit_svd.figures' in sys.modules, '<img' in html, sorted(ls.load(r.folder).figures))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == [
        "no figures for SADResult: import lit_svd.figures (it registers them)",
        "False False ['sad_heatmap', 'sad_n_recon']",
    ]
