"""The README stays short and the measured tables of the docs are the numbers of stored runs.

docs/results.md must be exactly what bench/make_results_md.py writes from docs/results/ (so it cannot drift
from the stored results.json files); the README has at most 150 lines and the lead's placeholders; every
docs page opens with a short summary (a first paragraph of 2-4 lines under its title).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bench_script import load_bench

ROOT = Path(__file__).resolve().parents[1]


def results_md():
    return load_bench("make_results_md")


def test_readme_is_read_in_five_minutes():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for placeholder in ("<!-- circuits -->", "<!-- scale -->"):
        assert placeholder in text


def test_results_page_is_generated_from_the_stored_runs():
    maker = results_md()
    assert sorted(maker.STORED.glob("*.json")), "no stored run"
    assert (ROOT / "docs" / "results.md").read_text() == maker.render(), "run python bench/make_results_md.py"


def test_every_stored_headline_is_on_the_page():
    """The page's numbers are read from the files: each stored SAD count appears as written in its summary."""
    page = (ROOT / "docs" / "results.md").read_text()
    for path in sorted((ROOT / "docs" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        assert f"[{path.stem}](results/{path.stem}.json)" in page
        if data.get("experiment") == "sad":
            s = data["summary"]
            assert f"{s['n_heads_sparser_than_null']}/{s['n_heads_eligible']} heads" in page


def test_the_strip_rule_cuts_long_lists_and_says_so():
    maker = results_md()
    cut: dict = {}
    data = {
        "summary": {"hist": list(range(70)), "per_layer": [{"l": i} for i in range(30)]},
        "heads": [{"i": i, "xs": list(range(3))} for i in range(300)],
        "instances": [{"values": list(range(100))}],
    }
    out = maker.strip(data, cut=cut)
    assert len(out["heads"]) == maker.MAX_ROWS and out["heads"][0] == data["heads"][0]
    assert len(out["instances"][0]["values"]) == maker.MAX_ITEMS
    assert out["summary"] == data["summary"]  # the headline figures are never cut
    assert cut == {"heads": 300, "instances[0].values": 100}


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_each_docs_page_opens_with_a_short_summary(page):
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ") and not lines[1].strip()
    end = next(i for i in range(2, len(lines)) if not lines[i].strip())
    assert 2 <= end - 2 <= 4, f"{page.name}: the opening paragraph has {end - 2} lines"
    assert not lines[2].startswith(("#", "```", "|", "-"))


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    anchors = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    """Links between the pages (``[text](guide.md#threads-runs-that-share-a-machine)``) name a file that exists and,
    with an anchor, one of its headings."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:, data:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
