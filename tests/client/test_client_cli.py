"""`cachesvc-client` as an init container and a person at a terminal meet it, run as a real process.

An init container has no terminal and no torch; its exit status decides whether the pod starts.
So: a miss (no URL included) exits 0 with one warning line unless --strict; bad arguments exit 2
with one line naming the flag, file or variable, never a traceback; the summary prints once, on
stdout; -q prints nothing but warnings.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from cachesvc_client import __version__
from cachesvc_client.report import RestoreReport
from cachesvc_client.verdicts import judge, record_verdict
from harness.containers import inherited_env
from tests.helpers import ENV, foreign_web_server, key, publish
from tests.helpers.backends import one_backend

NAME, SHAPE = "mlp", "f32[8,256]"
ENV_VARS = {f"CACHESVC_ENV_{k.upper()}": v for k, v in ENV.items()}  # the key's environment, no torch import



def container(tmp_path: Path, name: str = "ctr") -> Dict[str, str]:
    """A fresh container's environment: its own HOME and TMPDIR, nothing of the developer's cachesvc settings."""
    root = tmp_path / name
    for sub in ("home", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_", "TRITON_"))
    env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"), TORCHINDUCTOR_CACHE_DIR=str(root / "cache"))
    return env


def cli(env: Dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cachesvc_client.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{text}"
    return lines[0]


# -- arguments ------------------------------------------------------------------------------------

def test_help_and_version(tmp_path):
    env = container(tmp_path)
    for args in (["-h"], ["--help"], ["restore", "-h"], ["ls", "-h"], ["status", "-h"], ["env", "-h"]):
        out = cli(env, *args)
        assert out.returncode == 0 and "Usage: cachesvc-client" in out.stdout, (args, out.stderr)
    for flag in ("--version", "-V"):  # -V as `cachesvc -V`
        version = cli(env, flag)
        assert version.returncode == 0 and version.stdout.strip() == f"cachesvc-client {__version__}", flag
    bare = cli(env)
    assert bare.returncode == 2 and "restore" in bare.stdout + bare.stderr


@pytest.mark.parametrize("args,extra_env,names", [
    (["--name", ""], {}, "'--name': name must not be empty"),
    (["--name", "a\tb"], {}, "'--name': name contains control characters"),
    (["--name", "x" * 201], {}, "'--name': name is 201 characters long"),
    (["--shape", ""], {}, "'--shape': shape must not be empty"),
    (["--tag", "novalue"], {}, "'--tag': 'novalue' is not KEY=VALUE"),
    (["--tag", "bad key=v"], {}, "'--tag': tag key 'bad key' must be"),
    (["--tag", "k=\x01"], {}, "'--tag': tags.k contains control characters"),
    (["--url", "http://[::1"], {}, "'--url': 'http://[::1' is not a URL"),
    (["--url", "ftp://host"], {}, "'--url': 'ftp://host' is not a service URL"),
    (["--url", "http://host:99999"], {}, "'--url': 'http://host:99999' is not a URL"),
    ([], {"CACHESVC_URL": "http://[::1"}, "$CACHESVC_URL: 'http://[::1' is not a URL"),
    ([], {"CACHESVC_ENV_DEVICE": "NVIDIA\x1bH200"}, "$CACHESVC_ENV_DEVICE: env.device contains control characters"),
    (["--timeout", "-1"], {}, "'--timeout'"),
    (["--fallback-max-bytes", "5X"], {}, "'--fallback-max-bytes': '5X' is not a size"),
    (["--kind", "torchscript"], {}, "'--kind'"),
])
def test_bad_arguments_are_one_line_naming_the_flag_or_variable_and_exit_2(tmp_path, args, extra_env, names):
    base = {"--name": NAME, "--shape": SHAPE}
    for flag in [a for a in args if a in base]:
        base.pop(flag)
    argv = ["restore", *[x for kv in base.items() for x in kv], *args]
    out = cli({**container(tmp_path), **ENV_VARS, **extra_env}, *argv)
    assert out.returncode == 2, out
    line = one_line(out.stderr)
    assert line.startswith("cachesvc-client restore: error: ") and names in line, line
    assert "Traceback" not in out.stderr and out.stdout == ""


@pytest.mark.parametrize("doc,names", [
    (None, "cannot be read"), (b"not json", "not JSON"), (b"[]", "must be a JSON object"),
    ({**ENV, "gpu": "H200"}, "unknown env field(s): gpu"), ({**ENV, "torch": 2}, "env.torch must be a string"),
    (b"[" * 60_000, "nested too deeply"), ("fifo", "not a regular file"),  # a RecursionError; a read that blocks
])
@pytest.mark.parametrize("via", ["flag", "variable"])
def test_a_bad_env_file_is_a_usage_error_naming_the_file_and_field(tmp_path, doc, names, via):
    path = tmp_path / "env.json"
    if doc == "fifo":
        os.mkfifo(path)  # nothing ever writes to it: reading it would block for good
    elif doc is not None:
        path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    env = container(tmp_path)
    argv = ["restore", "--name", NAME, "--shape", SHAPE, "--budget", "5"]
    if via == "flag":
        argv += ["--env-file", str(path)]
    else:
        env["CACHESVC_ENV_FILE"] = str(path)
    out = cli(env, *argv, timeout=60)
    assert out.returncode == 2, out
    line = one_line(out.stderr)
    assert f"env file {path}: " in line and names in line, line
    if via == "flag" and doc in (b"[" * 60_000, "fifo"):
        publish = cli(env, "publish", "--name", NAME, "--shape", SHAPE, "--env-file", str(path),
                      "--url", "http://127.0.0.1:9", timeout=60)
        assert publish.returncode == 2 and names in one_line(publish.stderr), publish
    assert ("$CACHESVC_ENV_FILE" in line) == (via == "variable")


def test_no_url_is_a_miss_with_one_warning_line_unless_strict(tmp_path):
    env = {**container(tmp_path), **ENV_VARS}
    out = cli(env, "restore", "--name", NAME, "--shape", SHAPE)
    assert out.returncode == 0 and one_line(out.stdout).startswith(f"restore {NAME} [{SHAPE}]: miss (error: no service")
    line = one_line(out.stderr)
    assert line.startswith("cachesvc-client: warning: no service URL (--url or CACHESVC_URL)") and "miss" in line
    assert "cold" not in line
    as_json = cli(env, "restore", "--name", NAME, "--shape", SHAPE, "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["hit"] is False
    strict = cli(env, "restore", "--name", NAME, "--shape", SHAPE, "--strict")
    assert strict.returncode == 1 and "--strict" in strict.stderr.splitlines()[-1]
    assert cli(env, "publish", "--name", NAME, "--shape", SHAPE).returncode == 2, "publishing needs a service"
    assert cli(env, "ls").returncode == 2 and cli(env, "stats").returncode == 2


# -- against a live service -----------------------------------------------------------------------

@pytest.fixture
def published(live_server, client):
    """Two files published under (NAME, SHAPE, ENV); returns the live server."""
    publish(client, {"fxgraph/a/entry": b"g" * 30_000, "sj/k.so": os.urandom(150_000)}, key(NAME, SHAPE))
    return live_server


@one_backend
def test_a_hit_prints_its_summary_once_on_stdout_and_quiet_prints_nothing(published, tmp_path):
    env = {**container(tmp_path), **ENV_VARS, "CACHESVC_URL": published.url}
    out = cli(env, "restore", "--name", NAME, "--shape", SHAPE)
    assert out.returncode == 0, out.stderr
    summary = one_line(out.stdout)
    assert summary.startswith(f"restore {NAME} [{SHAPE}]: hit version ") and "2 files written (180.0 kB" in summary
    assert "hit version" not in out.stderr, "the summary prints once"
    again = cli(env, "restore", "--name", NAME, "--shape", SHAPE, "-q")
    assert again.returncode == 0 and again.stdout == "" and again.stderr == ""
    miss = cli(env, "restore", "--name", "other", "--shape", SHAPE, "-q")
    assert miss.returncode == 0 and miss.stdout == "" and miss.stderr == ""
    strict = cli(env, "restore", "--name", "other", "--shape", SHAPE, "-q", "--strict")
    assert strict.returncode == 1 and strict.stdout == ""
    assert "miss" in one_line(strict.stderr)


def test_a_dead_url_is_a_miss_whose_summary_prints_on_stdout(tmp_path):
    """docs/client.md: the summary prints once, on stdout, whatever happened (the warning says why, on stderr)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        env = {**container(tmp_path), **ENV_VARS, "CACHESVC_URL": f"http://127.0.0.1:{s.getsockname()[1]}"}
        out = cli(env, "restore", "--name", NAME, "--shape", SHAPE, "--timeout", "2")
    assert out.returncode == 0, out.stderr
    summary = one_line(out.stdout)
    assert summary.startswith(f"restore {NAME} [{SHAPE}]: miss (error: cannot reach") and " s" in summary, summary
    assert one_line(out.stderr).startswith("cachesvc-client: warning: "), out.stderr


def test_commands_that_import_torch_print_no_numpy_warning_without_numpy(tmp_path):
    """An init image without numpy: torch's 'Failed to initialize NumPy' is not the client's to print."""
    blocked = tmp_path / "no-numpy" / "numpy"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ModuleNotFoundError('No module named numpy', name='numpy')\n")
    env = {**container(tmp_path), "PYTHONPATH": os.pathsep.join([str(blocked.parent)] + [p for p in sys.path if p])}
    out = cli(env, "env", "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["torch"] != "none", out.stderr
    assert "NumPy" not in out.stderr, out.stderr


@one_backend
def test_publishing_an_empty_cache_dir_is_refused_whatever_neighbours_left_in_the_shared_temp_dir(live_server,
                                                                                                   tmp_path):
    """Issue 27 item 3: other processes' precompiled headers under the host's default temp dir are not this
    compile's; a publish of an empty cache dir is refused (exit 1, one line) and commits nothing."""
    from cachesvc_client.process import roots

    env = {**container(tmp_path), **ENV_VARS, "CACHESVC_URL": live_server.url,
           "CACHESVC_TOKEN": live_server.app.config["TOKENS"]["write"]}
    (tmp_path / "ctr" / "cache").mkdir()
    pch = subprocess.run([sys.executable, "-c", "from cachesvc_client.process import roots; print(roots.resolve_root('pch'))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert pch.startswith(env["TMPDIR"]) and "pch" in roots.SHARED_ROLES
    os.makedirs(pch)
    with open(os.path.join(pch, "neighbour.h.gch"), "wb") as f:
        f.write(os.urandom(50_000))
    out = cli(env, "publish", "--name", NAME, "--shape", SHAPE)
    assert out.returncode == 1 and out.stdout == "", out
    line = one_line(out.stderr)
    assert "nothing to publish" in line and "not this compile's" in line, line
    assert live_server.app.test_client().get("/api/v1/entries", headers={
        "Authorization": f"Bearer {live_server.app.config['TOKENS']['read']}"}).json["total"] == 0


NEIGHBOUR = "import os, sys\nfrom cachesvc_client.process import roots\nfor role in ('pch', 'memo', 'triton'):\n" \
            "    os.makedirs(roots.resolve_root(role), exist_ok=True)\n" \
            "    with open(os.path.join(roots.resolve_root(role), 'neighbour-' + role + '.h.gch'), 'wb') as f:\n" \
            "        f.write(os.urandom(40_000))\nprint(roots.default_cache_dir())\n"
COMPILE = ("import torch\nm = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
           "with torch.no_grad():\n    torch.compile(m)(torch.randn(2, 16))\n")


@pytest.mark.slow
@one_backend
def test_a_publish_carries_none_of_what_a_neighbour_left_in_the_hosts_shared_default_dirs(live_server, tmp_path):
    """Issue 27 item 3: with TMPDIR unset, the precompiled headers and memo folder are torch's default under the
    host's /tmp (torchinductor_<user>), and Triton's cache is the shared HOME's: a neighbour process writes there
    too. A publish of a real compile's cache dir carries its own files and none of the neighbour's, and says what
    it left out and what to set; with the default cache dir itself it is refused."""
    user = f"cachesvc-t27-{os.getpid()}-{os.urandom(3).hex()}"  # this test's own torchinductor_<user> under /tmp
    env = {k: v for k, v in container(tmp_path).items() if k not in ("TMPDIR", "TEMP", "TMP")}
    env.update(ENV_VARS, USER=user, LOGNAME=user, CACHESVC_URL=live_server.url,
               CACHESVC_TOKEN=live_server.app.config["TOKENS"]["write"])
    neighbour = subprocess.run([sys.executable, "-c", NEIGHBOUR], env={**env, "TORCHINDUCTOR_CACHE_DIR": str(
        tmp_path / "neighbour-cache")}, capture_output=True, text=True, check=True)
    default = neighbour.stdout.strip()
    assert default.endswith(f"/torchinductor_{user}") and not default.startswith(str(tmp_path)), default
    try:
        compiled = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300)
        assert compiled.returncode == 0, compiled.stderr
        out = cli(env, "publish", "--name", NAME, "--shape", SHAPE, "--json")
        assert out.returncode == 0, out.stderr
        assert "left out pch" in out.stderr and "TMPDIR" in out.stderr, out.stderr
        read = {"Authorization": f"Bearer {live_server.app.config['TOKENS']['read']}"}
        api = live_server.app.test_client()
        entry = api.get("/api/v1/entries", headers=read).json["entries"][0]
        files = api.get(f"/api/v1/entries/{entry['id']}", headers=read).json["versions"][0]["files"]
        assert any(f["path"].startswith("fxgraph/") for f in files), files
        assert {f["root"] for f in files} == {"inductor"}, files
        assert not [f for f in files if "neighbour" in f["path"]]
        assert all((tmp_path / "ctr" / "cache" / f["path"]).is_file() for f in files)
        for cache_dir in (None, default):  # unset, or named: torch's default path is the shared one either way
            shared = cli({**{k: v for k, v in env.items() if k != "TORCHINDUCTOR_CACHE_DIR"},
                          **({"TORCHINDUCTOR_CACHE_DIR": cache_dir} if cache_dir else {})},
                         "publish", "--name", "other", "--shape", SHAPE)
            assert shared.returncode == 1 and "torch's default under the host's shared temp dir" in one_line(
                shared.stderr), shared.stderr
    finally:  # the host's /tmp: the compile's ~150 MB precompiled header and the neighbour's files
        import shutil
        shutil.rmtree(default, ignore_errors=True)


#: some other web server at the configured URL: an HTML 404 of several lines for everything
NOT_CACHESVC = b"<html>\n<head><title>404 Not Found</title></head>\n<body>\n<h1>Not Found</h1>\n</body>\n</html>\n"


def test_another_web_server_at_the_url_is_a_miss_told_in_one_line(tmp_path):
    with foreign_web_server(NOT_CACHESVC) as url:
        env = {**container(tmp_path), **ENV_VARS, "CACHESVC_URL": url}
        out = cli(env, "restore", "--name", NAME, "--shape", SHAPE)
    assert out.returncode == 0 and one_line(out.stdout).startswith(f"restore {NAME} [{SHAPE}]: miss"), out
    line = one_line(out.stderr)
    assert line.startswith("cachesvc-client: warning: ") and "404" in line and "cold" not in line
    assert (out.stdout + out.stderr).count("Not Found</h1>") <= 1


@one_backend
def test_the_env_file_gives_a_process_the_apps_key(published, tmp_path):
    env = {**container(tmp_path), "CACHESVC_URL": published.url}
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps(ENV))
    out = cli(env, "restore", "--name", NAME, "--shape", SHAPE, "--env-file", str(env_file), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["hit"], out.stderr
    report = json.loads(out.stdout)
    assert report["env"] == ENV and report["env_file"] == str(env_file)
    by_variable = cli({**container(tmp_path, "b"), "CACHESVC_URL": published.url, "CACHESVC_ENV_FILE": str(env_file)},
                      "restore", "--name", NAME, "--shape", SHAPE, "--json")
    assert json.loads(by_variable.stdout)["hit"], by_variable.stderr
    overridden = cli({**env, "CACHESVC_ENV_DEVICE": "NVIDIA H200"}, "restore", "--name", NAME, "--shape", SHAPE,
                     "--env-file", str(env_file))
    assert overridden.returncode == 0 and "miss" in overridden.stdout and "device 'NVIDIA H200' != x86_64" in \
        overridden.stdout, "a CACHESVC_ENV_<FIELD> wins over the file"


@one_backend
def test_status_shows_what_was_restored_how_it_stands_and_the_verdict(published, tmp_path, monkeypatch):
    env = {**container(tmp_path), **ENV_VARS, "CACHESVC_URL": published.url}
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    for var in ("HOME", "TMPDIR"):  # judge() below looks at the container's roots, as its app would
        monkeypatch.setenv(var, env[var])
    assert "nothing restored into" in cli(env, "status").stdout
    restored = cli(env, "restore", "--name", NAME, "--shape", SHAPE, "--tag", "mode=x", "--json")
    assert not json.loads(restored.stdout)["hit"]
    report = RestoreReport(**json.loads(cli(env, "restore", "--name", NAME, "--shape", SHAPE, "--json").stdout))
    s = json.loads(cli(env, "status", "--json").stdout)
    assert s["restored"] and s["key"] == {"name": NAME, "shape": SHAPE, "tags": {}, "env": ENV}
    assert s["versions"] == report.versions and s["entry_id"] == report.entry_id and s["kind"] == "inductor-dir"
    assert (s["files_written"], s["bytes"], s["bytes_written"]) == (2, report.bytes, 180_000)
    assert s["files"] == {"in_place": 2, "changed": 0, "missing": 0} and s["verdict"] is None
    (cache / "sj/k.so").write_bytes(b"changed")
    (cache / "fxgraph/a/entry").unlink()
    counters = {"fxgraph_hits": 1, "fxgraph_misses": 0, "aotautograd_hits": 1, "aotautograd_misses": 0,
                "triton_kernels": 0}
    assert record_verdict(str(cache), judge(report, str(cache), counters))  # what client.verify() does
    s = json.loads(cli(env, "status", "--json").stdout)
    assert s["files"] == {"in_place": 0, "changed": 1, "missing": 1}
    assert s["verdict"]["verdict"] == "paid_off" and s["verdict"]["fxgraph_hits"] == 1
    text = cli(env, "status").stdout
    assert f"{NAME} [{SHAPE}]" in text and "180.0 kB" in text and "paid_off" in text
    assert "0 in place, 1 changed, 1 missing" in text


def test_a_verdict_about_other_versions_is_not_recorded(tmp_path):
    report = RestoreReport(hit=True, name=NAME, shape=SHAPE, versions=[7])
    assert not record_verdict(str(tmp_path), judge(report, str(tmp_path), {"fxgraph_hits": 1}))


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_ls_and_stats_show_the_services_keys_versions_and_totals(live_server, client, tokens, tmp_path):
    first = publish(client, {"a": b"1" * 5000, "b": b"2" * 3000}, key(NAME, SHAPE))
    publish(client, {"a": b"1" * 5000, "c": b"3" * 1000}, key(NAME, SHAPE), merge=False)
    publish(client, {"x": b"x" * 20000}, key(NAME, "f32[4,256]"))
    publish(client, {"y": b"y" * 100}, key("ranker", SHAPE, tags={"mode": "max"}))
    for k in (key(NAME, SHAPE), key(NAME, SHAPE), key("absent", SHAPE)):
        client.get("/api/v1/resolve", query_string={**k["env"], "name": k["name"], "shape": k["shape"], "tags": "{}"})
    assert client.post("/api/v1/verdicts", json={"versions": [first["version"]["id"]], "verdict": "no_hits"}
                       ).status_code == 200
    env = {**container(tmp_path), "CACHESVC_URL": live_server.url, "CACHESVC_TOKEN": tokens["read"]}

    listing = json.loads(cli(env, "ls", "--json").stdout)
    assert listing["total"] == 3 and listing["shown"] == 3
    assert {(e["name"], e["shape"]) for e in listing["entries"]} == {(NAME, SHAPE), (NAME, "f32[4,256]"),
                                                                     ("ranker", SHAPE)}
    assert json.loads(cli(env, "ls", "--json", "--name", NAME).stdout)["total"] == 2
    [ranker] = json.loads(cli(env, "ls", "--json", "--tag", "mode=max").stdout)["entries"]
    assert ranker["name"] == "ranker"
    one = cli(env, "ls", "--limit", "1")
    assert one.returncode == 0 and one.stdout.splitlines()[-1] == "1 of 3 entries (2 more: --limit 0 shows all)"
    text = cli(env, "ls").stdout.splitlines()
    assert text[0].split()[:3] == ["ID", "NAME", "SHAPE"] and text[-1] == "3 of 3 entries"
    assert "6.0 kB" in text[1] + text[2] + text[3] and "20.0 kB" in "\n".join(text)

    versions = json.loads(cli(env, "ls", "-v", "--json", "--name", NAME, "--shape", SHAPE).stdout)
    [entry] = versions["entries"]
    rows = {v["id"]: v for v in entry["versions_detail"]}
    assert rows[first["version"]["id"]]["hit_rate"] == 0.0 and rows[first["version"]["id"]]["problem"]
    assert "files" not in rows[first["version"]["id"]]
    table = cli(env, "ls", "-v", "--name", NAME, "--shape", SHAPE).stdout
    assert "HIT RATE" in table and "0.0% problem" in table

    got = json.loads(cli(env, "stats", "--json").stdout)
    assert got == client.get("/api/v1/stats?days=7").json
    # two resolves found a version, one did not; the one verdict said the restore got no cache hits
    assert (got["entries"], got["restores"], got["misses"], got["hits"]) == (3, 2, 1, 0)
    stats = cli(env, "stats").stdout
    assert re.search(r"restore rate\s+66.7%", stats) and re.search(r"hit rate \(verdicts\)\s+0.0%", stats)
    assert "dedup ratio" in stats and "kB" in stats


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_ls_pages_through_every_entry(live_server, client, tokens):
    from cachesvc_client.cli import inventory
    from cachesvc_client.transport import ServiceAPI

    for i in range(7):
        publish(client, {"f": bytes([i]) * 10}, key(f"m{i}", SHAPE))
    api = ServiceAPI(live_server.url, tokens["read"], timeout=30)
    everything = inventory.list_entries(api, {}, limit=0, versions=False, page=2)
    assert everything["total"] == 7 and sorted(e["name"] for e in everything["entries"]) == [f"m{i}" for i in range(7)]
    assert inventory.list_entries(api, {}, limit=5, versions=False, page=2)["shown"] == 5


def test_ls_and_stats_against_no_service_fail_in_one_line(tmp_path):
    env = {**container(tmp_path), "CACHESVC_URL": "http://127.0.0.1:9"}
    for command in ("ls", "stats"):
        out = cli(env, command, "--timeout", "1")
        assert out.returncode == 1, out
        assert one_line(out.stderr).startswith(f"cachesvc-client {command}: error: ")


@pytest.mark.parametrize("record", [b"[1, 2]", b"{not json", json.dumps({"versions": [3], "files": {"inductor/a": 7},
                                                                       "roots": "x"}).encode()])
def test_status_of_a_damaged_record_is_no_crash(tmp_path, record):
    env = container(tmp_path)
    state = Path(env["TORCHINDUCTOR_CACHE_DIR"]) / ".cachesvc"
    state.mkdir(parents=True)
    (state / "restored.json").write_bytes(record)
    for args in (["status"], ["status", "--json"]):
        out = cli(env, *args)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
