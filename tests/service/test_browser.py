"""The HTML pages in a real headless browser: Debian's chromium, driven by Playwright (no JavaScript needed
by the pages; the browser only clicks and types as a person would).

One chromium per module; each test gets a fresh context (its own cookies). Anonymous read is off, as on
a PostgreSQL service: everything starts at the sign-in form.
"""
from __future__ import annotations

import re
import shutil

import pytest

from tests.helpers import key, missing_tool, publish, set_settings

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)


@pytest.fixture(scope="module")
def chromium():
    if not shutil.which("chromium"):
        missing_tool("chromium", "apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(chromium, app):
    """A fresh browser context (no cookies; JavaScript off: the pages must work without it)."""
    set_settings(app, ANONYMOUS_READ=False)
    ctx = chromium.new_context(java_script_enabled=False)
    try:
        yield ctx
    finally:
        ctx.close()


def sign_in(page, url: str, token: str) -> None:
    page.goto(url)
    assert page.locator("form#login").count() == 1, "a page asks a stranger to sign in"
    page.fill("input[name=token]", token)
    page.click("form#login button[type=submit]")


@pytest.mark.parametrize("database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_read_token_signs_in_browses_and_sees_no_admin_control(live_server, client, tokens, browser):
    publish(client, {"fxgraph/ab/graph1": b"graph-a", "ab/kernel_a.py": b"code-a"}, key(name="resnet"))
    publish(client, {"fxgraph/cd/graph2": b"graph-b", "cd/kernel_b.py": b"code-b" * 100},
            key(name="resnet", torch="2.12.0"))
    publish(client, {"x/other.py": b"other"}, key(name="bert"))
    page = browser.new_page()
    refused, styles = [], []
    page.on("console", lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.on("response", lambda resp: styles.append(resp.status) if resp.url.endswith(".css") else None)
    sign_in(page, live_server.url + "/", tokens["read"])
    page.wait_for_url(live_server.url + "/")
    assert page.locator("#me").inner_text() == "test-read"
    assert styles and set(styles) <= {200, 304} and refused == []  # the stylesheet loads under the CSP
    assert page.locator("tr.group h2").all_inner_texts() == ["bert", "resnet"]
    assert page.locator("tr.entry").count() == 3

    page.fill("input[name=torch]", "2.12.0")
    page.select_option("select[name=sort]", "largest")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/?*torch=2.12.0*")
    assert page.locator("tr.entry").count() == 1
    assert page.locator("#summary").inner_text().startswith("1 entry")

    page.click("tr.entry a")
    page.wait_for_url("**/entries/*")
    assert "resnet" in page.locator("h1").inner_text()
    files = page.locator("table.files tr.file td:nth-child(2)").all_inner_texts()
    assert sorted(files) == ["cd/kernel_b.py", "fxgraph/cd/graph2"]
    assert "600 B" in page.locator("table.files").inner_text()
    assert "cachesvc-client restore --url" in page.locator("pre.command").inner_text()
    assert page.locator("text=Purge").count() == 0 and page.locator("text=Audit log").count() == 0

    page.click("text=Stats")
    page.wait_for_url("**/stats")
    assert page.locator("svg.chart polyline.stored").count() == 1
    assert page.locator("#torch tr").count() == 3  # the header and two torch versions
    assert page.goto(live_server.url + "/admin/audit").status == 403
    assert "this needs admin" in page.locator("#message").inner_text()
    assert page.locator("#message code").all_inner_texts() == ["read", "admin"]

    page.goto(live_server.url + "/")
    page.click("#logout")
    page.wait_for_url("**/login")
    assert page.goto(live_server.url + "/").status == 401
    page.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_admin_purges_a_version_after_a_preview_and_finds_it_in_the_audit_log(live_server, client, tokens,
                                                                                  browser):
    k = key(name="resnet")
    publish(client, {"a.py": b"a" * 700, "shared.bin": b"s" * 300}, k)
    new = publish(client, {"b.py": b"b" * 500, "shared.bin": b"s" * 300}, k)["version"]
    page = browser.new_page()
    sign_in(page, f"{live_server.url}/entries/{new['entry_id']}", tokens["admin"])
    page.wait_for_url(f"**/entries/{new['entry_id']}")  # back to the page asked for

    page.click(f"text=Purge version {new['id']}")
    page.wait_for_url("**/admin/purge?version=*")
    preview = page.locator("#preview").inner_text()
    assert "A dry run" in preview and "1 version" in preview and "500 B" in preview
    page.click("form#confirm button")
    page.wait_for_url("**/admin/purge/done")
    assert "1 version purged" in page.locator("#outcome").inner_text()
    page.reload()  # post-redirect-get: a refresh re-sends nothing
    page.wait_for_url(live_server.url + "/")

    page.goto(f"{live_server.url}/entries/{new['entry_id']}")
    assert re.match(rf"{new['id']} purged", page.locator("#purged tr.purged td").first.inner_text())
    assert page.locator("section.version").count() == 1, "one committed version left"
    page.click("text=Audit log")
    page.wait_for_url("**/admin/audit")
    rows = page.locator("tr.record").all_inner_texts()
    assert any("purge" in r and f"version_id={new['id']}" in r and "token:test-admin" in r for r in rows)

    page.click("nav >> text=Tokens")
    page.fill("form#new-token input[name=name]", "fleet")
    page.click("form#new-token button")
    page.wait_for_url("**/admin/tokens")
    assert page.locator("#secret").inner_text().startswith("cs_")
    page.reload()  # the secret was shown once; a refresh makes no second token
    assert page.locator("#secret").count() == 0 and page.locator("tr.token", has_text="fleet").count() == 1
    page.click("tr.token:has-text('fleet') a.revoke")
    page.wait_for_url("**/revoke")
    page.click("form#confirm-revoke button")
    page.wait_for_url("**/admin/tokens")
    assert "fleet" in page.locator("tr.token.purged").inner_text()
    page.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_pages_fit_the_window_at_1280_and_800_pixels(live_server, client, tokens, chromium, app):
    """No page is wider than the window (document.scrollWidth), with long shapes, tags, paths and many
    columns; times read "just now" with the exact ISO time on hover. JavaScript is on here only to measure."""
    long_shape = "f32[" + ",".join(["1024"] * 12) + "]"
    for i in range(3):
        publish(client, {f"fxgraph/{'ab' * 40}/{i}/graph_{'x' * 60}.py": b"g" * (100 + i)},
                key(name=f"model-{i}", shape=long_shape, tags={"mode": "max-autotune-no-cudagraphs", "team": "z" * 40},
                    device="NVIDIA H200 NVL 141GB", cuda="cuda-12.8", arch="sm_90"))
    entry_id = publish(client, {"a.py": b"a"}, key(name="resnet"))["version"]["entry_id"]
    set_settings(app, ANONYMOUS_READ=False)
    ctx = chromium.new_context(java_script_enabled=True, viewport={"width": 1280, "height": 900})
    try:
        page = ctx.new_page()
        sign_in(page, live_server.url + "/", tokens["admin"])
        page.wait_for_url(live_server.url + "/")
        title = page.locator("tr.entry time").first.get_attribute("title")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", title) and \
            page.locator("tr.entry time").first.inner_text() == "just now"
        for width in (1280, 800):
            page.set_viewport_size({"width": width, "height": 900})
            for path in ("/", f"/entries/{entry_id}", "/stats", "/admin/tokens", "/admin/audit",
                         f"/admin/purge?entry={entry_id}"):
                page.goto(live_server.url + path)
                wide = page.evaluate("document.documentElement.scrollWidth")
                assert wide <= page.evaluate("window.innerWidth"), f"{path} is {wide} px wide in a {width} px window"
        page.close()
    finally:
        ctx.close()
