"""The service image's steps, replayed here: NOT the real image. There is no container engine on this
machine kind (no Docker daemon can run in it), so `docker build` cannot run; what the Dockerfile does is
read with dockerfile-parse, as docker reads it, and done step by step in a folder standing for the image's
filesystem (``/opt/cachesvc`` is ``<root>/opt/cachesvc``, and so on):

build stage   its ENV; ``RUN python -m venv /opt/cachesvc``; WORKDIR; its COPYs from the build context
              (a clean copy of the tree, tests/shipped.py's, less what .dockerignore keeps out); and
              ``RUN /opt/cachesvc/bin/pip install '.[server]'``: the same command line, run by bash
final stage   the user and its data folder made as its RUN lines make them (uid, gid, home, mode 0750),
              ``COPY --from=build`` (the venv is made at its final path: a venv cannot move), its ENV
              (PATH, CACHESVC_DATA_DIR, CACHESVC_SERVE_PROXY: nginx in front), USER, WORKDIR, and
              ENTRYPOINT + CMD (``Image.argv``), the HEALTHCHECK's command too

What differs from a real build and run, and why:

* ``python``: this suite's base interpreter (3.11, as the image's ``python:3.11`` base), first on PATH.
* The dependencies: the image's pip fetches them from PyPI. Here the server extra's requirements are
  this suite's installed copies, put on the new venv's path before its pip command runs
  (tests/shipped.py's links), so that pip finds them installed and builds and installs the project
  alone, offline. The project itself is built by that pip from the copied sources, with build isolation.
* ``apt-get install nginx-light``: this machine's nginx, the same Debian package (.ci/run installs it).
* The user: run as root, every program runs as the image's uid and gid (``setpriv``) with one
  capability, CAP_DAC_READ_SEARCH: this machine's Python lives under /root (mode 0700), so without it
  uid 10001 could not start Python at all. It reads and searches, never writes: every file the service
  writes must lie where the image's user owns it (its data folder, HOME, TMPDIR). The image's own folder
  must be reachable without it (mode 0755, as an image's / is): ``access(2)``, which alembic asks of the
  migrations folder, drops capabilities. Run by another user, or where setpriv cannot set that
  capability, the programs run as the user running the tests (``Image.user`` is then None).
* HOME and TMPDIR: docker gives HOME from /etc/passwd (``/home/cachesvc``, mapped); TMPDIR, which the
  image leaves unset (/tmp), gets a folder of its own, as every simulated container here does.
* The port: the CMD's 8787 is given as a free port (``Image.argv``).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import extract_key_values
from docker.utils.build import exclude_paths

from tests import shipped

ROOT = shipped.ROOT
#: the base image's PATH (python:3.11-slim's)
BASE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
#: a capability that lets the image's user read this machine's Python and pytest's 0700 folders (docstring)
READ_ANYWHERE = ["--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]


def stages(dockerfile: Path = ROOT / "Dockerfile") -> List[List[dict]]:
    """The Dockerfile's instructions, one list per stage (FROM first), comments left out."""
    found: List[List[dict]] = []
    for ins in DockerfileParser(str(dockerfile)).structure:
        if ins["instruction"] == "FROM":
            found.append([])
        if found and ins["instruction"] != "COMMENT":
            found[-1].append(ins)
    return found


@dataclass
class Image:
    root: Path                                   # the image's filesystem, mapped
    env: Dict[str, str] = field(default_factory=dict)
    workdir: Path = Path("/")
    user: Optional[Tuple[int, int]] = None       # the uid and gid its programs run as; None: this user
    entrypoint: List[str] = field(default_factory=list)
    cmd: List[str] = field(default_factory=list)
    healthcheck: List[str] = field(default_factory=list)

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    def mapped(self, text: str) -> str:
        """``text`` with each absolute path of the image's own folders mapped under ``root``."""
        return re.sub(r"(?<![\w./-])(/(?:opt|src|var|home|usr/local)\b[^\s:'\"]*)",
                      lambda m: str(self.path(m.group(1))), text)

    def as_user(self, command: List[str], port: int = 8787) -> List[str]:
        """``command`` as the image runs it: as its user, the image's 8787 given as ``port``."""
        command = [a.replace("8787", str(port)) for a in command]
        if self.user is None:
            return command
        uid, gid = self.user
        return ["setpriv", "--reuid", str(uid), "--regid", str(gid), "--clear-groups", *READ_ANYWHERE, *command]

    def argv(self, args: List[str], port: int = 8787) -> List[str]:
        """``docker run <image> args...``: the ENTRYPOINT with ``args`` (the CMD's, for a bare run)."""
        return self.as_user(self.entrypoint + list(args), port)

    def run(self, args: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(args), env=env or self.env, cwd=self.workdir, capture_output=True, text=True,
                              timeout=timeout)


def replay(root: Path) -> Image:
    """Build the image's steps under ``root`` (module docstring); the image, ready to run."""
    build, final = stages()
    image = Image(root)
    context = root / "context"
    shipped.clean_copy(context)
    _base(image)
    _replay_build(image, build, context)
    _replay_final(image, final)
    return image


def _base(image: Image) -> None:
    """What the base image gives: its python first on PATH, a clean locale; and this machine's pip
    configuration (PIP_*: where its index and wheels are), as a build machine has its own."""
    bin_dir = image.path("/usr/local/bin")
    bin_dir.mkdir(parents=True)
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(getattr(sys, "_base_executable", sys.executable))
    image.env = shipped.bare_env(image.root / "build-stage", **{k: v for k, v in os.environ.items()
                                                                 if k.startswith("PIP_")})
    image.env["PATH"] = image.mapped(BASE_PATH)


def _replay_build(image: Image, build: List[dict], context: Path) -> None:
    kept = exclude_paths(str(context), [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                                        if line.strip() and not line.startswith("#")])
    for ins in build[1:]:
        kind, value = ins["instruction"], ins["value"]
        if kind == "ENV":
            image.env.update(extract_key_values(True, {}, image.env, value))
        elif kind == "WORKDIR":
            image.workdir = image.path(value)
            image.workdir.mkdir(parents=True, exist_ok=True)
        elif kind == "COPY":
            _copy(shlex.split(value), context, kept, image.workdir, image)
        elif kind == "RUN":
            _dependencies_for_pip(image)
            done = subprocess.run(["bash", "-c", image.mapped(value)], env=image.env, cwd=image.workdir,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"RUN {value}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        else:
            raise AssertionError(f"the replay does not know the build stage's {kind} {value}: teach it")


def _copy(words: List[str], context: Path, kept: set, workdir: Path, image: Image) -> None:
    """docker's COPY of sources from the context: a folder's contents, a file into the destination."""
    *sources, dest = words
    target = Path(image.mapped(dest)) if dest.startswith("/") else workdir / dest
    for src in sources:
        files = [p for p in kept if (p == src or p.startswith(src.rstrip("/") + "/")) and (context / p).is_file()]
        assert files, f"COPY {src}: nothing in the build context"
        for rel in files:
            inside = Path(rel).name if rel == src else os.path.relpath(rel, src)
            out = (target / inside) if (dest.endswith("/") or len(sources) > 1 or rel != src) else target
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(context / rel, out)


def _dependencies_for_pip(image: Image) -> None:
    """Once the image's venv exists: the server extra's requirements on its path (module docstring)."""
    venv = shipped.Venv(image.path("/opt/cachesvc"))
    if venv.python.exists() and not (image.root / "deps").exists():
        wheel_requires = shipped.wheel_metadata(shipped.built().wheel).get_all("Requires-Dist") or []
        shipped.add_dependencies(venv, shipped.requirement_closure(wheel_requires, ["server"]), image.root / "deps")


def _replay_final(image: Image, final: List[dict]) -> None:
    runs = " ".join(ins["value"] for ins in final if ins["instruction"] == "RUN")
    assert "nginx-light" in runs and (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")), \
        "the image installs nginx-light: install it here too (apt-get install nginx-light, as .ci/run does)"
    uid, home = re.search(r"useradd .*--uid (\d+) .*--home-dir (\S+) --create-home", runs).groups()
    mode, data = re.search(r"install -d -o \S+ -g \S+ -m (\d+) (\S+)", runs).groups()
    env = {k: image.env[k] for k in ("PATH", "LANG")}  # a new stage: the base image's environment only
    for ins in final[1:]:
        kind, value = ins["instruction"], ins["value"]
        if kind == "ENV":
            env.update(extract_key_values(True, {}, env, value))
        elif kind == "USER":
            image.user = tuple(int(x) for x in value.split(":"))
        elif kind == "WORKDIR":
            image.workdir = image.path(value)
        elif kind == "COPY":
            src, dest = value.split()[-2:]
            assert "--from=build" in value and src == dest, f"COPY {value}: the replay keeps the venv where it was made"
        elif kind in ("ENTRYPOINT", "CMD"):
            setattr(image, kind.lower(), json.loads(value))
        elif kind == "HEALTHCHECK":
            image.healthcheck = json.loads(value.split("CMD", 1)[1])
    image.env = {k: image.mapped(v) for k, v in env.items()}
    image.env.update(HOME=str(image.path(home)), TMPDIR=str(image.root / "tmp"))
    owned = [image.path(home), image.path(data), image.root / "tmp"]
    for folder in owned:
        folder.mkdir(parents=True, exist_ok=True)
    image.path(data).chmod(int(mode, 8))
    if os.geteuid() == 0 and _can_run_as(int(uid)):
        for folder in owned:
            os.chown(folder, image.user[0], image.user[1])
    else:
        image.user = None


def _can_run_as(uid: int) -> bool:
    probe = subprocess.run(["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", *READ_ANYWHERE,
                            sys.executable, "-c", "import os; print(os.getuid())"], capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip() == str(uid)
