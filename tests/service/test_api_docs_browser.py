"""The browsable API (/api/v1/docs) in a real headless browser: Debian's chromium, JavaScript on (Swagger
UI is a JavaScript page), every request it makes going to the service itself (no CDN)."""
from __future__ import annotations

import shutil

import pytest
from tests.helpers import missing_tool
from tests.helpers.service import OPERATIONS


pytestmark = [pytest.mark.parametrize("database_url", ["postgres"], indirect=True),  # anonymous read off
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]


@pytest.fixture
def browser(tmp_path):
    if not shutil.which("chromium"):
        missing_tool("chromium", "apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=shutil.which("chromium"), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            yield ctx
        finally:
            ctx.close()


def test_swagger_ui_renders_every_operation_from_the_service_alone(live_server, browser):
    page = browser.new_page()
    requested, refused = [], []
    page.on("request", lambda req: requested.append(req.url))
    page.on("console", lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.goto(live_server.url + "/api/v1/docs")
    page.wait_for_selector(".opblock", timeout=30_000)
    shown = {f"{b.locator('.opblock-summary-method').inner_text()} {b.locator('.opblock-summary-path').inner_text()}"
             for b in page.locator(".opblock").all()}
    assert shown == set(OPERATIONS), shown ^ set(OPERATIONS)
    assert page.locator(".btn.authorize").count() == 1  # bearer tokens can be entered
    outside = [u for u in requested if not u.startswith(live_server.url) and not u.startswith("data:")]
    assert not outside, outside
    assert refused == []  # it works under the service's CSP (no inline script or style: issue 26, row 4)
