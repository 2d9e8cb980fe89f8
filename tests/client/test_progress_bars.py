"""cachesvc_client.progress: a bar on a terminal that log lines do not write onto, a log line otherwise,
and restore and publish counting what their summaries count (files or blobs, bytes on the wire)."""
from __future__ import annotations

import io
import logging
import os
import re
import sys

import pytest

from cachesvc_client import CacheClient, progress
from tests.helpers import ENV


def test_without_a_terminal_a_periodic_log_line_and_no_bar(caplog):
    log = logging.getLogger("cachesvc_client.test")
    with caplog.at_level(logging.INFO, logger="cachesvc_client.test"):
        with progress.Progress("restore mlp", 2, 3000, log, interval=0, bar=False) as p:
            p.advance(1, 1000)
            p.advance(1, 2000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-1] == f"restore mlp: 2/2 files, 3.0 kB of 3.0 kB on the wire, {lines[-1].rsplit(', ', 1)[1]}"
    assert len(lines) == 2


def test_on_a_terminal_log_lines_go_above_the_bar_not_onto_it(monkeypatch):
    """tqdm draws with carriage returns and no newline: a log line written to stderr while the bar is up
    lands after the bar's text (``...1.43MB/s]2026-12-01 07:39:06 INFO ...``) unless it goes through tqdm."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    root.addHandler(handler)
    try:
        log = logging.getLogger("cachesvc_client")
        with progress.Progress("restore mlp", 4, 4_000_000, log, interval=0, bar=True) as p:
            for _ in range(4):
                p.advance(1, 1_000_000)
                log.warning("a warning while the bar is up")
    finally:
        root.removeHandler(handler)
    text = err.getvalue()
    assert "restore mlp (bytes on the wire)" in text, text
    assert text.count("LOG a warning while the bar is up") == 4, text
    assert not re.search(r"[^\r\n]LOG a warning", text), f"a log line was written onto the bar:\n{text!r}"
    assert "on the wire, " not in text, "a bar and no periodic log line"


class Recorder(progress.Progress):
    """The real Progress, remembered, to compare its counts with the report's."""

    made = []

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        Recorder.made.append(self)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_publish_and_restore_count_blobs_files_and_wire_bytes_as_their_summaries_do(live_server, tmp_path,
                                                                                   monkeypatch):
    src = tmp_path / "src"
    files = {"fxgraph/a/entry": b"f" * 40_000, "fxgraph/b/entry": b"f" * 40_000,  # one blob, two files
             "sj/k.so": os.urandom(200_000), "sj/k.cpp": b"int k;" * 5000, "aot/e": b"a" * 700}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    monkeypatch.setattr("cachesvc_client.publish.snapshot.Progress", Recorder)
    monkeypatch.setattr("cachesvc_client.restore.fetch.Progress", Recorder)
    client = CacheClient(live_server.url, cache_dir=str(tmp_path / "cache"), timeout=30)
    pub = client.publish("mlp", "f32[8,256]", env=ENV, roots={"inductor": str(src)})
    sent = Recorder.made[-1]
    assert pub.files == 5 and pub.uploaded_blobs == 4
    assert (sent.done_items, sent.total_items, sent.items) == (4, 4, "blobs"), "blobs, as 'uploaded 4 blobs'"
    assert sent.bytes == sent.total_bytes == pub.uploaded_bytes < sum(map(len, files.values()))

    got = client.restore("mlp", "f32[8,256]", env=ENV)
    received = Recorder.made[-1]
    assert got.hit and got.files == 5
    assert (received.done_items, received.total_items, received.items) == (5, 5, "files")
    assert received.bytes == received.total_bytes == got.bytes, "bytes on the wire, as 'transferred'"
