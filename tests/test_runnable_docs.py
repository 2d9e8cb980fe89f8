"""The shell commands the README and docs/operations.md mark as runnable work, as a new user runs them:
taken from the pages themselves, run in order in a fresh empty folder with an empty environment
(its own HOME and TMPDIR, PATH to the venv only, no CACHESVC_*).

Marks: a ``<!-- runnable -->`` line right before a ```bash block runs it; a ``<!-- not runnable...`` line
says why one does not. Every bash block carries one of the two, so a new block cannot escape the test.
What the harness changes, and only that: ``cachesvc serve`` starts in the background (on a free port
instead of 8787, which every other mention of 8787 then names; the next line runs once /healthz
answers); ``pip install`` lines are skipped (the venv the test runs from has that install; the light
install is tests/service/test_light_install.py's). The script stops the service at the end.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from harness.service import free_port

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/operations.md")
RUNNABLE = "<!-- runnable -->"
_BLOCK = re.compile(r"(<!--[^\n]*-->\n)?```bash\n(.*?)```", re.S)

WAIT = r'''wait_for_service() {
  python - "$1" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 120
while True:
    try:
        if urllib.request.urlopen(sys.argv[1] + "/healthz", timeout=2).status == 200:
            break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("cachesvc serve did not answer /healthz within 120 s")
        time.sleep(0.3)
PY
}
'''


def blocks(page: str) -> List[str]:
    """The runnable bash blocks of ``page``; fails on a bash block that is marked neither way."""
    found = []
    for mark, body in _BLOCK.findall((ROOT / page).read_text()):
        assert mark.startswith(("<!-- runnable", "<!-- not runnable")), \
            f"{page}: a bash block without <!-- runnable --> or <!-- not runnable: why -->:\n{body}"
        if mark.strip() == RUNNABLE:
            found.append(body)
    return found


def script(bodies: List[str], port: int) -> str:
    """One bash script of the blocks' lines, with the harness's changes (module docstring)."""
    lines = ["set -euo pipefail -x", WAIT, "trap 'if [[ -n ${SERVE_PID:-} ]]; then kill $SERVE_PID; wait $SERVE_PID || true; fi' EXIT"]
    for body in bodies:
        for line in body.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command.startswith("pip install"):
                lines.append(f"# skipped: {command}")
            elif re.match(r"cachesvc serve\b", command):
                command = command.replace("8787", str(port))
                if "--port" not in command:
                    command += f" --port {port}"
                lines += [f"{command} > serve.log 2>&1 &", "SERVE_PID=$!",
                          f"wait_for_service http://127.0.0.1:{port}"]
            else:
                lines.append(line.replace("8787", str(port)))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("page", PAGES)
def test_the_commands_a_page_marks_runnable_work_from_an_empty_folder(page, tmp_path):
    bodies = blocks(page)
    assert bodies, f"{page} marks no command as runnable"
    work, home, tmp = tmp_path / "work", tmp_path / "home", tmp_path / "tmp"
    for d in (work, home, tmp):
        d.mkdir()
    (tmp_path / "commands.sh").write_text(script(bodies, free_port()))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp),
           "LANG": "C.UTF-8"}
    ran = subprocess.run(["bash", str(tmp_path / "commands.sh")], cwd=work, env=env, capture_output=True,
                         text=True, timeout=600)
    serve_log = (work / "serve.log").read_text() if (work / "serve.log").exists() else ""
    said = ran.stdout + ran.stderr + serve_log
    assert ran.returncode == 0, f"{page}: a command failed:\n{ran.stderr[-4000:]}\n--- serve.log\n{serve_log[-2000:]}"
    assert "Traceback" not in said, said[-4000:]
    assert (work / "cachesvc-data" / "cachesvc.db").is_file(), "the embedded default lives in ./cachesvc-data"
    assert not list(tmp.glob("cachesvc-serve-*")), "the stopped serve left its run folder behind"


def test_the_harness_fails_on_a_failing_command_and_runs_serve_in_the_background(tmp_path):
    text = script(["cachesvc serve   # port 8787\ncurl http://localhost:8787/x\nfalse\n"], 4242)
    assert "cachesvc serve --port 4242 > serve.log 2>&1 &" in text and "wait_for_service http://127.0.0.1:4242" in text
    assert "curl http://localhost:4242/x" in text
    ran = subprocess.run(["bash", "-c", text.replace("cachesvc serve --port 4242 > serve.log 2>&1 &", "true")
                          .replace("wait_for_service http://127.0.0.1:4242", "true")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0
