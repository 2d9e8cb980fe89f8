"""Browse: entry filters, sorts and pages; entry detail; stats; the HTML pages (on both databases)."""
from __future__ import annotations

import datetime as dt
import html as html_lib
import json
import re

import pytest
from sqlalchemy import update

from cachesvc.models import Entry, Version
from cachesvc_client.shared import keys
from harness.containers import inherited_env
from tests.helpers import key, publish, publish_body, resolve_params, sha

pytestmark = [pytest.mark.backends("database"),  # filters, sorts, pages: SQL each database runs its own way
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]

FIELDS = ("name", "shape", "torch", "triton", "cuda", "python", "device", "arch")


def field_of(row: dict, field: str) -> str:
    return row[field] if field in ("name", "shape") else row["env"][field]


@pytest.fixture
def catalog(client):
    """Six entries: two names; differing shape, tags and one env field each. Returns {label: key}."""
    keys = {
        "base": key(),
        "shape": key(shape="f32[16,256]"),
        "tags": key(tags={"mode": "max-autotune", "team": "a_b"}),
        "torch": key(torch="2.12.0"),
        "device": key(device="NVIDIA H200", cuda="cuda-12.8", arch="sm_90", triton="3.6.0"),
        "bert": key(name="bert", python="3.12"),
    }
    for i, (label, k) in enumerate(keys.items()):
        publish(client, {"model.py": label.encode() * (i + 1)}, k)
    return keys


@pytest.mark.parametrize("field", FIELDS)
def test_every_key_field_filters(client, catalog, field):
    every = client.get("/api/v1/entries").json["entries"]
    values = {field_of(r, field) for r in every}
    assert len(values) >= 2, f"the catalog must vary {field}"
    for value in values:
        rows = client.get("/api/v1/entries", query_string={field: value}).json
        assert rows["total"] == sum(field_of(r, field) == value for r in every) == len(rows["entries"])
        assert all(field_of(r, field) == value for r in rows["entries"])
    assert client.get("/api/v1/entries", query_string={field: "no-such-value"}).json["total"] == 0


def test_tag_filters_exact_json_and_included_pairs(client, catalog):
    exact = client.get("/api/v1/entries", query_string={"tags": json.dumps({"team": "a_b", "mode": "max-autotune"})})
    assert [r["tags"] for r in exact.json["entries"]] == [{"mode": "max-autotune", "team": "a_b"}]
    one = client.get("/api/v1/entries", query_string={"tag": "team=a_b"}).json
    assert one["total"] == 1
    both = client.get("/api/v1/entries", query_string=[("tag", "team=a_b"), ("tag", "mode=max-autotune")]).json
    assert both["total"] == 1
    # LIKE wildcards in the value are literal: "a%b" and "a_b" are different values
    assert client.get("/api/v1/entries", query_string={"tag": "team=a%b"}).json["total"] == 0
    assert client.get("/api/v1/entries", query_string={"tag": "team=a"}).json["total"] == 0
    assert client.get("/api/v1/entries", query_string={"tag": "mode"}).status_code == 422
    combined = client.get("/api/v1/entries", query_string={"tag": "team=a_b", "torch": "2.12.0"}).json
    assert combined["total"] == 0


def _set(app, model, ident, **values):
    with app.extensions["cachesvc"].db.session() as s:
        s.execute(update(model).where(model.id == ident).values(**values))


def test_sorts(client, app, catalog):
    rows = client.get("/api/v1/entries").json["entries"]
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids, reverse=True), "newest (last published) first by default"
    bert = next(r for r in rows if r["name"] == "bert")
    publish(client, {"model.py": b"republished"}, catalog["base"])  # base becomes the newest published
    base = next(r for r in rows if r["shape"] == "f32[8,256]" and r["env"]["torch"] == "2.13.0+cpu"
                and r["name"] == "mlp" and r["tags"] == {} and r["env"]["device"] == "x86_64")
    assert client.get("/api/v1/entries", query_string={"sort": "newest"}).json["entries"][0]["id"] == base["id"]

    largest = client.get("/api/v1/entries", query_string={"sort": "largest"}).json["entries"]
    sizes = [r["size"] for r in largest]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == len(b"device") * 5

    now = dt.datetime(2026, 1, 10)
    _set(app, Entry, base["id"], restore_count=7, last_restored_at=now - dt.timedelta(days=3))
    _set(app, Entry, bert["id"], restore_count=2, last_restored_at=now)
    most = client.get("/api/v1/entries", query_string={"sort": "most_restored"}).json["entries"]
    assert [r["id"] for r in most[:2]] == [base["id"], bert["id"]]
    assert [r["restore_count"] for r in most] == sorted((r["restore_count"] for r in most), reverse=True)
    last = client.get("/api/v1/entries", query_string={"sort": "last_restored"}).json["entries"]
    assert [r["id"] for r in last[:2]] == [bert["id"], base["id"]], "most recent first, never restored last"
    assert all(r["last_restored_at"] is None for r in last[2:])
    assert client.get("/api/v1/entries", query_string={"sort": "oldest"}).status_code == 422


@pytest.mark.parametrize("limit", [1, 2, 5, 6, 7])
def test_pages_cover_every_entry_once(client, catalog, limit):
    seen, offset, pages = [], 0, 0
    while offset is not None:
        page = client.get("/api/v1/entries", query_string={"limit": limit, "offset": offset}).json
        assert page["total"] == 6 and len(page["entries"]) == min(limit, 6 - offset)
        seen += [r["id"] for r in page["entries"]]
        offset, pages = page["next_offset"], pages + 1
    assert len(seen) == len(set(seen)) == 6
    assert pages == -(-6 // limit)
    past = client.get("/api/v1/entries", query_string={"limit": limit, "offset": 6}).json
    assert past["entries"] == [] and past["next_offset"] is None
    assert client.get("/api/v1/entries", query_string={"limit": 0}).status_code == 422
    assert client.get("/api/v1/entries", query_string={"limit": 1001}).status_code == 422
    assert client.get("/api/v1/entries", query_string={"offset": -1}).status_code == 422


def test_rows_carry_size_versions_created_last_restored_and_restores(client):
    k = key()
    publish(client, {"a": b"12345"}, k)
    publish(client, {"a": b"1234567"}, k)
    client.get("/api/v1/resolve", query_string=resolve_params(k))
    row = client.get("/api/v1/entries").json["entries"][0]
    assert row["size"] == 7 and row["versions"] == 2 and row["versions_bytes"] == 12
    assert row["restore_count"] == 1 and row["last_restored_at"] and row["created_at"]


def test_rows_follow_the_newest_committed_version_and_skip_entries_without_one(client, app):
    older = publish(client, {"a": b"123"}, key())["version"]["id"]
    newer = publish(client, {"a": b"12345"}, key())["version"]["id"]
    gone = publish(client, {"a": b"1"}, key(name="bert"))["version"]["id"]
    publish(client, {"a": b"1"}, key(name="gpt"))
    _set(app, Version, newer, state="purged")
    _set(app, Version, gone, state="purged")
    page = client.get("/api/v1/entries").json
    assert page["total"] == 2 and [r["name"] for r in page["entries"]] == ["gpt", "mlp"]
    mlp = page["entries"][1]
    assert (mlp["newest_version_id"], mlp["size"], mlp["versions"], mlp["versions_bytes"]) == (older, 3, 1, 3)
    by_name = client.get("/api/v1/entries", query_string={"name": "mlp", "sort": "largest"}).json
    assert by_name["total"] == 1 and by_name["entries"][0]["newest_version_id"] == older
    assert client.get("/api/v1/entries", query_string={"name": "bert"}).json == {
        "total": 0, "limit": 50, "offset": 0, "sort": "newest", "next_offset": None, "entries": []}


def test_entry_detail_lists_files_with_hashes_and_shared_blobs(client):
    common, only_old, only_new = b"shared" * 100, b"old", b"new!"
    k = key()
    first = publish(client, {"common.bin": common, "x.py": only_old}, k)
    second = publish(client, {"common.bin": common, "x.py": only_new, "copy.bin": common}, k)
    entry_id = second["version"]["entry_id"]
    detail = client.get(f"/api/v1/entries/{entry_id}").json
    assert [v["id"] for v in detail["versions"]] == [second["version"]["id"], first["version"]["id"]]
    newest = detail["versions"][0]
    assert {(f["path"], f["size"], f["sha256"]) for f in newest["files"]} == {
        ("common.bin", 600, sha(common)), ("x.py", 4, sha(only_new)), ("copy.bin", 600, sha(common))}
    assert {f["path"]: f["shared"] for f in newest["files"]} == {"common.bin": True, "copy.bin": True, "x.py": False}
    assert newest["blob_count"] == 2 and newest["stored_bytes"] == 604
    assert newest["shared_with"] == {str(first["version"]["id"]): 1}
    assert detail["shared_blobs"] == [{"versions": [second["version"]["id"], first["version"]["id"]],
                                       "blobs": 1, "stored_bytes": 600}]


def test_stats_count_dedup_restores_misses_verdicts_and_compile_seconds_saved(client):
    k = key()
    body = publish_body({"a": b"x" * 1000, "b": b"x" * 1000}, k, compile_seconds=12.5)
    answer = client.post("/api/v1/versions", json=body).json
    client.put(answer["upload"][0]["targets"]["identity"]["url"], data=b"x" * 1000)
    vid = answer["version"]["id"]
    assert client.post(f"/api/v1/versions/{vid}/commit", json={}).status_code == 200
    for _ in range(3):
        assert client.get("/api/v1/resolve", query_string=resolve_params(k)).json["hit"]
    client.get("/api/v1/resolve", query_string=resolve_params(key(name="unknown")))
    s = client.get("/api/v1/stats", query_string={"days": 3}).json
    assert (s["entries"], s["versions"], s["blobs"], s["publishes"]) == (1, 1, 1, 1)
    assert (s["logical_bytes"], s["stored_bytes"], s["dedup_ratio"]) == (2000, 1000, 2.0)
    assert (s["restores"], s["misses"], s["restore_rate"]) == (3, 1, 0.75)
    assert (s["hits"], s["hit_rate"], s["compile_seconds_saved"]) == (0, None, 0.0), "no process said it hit"
    # what the restored processes saw: a first call of 2.5 s against a 12.5 s cold compile saved 10 s;
    # a hit without its first call and a process that compiled anyway save nothing countable
    for verdict, first_call in (("paid_off", 2.5), ("partial", None), ("no_hits", 12.4)):
        sent = {"versions": [vid], "verdict": verdict, "fallback": ""}
        if first_call is not None:
            sent["first_call_seconds"] = first_call
        assert client.post("/api/v1/verdicts", json=sent).status_code == 200
    s = client.get("/api/v1/stats", query_string={"days": 3}).json
    assert s["verdicts"] == {"paid_off": 1, "partial": 1, "no_hits": 1}
    assert (s["hits"], s["hit_rate"], s["compile_seconds_saved"]) == (2, 0.667, 10.0)
    assert len(s["daily"]) == 3
    today = s["daily"][-1]
    assert (today["restores"], today["misses"], today["hits"], today["publishes"], today["stored_bytes"]) == (
        3, 1, 2, 1, 1000)


# ------------------------------------------------------------------------ HTML pages


def test_index_page_groups_by_name_and_filters_without_javascript(client, catalog):
    page = client.get("/")
    html = page.get_data(as_text=True)
    assert "<script" not in html
    assert "Set-Cookie" not in page.headers, "a bearer token's request starts no session"
    assert re.findall(r"<h2>([^<]+)</h2>", html) == ["bert", "mlp"], "newest first: bert, then the five mlp"
    assert html.count('<tr class="entry">') == 6
    filtered = client.get("/", query_string={"torch": "2.12.0"}).get_data(as_text=True)
    assert filtered.count('<tr class="entry">') == 1 and "2.12.0" in filtered
    tagged = client.get("/", query_string={"tag": "mode=max-autotune", "sort": "largest"}).get_data(as_text=True)
    assert tagged.count('<tr class="entry">') == 1 and "mode=max-autotune" in tagged
    assert client.get("/", query_string={"sort": "nope"}).status_code == 400


def test_entry_page_shows_versions_and_files(client):
    done = publish(client, {"fxgraph/ab/graph1": b"graph", "ab/c<b>.py": b"code"}, key(name="resnet"))
    html = client.get(f"/entries/{done['version']['entry_id']}").get_data(as_text=True)
    assert "resnet" in html and f"Version {done['version']['id']}" in html
    assert "fxgraph/ab/graph1" in html and sha(b"graph")[:16] in html
    assert "ab/c&lt;b&gt;.py" in html, "paths are escaped"
    assert "2 files," in html and "(s)" not in html
    one = publish(client, {"a.py": b"a"}, key(name="solo"))["version"]
    assert "1 file," in client.get(f"/entries/{one['entry_id']}").get_data(as_text=True)
    for times in ("0 times", "1 time", "2 times"):  # issue 37: "restored 1 times"
        page = client.get(f"/entries/{one['entry_id']}").get_data(as_text=True)
        assert re.search(rf"restored {times}[,.]", page), (times, re.findall(r"restored \d+ \w+", page))
        assert client.get("/api/v1/resolve", query_string=resolve_params(key(name="solo"))).json["hit"]
    assert client.get("/entries/99999").status_code == 404


def test_stats_page_draws_stored_bytes_and_restores_as_svg(client):
    k = key()
    publish(client, {"a": b"z" * 5000}, k)
    client.get("/api/v1/resolve", query_string=resolve_params(k))
    html = client.get("/stats", query_string={"days": 7}).get_data(as_text=True)
    assert "<script" not in html
    svg = html[html.index("<svg"):html.index("</svg>")]
    assert svg.count('class="restores"') == 7 and 'class="stored"' in svg
    assert "1 restore</title>" in svg and "5.0 kB" in html


def _verdict(client, version_id: int, verdict: str, first_call: float = 1.0) -> None:
    sent = {"versions": [version_id], "verdict": verdict, "fallback": "", "first_call_seconds": first_call}
    assert client.post("/api/v1/verdicts", json=sent).status_code == 200


def _rows(html: str) -> list:
    return re.findall(r'<tr class="entry">(.*?)</tr>', html, re.S)


def test_index_searches_flags_problems_and_fills_shared_bytes_and_hit_rates(client, monkeypatch):
    common = b"c" * 1000
    resnet = publish(client, {"common.bin": common, "a.py": b"a"}, key(name="resnet50", shape="f32[8,3,224,224]"),
                     compile_seconds=9.0)["version"]
    bert = publish(client, {"common.bin": common, "b.py": b"b"}, key(name="bert", shape="i64[1,128]"))["version"]
    publish(client, {"m.py": b"only mine"}, key(name="mlp_a"))
    _verdict(client, resnet["id"], "paid_off", first_call=2.0)
    _verdict(client, bert["id"], "no_hits")

    assert len(_rows(client.get("/", query_string={"q": "RESNET"}).get_data(as_text=True))) == 1
    by_shape = _rows(client.get("/", query_string={"q": "1,128"}).get_data(as_text=True))
    assert len(by_shape) == 1 and "i64[1,128]" in by_shape[0]
    assert len(_rows(client.get("/", query_string={"q": "mlp_"}).get_data(as_text=True))) == 1
    assert _rows(client.get("/", query_string={"q": "%"}).get_data(as_text=True)) == [], "LIKE wildcards are literal"


    rows = {re.search(r"<code>([^<]+)</code>", r).group(1): r for r in _rows(client.get("/").get_data(as_text=True))}
    shared = {shape: re.search(r'class="num shared">([^<]*)<', r).group(1) for shape, r in rows.items()}
    assert shared == {"f32[8,3,224,224]": "1.0 kB", "i64[1,128]": "1.0 kB", "f32[8,256]": ""}
    rates = {shape: re.search(r'class="num hit-rate">(?:<span[^>]*>)?([^<]*)<', r).group(1) for shape, r in rows.items()}
    assert rates == {"f32[8,3,224,224]": "100 %", "i64[1,128]": "0 %", "f32[8,256]": "-"}
    problems = _rows(client.get("/", query_string={"problem": "1"}).get_data(as_text=True))
    assert len(problems) == 1 and "i64[1,128]" in problems[0] and "problem: no hits" in problems[0]

    page = client.get(f"/entries/{resnet['entry_id']}").get_data(as_text=True)
    assert re.findall(r'<td><code>([^<]+)</code></td><td class="num">[^<]+</td><td><code[^>]*>[^<]+</code></td>'
                      r'<td class="shared">yes</td>', page) == ["common.bin"], "shared with bert's version"
    assert '<span class="shared-bytes">1.0 kB</span>' in page
    assert re.search(r'id="entry-hit-rate"><span[^>]*>100 %</span> \(1 of 1 verdicts\)', page)
    assert "<th>compile seconds saved</th><td>7.0</td>" in page
    assert '<span class="hit-rate"><span title="1 of 1 verdicts saw hits">100 %</span></span>' in page, "per version"

    from cachesvc.browse import pages as web

    monkeypatch.setattr(web, "PAGE", 1)  # the next page of a search keeps the search
    first = client.get("/", query_string={"q": "E"}).get_data(as_text=True)  # bert, resnet50
    nxt = html_lib.unescape(re.search(r'<a rel="next" href="([^"]+)"', first).group(1))
    assert "q=E" in nxt
    assert {len(_rows(first)), len(_rows(client.get(nxt).get_data(as_text=True)))} == {1}
    assert _rows(first) != _rows(client.get(nxt).get_data(as_text=True))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # a real client process: once is enough
def test_each_version_shows_a_restore_command_that_restores_it(live_server, client, tokens, tmp_path):
    import os
    import subprocess
    import sys

    import requests

    k = key(name="resnet", shape="f32[8,3,224,224]", tags={"mode": "max-autotune"})
    entry_id = publish(client, {"fxgraph/ab/graph": b"graph bytes"}, k)["version"]["entry_id"]
    page = requests.get(f"{live_server.url}/entries/{entry_id}", timeout=30,
                        headers={"Authorization": f"Bearer {tokens['read']}"}).text
    command = html_lib.unescape(re.search(r'<pre class="command">([^<]+)</pre>', page).group(1))
    assert f"--url {live_server.url} --name resnet --shape 'f32[8,3,224,224]' --tag mode=max-autotune" in command
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_"))
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path), CACHESVC_TOKEN=tokens["read"],
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"),
               PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}")
    done = subprocess.run(["bash", "-c", command + " --json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hit"] is True
    assert (tmp_path / "cache" / "fxgraph" / "ab" / "graph").read_bytes() == b"graph bytes"


def test_stats_page_answers_top_entries_hardware_torch_and_the_daily_hit_rate(client):
    gpu = key(name="llama", device="NVIDIA H200", cuda="cuda-12.8", arch="sm_90", torch="2.12.0")
    big = publish(client, {"w.bin": b"w" * 9000}, key(name="big"))["version"]
    hot = publish(client, {"k.py": b"kernel"}, gpu, compile_seconds=30.0)["version"]
    for _ in range(3):
        assert client.get("/api/v1/resolve", query_string=resolve_params(gpu)).json["hit"]
    _verdict(client, hot["id"], "paid_off", first_call=5.0)
    _verdict(client, hot["id"], "partial", first_call=10.0)
    _verdict(client, big["id"], "no_hits")
    html = client.get("/stats", query_string={"days": 3}).get_data(as_text=True)

    def table(ident):
        body = html[html.index(f'id="{ident}"'):]
        return re.findall(r"<tr[^>]*>(.*?)</tr>", body[body.index("<tbody>"):body.index("</tbody>")], re.S)

    most = table("top-most_restored")
    assert "llama" in most[0] and '<td class="num">3</td>' in most[0] and "100 %" in most[0]
    assert "big" in table("top-largest")[0] and "9.0 kB" in table("top-largest")[0]
    devices = table("devices")
    assert "NVIDIA H200" in devices[0] and "sm_90" in devices[0] and '<td class="num">3</td>' in devices[0]
    assert "x86_64" in devices[1]
    assert [re.search(r">([^<]+)</a>", r).group(1) for r in table("torch")] == ["2.12.0", "2.13.0+cpu"]
    assert re.search(r'id="hit-rate">66.7 %<', html)
    assert re.search(r'id="problems">1<', html)
    rate_svg = html[html.index('class="chart hit-rate"'):]
    assert rate_svg[:rate_svg.index("</svg>")].count('class="day-rate"') == 1, "one day with verdicts"
    today = client.get("/api/v1/stats", query_string={"days": 3}).json["daily"][-1]
    assert (today["verdicts"], today["hits"], today["hit_rate"], today["compile_seconds_saved"]) == (3, 2, 0.667, 45.0)


# ------------------------------------------------------------------------ the fleet's demand on the entry page


def _usage(client, name: str, shapes: dict, tags=None, **env) -> None:
    """Report ``shapes`` ({shape: (package, compile, eager)}) for the key family of ``name``."""
    fam = key(name=name, tags=tags, **env)
    del fam["shape"]
    items = [{"shape": s, "served": dict(zip(("package", "compile", "eager"), n))} for s, n in shapes.items()]
    resp = client.post("/api/v1/usage", json={"reports": [{"key": fam, "shapes": items}]})
    assert resp.status_code == 200 and resp.json["recorded"][0]["shapes"] == len(shapes), resp.json


def _demand_section(html: str) -> str:
    return html[html.index('<section id="demand">'):html.index("</section>", html.index('<section id="demand">'))]


def test_the_entry_page_charts_the_shapes_the_fleet_served_escaped(client):
    # keys.check_shape allows any printable text, markup characters too (a control character it refuses)
    for shape in ('f32[<script>alert(1)</script>]', 'a&b "quoted" \'x\''):
        assert keys.check_shape(shape) == shape
    for shape in ("f32[\n]", "f32[\x00]", "a\u2028b"):
        with pytest.raises(keys.InvalidKey):
            keys.check_shape(shape)
    entry_id = publish(client, {"f": b"x"}, key(name="llama"))["version"]["entry_id"]
    hostile = 'f32[<script>alert("x")</script>]'
    _usage(client, "llama", {"f32[8,256]": (120, 3, 0), hostile: (0, 2, 5), "f32[" + "9," * 30 + "9]": (0, 0, 1)})
    _usage(client, "llama", {"other-env": (50, 0, 0)}, device="NVIDIA H200")  # another environment: not this page's
    publish(client, {"f": b"y"}, key(name="bert"))
    _usage(client, "bert", {"bert-shape": (9, 0, 0)})  # another model
    section = _demand_section(client.get(f"/entries/{entry_id}").get_data(as_text=True))
    assert "Shapes the fleet served" in section and 'id="no-demand"' not in section
    assert "<script" not in section and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in section
    assert "other-env" not in section and "bert-shape" not in section
    svg = section[section.index('<svg'):section.index("</svg>")]
    assert svg.count('class="shape-label"') == 3
    assert svg.count('class="served-package"') == 1 and svg.count('class="served-compile"') == 2
    assert svg.count('class="served-eager"') == 2
    assert "120 calls served by a package" in svg and "served by eager (uncompiled)" in svg  # a tooltip, the legend
    long = "f32[" + "9," * 30 + "9]"
    assert f">{long[:33]}…<title>{long}</title>" in svg  # cut beside its bar, whole in its tooltip
    rows = re.findall(r'<tr class="demand-shape">(.*?)</tr>', section, re.S)
    cells = [re.findall(r'<td class="num">(\d+)</td>', r) for r in rows]
    assert cells == [["123", "120", "3", "0"], ["7", "0", "2", "5"], ["1", "0", "0", "1"]]
    assert "f32[8,256]" in rows[0] and "<time" in rows[0] and "131 calls reported over 3 shapes" in section


def test_the_entry_page_shows_the_20_most_called_shapes_of_each_family_and_says_so(client):
    entry_id = publish(client, {"f": b"x"}, key(name="llama"))["version"]["entry_id"]
    _usage(client, "llama", {f"s{i:02d}": (i + 1, 0, 0) for i in range(25)})
    _usage(client, "llama", {"tagged": (1, 0, 0)}, tags={"mode": "max-autotune"})
    section = _demand_section(client.get(f"/entries/{entry_id}").get_data(as_text=True))
    families = section.split('<div class="demand-family">')[1:]
    assert len(families) == 2 and "Tags <code>mode=max-autotune</code>" in families[1]
    assert "over 25 shapes (the 20 most called shown)" in families[0]
    assert families[0].count('class="shape-label"') == 20 and families[0].count('<tr class="demand-shape">') == 20
    assert "s24" in families[0] and "s04" not in families[0]


def test_an_entry_without_demand_says_how_the_fleet_reports(client):
    entry_id = publish(client, {"f": b"x"}, key(name="quiet"))["version"]["entry_id"]
    section = _demand_section(client.get(f"/entries/{entry_id}").get_data(as_text=True))
    assert 'id="no-demand"' in section and "cachesvc_client.compile" in section and "<svg" not in section
