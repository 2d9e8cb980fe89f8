"""The HTML pages in a real headless browser: Debian's chromium, driven by Playwright (no JavaScript needed
by the pages; the browser only clicks and types as a person would)."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import key, publish

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]


@pytest.fixture
def browser(tmp_path):
    if not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium: .ci/run installs it with apt-get", pytrace=False)
        pytest.skip("Debian's chromium is not installed here (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # a fresh profile (--user-data-dir) per test; JavaScript off: the pages must work without it
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, java_script_enabled=False,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            yield ctx
        finally:
            ctx.close()


def test_index_filter_entry_and_its_files_in_a_browser(live_server, client, browser):
    publish(client, {"fxgraph/ab/graph1": b"graph-a", "ab/kernel_a.py": b"code-a"}, key(name="resnet"))
    publish(client, {"fxgraph/cd/graph2": b"graph-b", "cd/kernel_b.py": b"code-b" * 100},
            key(name="resnet", torch="2.12.0"))
    publish(client, {"x/other.py": b"other"}, key(name="bert"))
    page = browser.new_page()
    page.goto(live_server.url + "/")
    assert page.locator("section.group h2").all_inner_texts() == ["bert", "resnet"]
    assert page.locator("tr.entry").count() == 3

    page.fill("input[name=torch]", "2.12.0")
    page.select_option("select[name=sort]", "largest")
    page.click("button[type=submit]")
    page.wait_for_url("**/?*torch=2.12.0*")
    assert page.locator("tr.entry").count() == 1
    assert page.locator("#summary").inner_text().startswith("1 entry")

    page.click("tr.entry a")
    page.wait_for_url("**/entries/*")
    assert "resnet" in page.locator("h1").inner_text()
    files = page.locator("table.files tr.file td:nth-child(2)").all_inner_texts()
    assert sorted(files) == ["cd/kernel_b.py", "fxgraph/cd/graph2"]
    assert "600 B" in page.locator("table.files").inner_text()

    page.click("text=Stats")
    page.wait_for_url("**/stats")
    assert page.locator("svg.chart polyline.stored").count() == 1
    assert page.locator("#totals").inner_text().count("3") >= 1
    page.close()
