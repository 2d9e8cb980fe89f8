"""Issue 27 items 8, 9 (the pages; Flask's test client; the window widths are test_browser.py's): the sort
orders what is shown, one table with one set of columns, a stylesheet of the pages' own (a static file,
no inline style), relative times with the exact time on hover, paginated file lists, the Swagger UI."""
from __future__ import annotations

import datetime as dt
import re

import pytest

from cachesvc.browse import filters
from tests.helpers import key, publish, set_settings

LOCAL = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
SQLITE = lambda f: LOCAL(pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)(f))  # noqa: E731


@SQLITE
def test_sort_largest_orders_the_rows_shown_not_the_names(client):
    for name, size in (("alpha", 10), ("beta", 5000), ("alpha", 3000), ("gamma", 100)):
        publish(client, {"m.py": name.encode() * size}, key(name=name, shape=f"f32[{size}]"))
    html = client.get("/", query_string={"sort": "largest"}).get_data(as_text=True)
    shapes = re.findall(r'<tr class="entry">\s*<td><a href="[^"]+"><code>([^<]+)</code>', html)
    assert shapes == ["f32[5000]", "f32[3000]", "f32[100]", "f32[10]"], "biggest first, whatever the name"
    assert re.findall(r"<h2>([^<]+)</h2>", html) == ["beta", "alpha", "gamma", "alpha"]
    assert html.count("<table") == 1 and html.count("<thead>") == 1, "one table: the same columns for every name"


@SQLITE
def test_pages_use_their_own_stylesheet_and_link_the_swagger_ui(client):
    html = client.get("/").get_data(as_text=True)
    assert "<style" not in html and " style=" not in html and "<script" not in html
    (href,) = re.findall(r'<link rel="stylesheet" href="([^"]+)">', html)
    assert href == "/assets/cachesvc.css"
    with client.get(href) as css:
        assert css.status_code == 200 and css.mimetype == "text/css" and b"overflow-wrap" in css.data
    set_settings(client.application, ANONYMOUS_READ=False)
    with client.application.test_client().get(href) as anonymous:
        assert anonymous.status_code == 200, "the sign-in page needs it too"
    assert re.search(r'<a href="/api/v1/docs" id="api-docs">API</a>', html)
    assert client.get("/api/v1/docs").status_code == 200


def test_relative_times_carry_the_exact_time_on_hover():
    now = dt.datetime(2026, 12, 2, 12, 0, 0, tzinfo=dt.timezone.utc)
    html = str(filters.ago("2026-12-02T09:00:00Z", now=now))
    assert html == '<time datetime="2026-12-02T09:00:00Z" title="2026-12-02T09:00:00Z">3 h ago</time>'
    assert "1 day ago" in filters.ago("2026-12-01T12:00:00", now=now)
    assert "12 days ago" in filters.ago("2026-11-20T12:00:00Z", now=now)
    assert "5 min ago" in filters.ago("2026-12-02T11:55:00Z", now=now)
    assert "just now" in filters.ago("2026-12-02T11:59:50Z", now=now)
    assert str(filters.ago(None)) == '<span class="muted">never</span>'
    assert "&lt;b&gt;" in str(filters.ago("<b>", now=now)), "not a time: shown as it is, escaped"


@SQLITE
def test_the_index_and_entry_pages_show_relative_times(client):
    done = publish(client, {"a.py": b"a"}, key(name="resnet"))["version"]
    for path in ("/", f"/entries/{done['entry_id']}"):
        html = client.get(path).get_data(as_text=True)
        stamps = re.findall(r'<time datetime="([^"]+)" title="\1">([^<]+)</time>', html)
        assert stamps and all(text == "just now" for _, text in stamps), (path, stamps)


@SQLITE
def test_an_entry_with_many_files_pages_through_them(client):
    files = {f"k/{i:04d}.py": str(i).encode() for i in range(230)}
    entry_id = publish(client, files, key(name="big"))["version"]["entry_id"]
    listed = []
    offset = 0
    while True:
        html = client.get(f"/entries/{entry_id}", query_string={"files_offset": offset}).get_data(as_text=True)
        page = re.findall(r'<tr class="file"><td>[^<]*</td><td><code>([^<]+)</code>', html)
        assert len(page) <= 100
        listed += page
        nxt = re.search(r'<a rel="next" href="[^"]*files_offset=(\d+)"', html)
        if not nxt:
            break
        offset = int(nxt.group(1))
    assert sorted(listed) == sorted(files) and len(listed) == 230
    assert client.get(f"/entries/{entry_id}", query_string={"files_offset": "x"}).status_code == 400
