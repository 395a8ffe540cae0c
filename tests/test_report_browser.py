"""report.html in a real browser. Headless Chromium (tests/chromium.py) opens the page of the shipped example
run (a real CPU search with its transcript) and of a synthetic run with both kinds of intervention, and
the test fails on any console error or uncaught exception; it checks that every section is there and
drawn, that the chart has one mark per evaluated candidate and per intervention, that every internal
link leads to an element and every file link to a file, that following a link into a folded LLM exchange
unfolds it, and it saves a screenshot of each page (printed; copied to $REPORT_SCREENSHOTS when set).
Skipped, with the reason, where no Chromium is installed."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from report import data as report_data
from report import html as report_html
from chromium import Chromium
from test_report_html import make_run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "conv_groupnorm_small"

pytestmark = pytest.mark.skipif(Chromium.find() is None, reason="no Chromium on this machine (Debian/Ubuntu: "
                                "apt-get install -y chromium; .ci/run installs it where apt is available)")

BROKEN_LINKS = """[...document.querySelectorAll('a[href^="#"]')]
  .map(a => a.getAttribute('href'))
  .filter(h => !document.getElementById(decodeURIComponent(h.slice(1))))"""
SECTIONS_DRAWN = """[...document.querySelectorAll('section')]
  .filter(s => s.getBoundingClientRect().height > 20 && s.querySelector('h2').offsetParent !== null)
  .map(s => s.id)"""
# Click the first link into a folded exchange; the page's script unfolds the target and its parents.
FOLLOW = """(async () => {
  const a = document.querySelector('a[href^="#x-"]');
  const target = document.getElementById(a.getAttribute('href').slice(1));
  const before = target.open;
  a.click();
  await new Promise(r => setTimeout(r, 200));
  let open = true;
  for (let t = target; t; t = t.parentElement) if (t.tagName === 'DETAILS' && !t.open) open = false;
  return {before: before, open: open, height: target.getBoundingClientRect().height,
          pre: target.querySelectorAll('pre').length};
})()"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """report.html of the example and of a synthetic run, opened in one Chromium; what the page says."""
    base = tmp_path_factory.mktemp("browser")
    example = base / "example"
    shutil.copytree(EXAMPLE, example)
    synthetic = make_run(base / "synthetic", generations=60)
    seen = {}
    with Chromium() as page:
        for run_dir in (example, synthetic):
            path = report_html.write(run_dir)
            page.errors.clear()
            page.open(path)
            seen[run_dir.name] = {
                "run": report_data.load(run_dir), "dir": run_dir,
                "sections": page.js(SECTIONS_DRAWN),
                "marks": page.js("document.querySelectorAll('svg.chart .mark').length"),
                "acts": page.js("document.querySelectorAll('svg.chart .act').length"),
                "chart_width": page.js("document.querySelector('svg.chart').getBoundingClientRect().width"),
                "broken": page.js(BROKEN_LINKS),
                "files": page.js("[...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))"
                                 ".filter(h => !h.startsWith('#'))"),
                "follow": page.js(FOLLOW),
                "screenshot": page.screenshot(base / f"{run_dir.name}.png"),
                "errors": list(page.errors),
            }
            print(f"screenshot of {run_dir.name}'s report.html: {seen[run_dir.name]['screenshot']}")
            if os.environ.get("REPORT_SCREENSHOTS"):
                Path(os.environ["REPORT_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
                shutil.copy(seen[run_dir.name]["screenshot"], os.environ["REPORT_SCREENSHOTS"])
    return seen


@pytest.mark.parametrize("name", ["example", "synthetic"])
def test_no_console_error(pages, name):
    assert pages[name]["errors"] == []


@pytest.mark.parametrize("name", ["example", "synthetic"])
def test_every_section_is_drawn(pages, name):
    # the example ran on a local server with one model: it has no other events and nothing to pay
    expected = [a for a, _, _ in report_html.SECTIONS if a not in ("other-events", "cost") or name == "synthetic"]
    assert pages[name]["sections"] == expected


@pytest.mark.parametrize("name", ["example", "synthetic"])
def test_the_chart_has_one_mark_per_evaluation_and_intervention(pages, name):
    run = pages[name]["run"]
    placed = [c for c in run.candidates.values() if c.generation is not None]
    assert len(placed) == len(run.candidates) > 5
    assert pages[name]["marks"] == len(placed)
    assert pages[name]["acts"] == len(run.actions) > 0
    assert pages[name]["chart_width"] > 500


@pytest.mark.parametrize("name", ["example", "synthetic"])
def test_links_resolve(pages, name):
    assert pages[name]["broken"] == []
    for href in pages[name]["files"]:
        assert (pages[name]["dir"] / href).is_file(), href


@pytest.mark.parametrize("name", ["example", "synthetic"])
def test_a_link_into_a_folded_exchange_unfolds_it(pages, name):
    follow = pages[name]["follow"]
    assert follow["before"] is False and follow["open"] is True
    assert follow["height"] > 50 and follow["pre"] == 2   # its prompt and its reply


def test_screenshots_are_saved(pages):
    for name in ("example", "synthetic"):
        shot = pages[name]["screenshot"]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
