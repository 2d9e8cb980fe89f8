"""Issue 15, item 6: a malformed answer is a miss with a clear reason, never a crash.

The checkers of ``cachesvc_client.answers`` on their own, then a property
test: resolve answers of a real service, mutated by hypothesis (a field
dropped, a wrong type, a list for an object, a lone surrogate, absurd sizes
and offsets, deep nesting, bytes that are not JSON), served by a proxy on
loopback in front of that service (``http_faults.FaultyHTTP`` with a
rewrite; the blobs come from the service itself). ``restore()`` must return
a report, never raise; when the checker refuses the answer the report is a
miss naming it malformed; the report prints and serialises; no file is half
written and no temp file stays.
"""
from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cachesvc_client import CacheClient, answers
from cachesvc_client.report import RestoreReport
from tests.helpers import ENV, sha
from tests.helpers.client import enter_container
from tests.helpers.restores import SHAPE, final_files, publish_files, temp_files, write_files
from tests.reliability.http_faults import FaultyHTTP

NAME = "fuzzed"
D = "ab" * 32


def hit(**over) -> dict:
    doc = {"hit": True, "entry": {"id": 1}, "version": {"id": 2, "meta": {"torch_dir": "/t"}},
           "files": [{"root": "inductor", "path": "a/b", "sha256": D, "size": 5, "mode": 420}],
           "blobs": {D: {"url": "/api/v1/blobs/" + D, "encoding": "identity", "size": 5, "stored_size": 5}}}
    doc.update(over)
    return doc


@pytest.mark.parametrize("doc,says", [
    ([], "must be a JSON object, got a list"),
    ({}, "hit is missing"),
    ({"hit": "yes"}, "hit must be true or false"),
    (hit(files={"a": 1}), "files must be a list"),
    (hit(files=[{"root": "inductor", "path": "a", "sha256": D, "size": "5"}]), "files[0].size"),
    (hit(files=[{"root": "inductor", "path": "a\ud800", "sha256": D, "size": 5}]), "lone surrogate"),
    (hit(files=[{"root": "inductor", "path": "../x", "sha256": D, "size": 5}]), "path rules"),
    (hit(files=[{"root": "inductor", "path": "a", "sha256": D, "size": 2**80}]), "size"),
    (hit(blobs={D: {"url": "/x", "encoding": "zstd", "size": 5, "stored_size": 3, "pack": "/p",
                    "pack_sha256": D, "pack_size": 10, "offset": 9}}), "outside its pack"),
    (hit(blobs={D: {"url": "/x", "encoding": "zstd", "size": 5, "stored_size": 3, "pack": "/p",
                    "pack_sha256": D, "pack_size": 10, "offset": -1}}), "offset is -1"),
    (hit(blobs={D: {"url": "file:///etc/passwd", "encoding": "identity", "size": 5, "stored_size": 5}}),
     "http(s) URL"),
    (hit(blobs={D: {"url": "/x", "encoding": "lz4", "size": 5, "stored_size": 5}}), "encoding"),
    (hit(blobs={D: {"url": "/x", "encoding": "identity", "size": 6, "stored_size": 6}}), "its blob's size is 6"),
    (hit(version=[2]), "version must be a JSON object"),
    (hit(version={"id": True}), "version.id must be an integer"),
    (hit(version={"id": 2, "meta": {"torch_dir": ["x"]}}), "version.meta.torch_dir"),
    (hit(fallback={"step": "shape", "versions": "1"}), "fallback.versions must be a list"),
    ({"hit": False, "nearest": [{"entry": {"id": 1, "name": "m"}}]}, "nearest[0].entry.shape is missing"),
    ({"hit": False, "reason": "\udfff"}, "reason holds a lone surrogate"),
])
def test_malformed_resolve_answers_are_named(doc, says):
    with pytest.raises(answers.Malformed) as caught:
        answers.resolve(doc)
    assert says in str(caught.value)
    str(caught.value).encode("utf-8")  # the message itself prints anywhere


def test_a_good_answer_keeps_what_restore_reads():
    got = answers.resolve(hit(extra={"ignored": 1}))
    assert got["files"][0] == {"root": "inductor", "path": "a/b", "sha256": D, "size": 5, "mode": 420}
    assert got["version"] == {"id": 2, "meta": {"torch_dir": "/t"}, "signature": None} and got["fallback"] is None
    miss = answers.resolve({"hit": False, "reason": "no entry has this key"})
    assert miss == {"hit": False, "reason": "no entry has this key", "nearest": []}


@pytest.mark.parametrize("body,says", [(b"[" * 100_000, "nests too deep"), (b"1" * 5000, "not JSON"),
                                       (b"<html>", "not JSON"), (b"\xff\xfe{}", "not JSON")])
def test_bytes_that_are_not_json_are_malformed(body, says):
    with pytest.raises(answers.Malformed, match=says):
        answers.parse(body)


# -- property: mutated answers of a real service ------------------------------------------------------

@pytest.fixture
def database_url(sqlite_url):
    return sqlite_url


@pytest.fixture
def storage_settings(local_storage_settings):  # blob URLs through the service, so through the proxy
    return local_storage_settings


class Mutated:
    """The resolve body the proxy hands out instead of the service's (None: the service's own)."""

    def __init__(self):
        self.body = None
        self.real = None

    def __call__(self, path, status, headers, body):
        if not path.startswith("/api/v1/resolve"):
            return status, headers, body
        self.real = json.loads(body)
        if self.body is None:
            return status, headers, body
        return 200, {**headers, "Content-Type": "application/json"}, self.body


@pytest.fixture
def served(live_server, tmp_path, monkeypatch):
    """A version of a few files (packed and loose), and a proxy that mutates its resolve answer. The test runs
    as a container of its own (HOME, TMPDIR): a mutated answer may name the other roots."""
    enter_container(monkeypatch, tmp_path / "ctr")
    files = write_files(tmp_path / "src", {"fxgraph/k/entry": b"graph " * 200, "sj/k.cpp": b"int k;" * 100,
                                           "sj/k.so": bytes(range(256)) * 1200})
    assert publish_files(live_server.url, None, tmp_path / "src", name=NAME).status == "committed"
    mutated = Mutated()
    with FaultyHTTP(live_server.port, rewrite=mutated) as proxy:
        CacheClient(proxy.url, cache_dir=str(tmp_path / "first"), timeout=10).restore(NAME, SHAPE, env=ENV)
        assert mutated.real and mutated.real["hit"]
        yield proxy, mutated, files


def paths(doc, prefix=()):
    """Every place in ``doc`` (a list of keys and indices), the first items of lists only."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:2]):
            yield from paths(v, prefix + (i,))


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.sampled_from([-1, 0, 2**31, 2**63, 10**30, 1.5, float("inf"), float("nan")]),
    st.sampled_from(["", "\ud800", "a\udfffb", "../../x", "/etc/passwd", "x" * 20_000, "http://[::1", "ab" * 32]),
    st.text(max_size=20), st.just([]), st.just({}), st.just([[[[[[[[[[1]]]]]]]]]]),
    st.recursive(st.integers() | st.text(max_size=5), lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8))


@st.composite
def mutations(draw, real):
    doc = copy.deepcopy(real)
    where = draw(st.sampled_from(list(paths(doc))))
    op = draw(st.sampled_from(["replace", "delete", "wrap"] if where else ["replace", "wrap"]))
    if not where:
        doc = draw(HOSTILE) if op == "replace" else [doc]
    else:
        parent = doc
        for step in where[:-1]:
            parent = parent[step]
        last = where[-1]
        if op == "delete":
            del parent[last]
        else:
            parent[last] = draw(HOSTILE) if op == "replace" else [parent[last]]
    return doc


@st.composite
def bodies(draw, real):
    text = json.dumps(real)
    return draw(st.one_of(
        mutations(real).map(lambda d: json.dumps(d).encode()),
        st.integers(0, len(text) - 1).map(lambda n: text[:n].encode()),  # cut short
        st.sampled_from([b"[" * 50_000, b"<!doctype html><p>hello</p>", b"\xff" * 10, b"1e400",
                         json.dumps(real).replace('"size": ', '"size": 1' + "0" * 5000 + ', "x": ').encode()])))


@pytest.mark.fuzz  # 150 restores from mutated answers: CI runs it (.ci/run), the README's command does not
def test_mutated_resolve_answers_are_misses_or_correct_restores(served):
    proxy, mutated, files = served

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(body=bodies(mutated.real))
    def check(body):
        try:
            valid = answers.resolve(answers.parse(body)) is not None
        except answers.Malformed:
            valid = False
        mutated.body = body
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(tmp) / "cache"
            report = CacheClient(proxy.url, cache_dir=str(cache), timeout=10).restore(NAME, SHAPE, env=ENV)
            assert isinstance(report, RestoreReport)
            report.summary().encode("utf-8")
            json.dumps(report.to_dict())
            assert "unexpected" not in report.reason, report.reason  # no bug caught by the last resort
            if not valid:
                assert not report.hit and "malformed" in report.reason, report.reason
            if cache.exists():  # whatever was placed (a valid mutation may move a path) is a published file, whole
                assert not temp_files(cache)
                published = {sha(data) for data in files.values()}
                assert all(sha((cache / rel).read_bytes()) in published for rel in final_files(cache))

    check()


ROWS = st.fixed_dictionaries(
    {"root": st.sampled_from(["inductor", "pch", "Bad", 1]),
     "path": st.one_of(st.sampled_from(["a/b", ".hidden/x", "a/../b", "a//b", "/abs", "a/./b", "x" * 300, "é/ü",
                                        "a\ud800", "C:/x", "a\\b", "ok.so"]), st.text(max_size=12)),
     "sha256": st.sampled_from([D, D.upper(), "ab", 5]),
     "size": st.sampled_from([0, 5, -1, 2**40, 2**70, True, "5", 1.0])},
    optional={"mode": st.sampled_from([0o644, 0o755, -1, 0o10000, True, "644"])})
BLOBS = st.fixed_dictionaries(
    {"url": st.sampled_from(["/api/v1/blobs/x", "//evil/x", "http://s3:9000/b/k?sig=1", "ftp://x/y", "http://[::1/x",
                             "http://h:port/x", 7]),
     "encoding": st.sampled_from(["zstd", "identity", "lz4", None]),
     "size": st.sampled_from([5, 0, -1, 2**70, "5"]), "stored_size": st.sampled_from([5, 3, -1, True])},
    optional={"stored_sha256": st.sampled_from([D, "zz", None]), "pack": st.sampled_from(["/api/v1/packs/p", None, 3]),
              "pack_sha256": st.sampled_from([D, "x"]), "pack_size": st.sampled_from([10, None, 2**40, "10"]),
              "offset": st.sampled_from([0, 5, 9, -1, 2**31])})


@settings(max_examples=400, deadline=None, database=None)
@given(row=ROWS, blob=BLOBS)
def test_the_fast_paths_agree_with_the_careful_checks(row, blob):
    for fast, careful in ((answers._fast_file(row, {}), lambda: answers.file_row(row, "row")),
                          (answers._fast_blob(blob, set()), lambda: answers.blob_entry(blob, "blob"))):
        try:
            expected = careful()
        except answers.Malformed:
            assert fast is None
        else:
            assert fast is None or fast == expected
