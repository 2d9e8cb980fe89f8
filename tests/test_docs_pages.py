"""The reference pages stay true to their sources: docs/benchmarks.md is what bench/report.py makes from
bench/results/, every relative link of README.md and docs/ points at a file that exists, and no reference
page carries the run log (that is docs/journal.md's). Cheap: no torch, no server."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_benchmarks_page_is_what_the_report_makes_from_bench_results():
    made = report.render(json.loads((report.RESULTS / "benchmarks.json").read_text()), report.RESULTS)
    assert report.PAGE.read_text() == made, "docs/benchmarks.md is stale: run python bench/report.py"


def test_the_readmes_demo_figures_are_the_demos_output_it_shows():
    """Issue 37: the README said the demo moved 19 files after the demo had changed (its output is pasted in
    a block; the sentence under it is written by hand). The sentence names the block's figures."""
    page = (ROOT / "README.md").read_text()
    block = re.search(r"\n {6}restore: (\d+) files, ([\d.]+) MB written \(([\d.]+) MB transferred\)", page)
    said = re.search(r"The restore moved (\d+) files, ([\d.]+) MB on disk \(([\d.]+) MB transferred", page)
    assert block and said, "the README shows the demo's restore line and says what it moved"
    assert said.groups() == block.groups(), (said.groups(), block.groups())


def _section(page: str, title: str) -> str:
    start = page.index(f"\n## {title}")
    return page[start:page.index("\n## ", start + 1)]


@pytest.mark.parametrize("device,section", [("cuda", "1d."), ("cpu", "1c.")])
def test_a_model_table_file_dropped_into_results_is_a_row_of_its_section(tmp_path, device, section):
    """What bench/model_table.py --out writes, dropped into bench/results/ (one more GPU session's rows):
    the next rerun of the report shows it in the device's section, named by its file."""
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS, results)
    base = json.loads((report.RESULTS / "benchmarks-model-table-gpu.json").read_text())["rows"][0]
    row = dict(base, model="roberta-large-fp16", x_eager=0.777, x_compiled=0.555)
    (results / "model-table-new.json").write_text(json.dumps({"section": "model-table", "device": device,
                                                              "rows": [row]}))
    page = report.render(json.loads((results / "benchmarks.json").read_text()), results)
    line = next(ln for ln in page.splitlines() if "model-table-new.json" in ln)
    assert line.startswith("| RoBERTa-base (fp16) | default | the package |")
    assert "**0.78**" in line and "**0.56**" in line
    assert line in _section(page, section)
    assert page != report.PAGE.read_text()


def _relative_links(text: str):
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            yield target.split("#")[0]


def test_every_relative_link_of_the_readme_and_docs_points_at_a_file():
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in PAGES
              for target in _relative_links(page.read_text()) if not (page.parent / target).exists()]
    assert not broken


def test_no_reference_page_carries_run_numbers_or_issue_numbers():
    """Dated runs and the issues behind them are docs/journal.md's; the other pages say what holds."""
    cited = [f"{page.relative_to(ROOT)}: {m.group(0)}" for page in PAGES if page.name != "journal.md"
             for m in re.finditer(r"\b(?:[Ii]ssues? \d+|[Rr]uns? \d+\b|docs/gpu\.md,? runs?)", page.read_text())]
    assert not cited
