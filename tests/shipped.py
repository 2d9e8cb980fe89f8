"""What ships, built once per test run and installed the way users install it.

    built()      the sdist and the wheel of a clean copy of the tree, and the wheel the sdist rebuilds
    venv(kind)   a fresh venv outside the checkout with that wheel installed, not editable:
                 "server" (``cachesvc[server]``), "light" (``cachesvc``: the client alone, no torch),
                 "torch" (``cachesvc[server]`` and torch, for the end-to-end runs)
    bare_env()   a process environment in which nothing of the checkout can be imported

The rest of the suite imports the editable checkout, which hides a folder, a data file or an entry
point the wheel lacks (issue 37: ``cachesvc.content`` was missing from the wheel and every server
command failed from the image). The tests of tests/test_wheel.py, tests/deploy/test_installed.py, the
image's replayed steps and the end-to-end runs from the wheel use these instead.

**Once per run.** The run's folder is made by the first process that imports this (pytest's
controller, before xdist starts its workers, which inherit its path through ``TEST_RUN_SHIPPED_DIR``)
and removed at that process's exit, as tests/compiler_cache.py's is. The first process that needs an
artifact makes it under a file lock in that folder; the others wait on the lock and reuse it. A
failed build is recorded there too, so every test that needs it fails with its output at once.

**A clean copy, as CI's clone is.** The build reads a copy of the files git would commit from the
working tree (tracked and untracked-but-not-ignored, as ``git ls-files`` lists them, deleted ones
left out): no ``.venv``, ``build/``, ``*.egg-info`` or ``__pycache__`` can make a build pass. The
sdist and the wheel are built by ``python -m build`` in isolated environments (setuptools from the
configured index, as every ``pip install .`` does), and the sdist is built again into a wheel.

**Dependencies without a network.** A venv gets the project by ``pip install --no-index <wheel>[extra]``
(a real install: pip reads the wheel's requirements and finds each installed). The requirements are
this suite venv's installed copies: the closure of what the wheel's METADATA requires (for its extra),
each distribution's top-level files and ``.dist-info`` linked into one folder that a ``.pth`` puts on
the new venv's path. ``python -m venv --system-site-packages`` would not do: this venv holds the
editable cachesvc. The links name exactly the closure, so a requirement the wheel forgot to declare
is missing there, as it would be on a user's machine; no ``.pth`` of this venv (the editable finder's)
is processed in the new one.
"""
from __future__ import annotations

import atexit
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Optional, Set

ROOT = Path(__file__).resolve().parent.parent
#: set by the process that made the run's folder; not CACHESVC_*, which the tests' services drop
RUN_DIR = "TEST_RUN_SHIPPED_DIR"
#: what a fresh container's environment passes on (harness.containers.PASSED) and a clean locale
_PASSED = ("TORCHINDUCTOR_VEC_ISA_OK", "TEST_RUN_CCACHE_DIR")
#: minutes one build or install may take on a loaded 2-core machine
_TIMEOUT = 600
#: the distributions each kind of venv adds to the wheel's own requirements (its extras, then these)
KINDS = {"server": (("server",), ()), "light": ((), ()), "torch": (("server",), ("torch",))}


def enable() -> Path:
    """This run's folder (made here, and removed at exit, by the first process of the run)."""
    run = os.environ.get(RUN_DIR)
    if not run:
        run = tempfile.mkdtemp(prefix="cachesvc-test-shipped-")
        os.environ[RUN_DIR] = run
        atexit.register(shutil.rmtree, run, True)
    return Path(run)


def _once(name: str, make) -> Path:
    """``<run>/<name>``, made by ``make(folder)`` by the first process that asks, under a file lock."""
    from filelock import FileLock

    run = enable()
    folder, done, failed = run / name, run / f"{name}.done", run / f"{name}.failed"
    with FileLock(str(run / f"{name}.lock"), timeout=2 * _TIMEOUT):
        if failed.exists():
            raise RuntimeError(f"{name} could not be made earlier in this run:\n{failed.read_text()}")
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except Exception as exc:
                failed.write_text(f"{type(exc).__name__}: {exc}")
                raise
            done.touch()
    return folder


def _run(argv: List[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT, **kw)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                           f"{done.stderr[-4000:]}")
    return done


# -- the clean copy and the build -------------------------------------------------------------------

def tracked_files(root: Path = ROOT) -> List[str]:
    """The files of the working tree that a commit would hold: tracked and untracked-not-ignored, present."""
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root).stdout
    return sorted({p for p in listed.split("\0") if p and (root / p).is_file()})


def clean_copy(dest: Path, root: Path = ROOT) -> Path:
    """Copy the files of ``tracked_files`` to ``dest`` (modes kept); ``dest``."""
    for rel in tracked_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target, follow_symlinks=False)
    return dest


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path      # built from the tree, as `pip install .` and the image build it
    rebuilt: Path    # built from the sdist
    log: str         # both builds' output (a warning in it is a build that is not quiet)


def built() -> Built:
    """The run's sdist and wheels (made once; see the module docstring)."""
    folder = _once("dist", _build)
    [sdist] = folder.glob("cachesvc-*.tar.gz")
    [wheel] = folder.glob("cachesvc-*.whl")
    [rebuilt] = (folder / "from-sdist").glob("cachesvc-*.whl")
    return Built(sdist, wheel, rebuilt, (folder / "build.log").read_text())


def _build(folder: Path) -> None:
    src = clean_copy(folder / "src")
    out = _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(folder), str(src)])
    [sdist] = folder.glob("cachesvc-*.tar.gz")
    again = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(folder / "from-sdist"),
                  str(sdist)])
    (folder / "build.log").write_text(out.stdout + out.stderr + again.stdout + again.stderr)
    shutil.rmtree(src)  # the sdist holds it; nothing should read the copy after the build


def wheel_files(wheel: Path) -> Set[str]:
    """The files a wheel installs (its .dist-info left out)."""
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}


def wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(name).decode())


# -- venvs ----------------------------------------------------------------------------------------

def requirement_closure(requires: Iterable[str], extras: Iterable[str] = ()) -> Set[str]:
    """Installed distributions that ``requires`` (Requires-Dist lines, with ``extras`` asked for) brings,
    recursively, with the extras each requirement names; raises PackageNotFoundError for one not installed."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: Dict[str, FrozenSet[str]] = {}
    todo = [(list(requires), frozenset(extras))]
    while todo:
        lines, wanted = todo.pop()
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
                continue
            name, asked = canonicalize_name(req.name), frozenset(req.extras)
            if name in seen and asked <= seen[name]:
                continue
            seen[name] = seen.get(name, frozenset()) | asked
            todo.append((md.requires(req.name) or [], seen[name]))
    return set(seen)


def link_distributions(names: Iterable[str], folder: Path) -> None:
    """Link each installed distribution's top-level files (packages, modules, .dist-info) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(names):
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or () if ".." not in Path(str(f)).parts}
        for top in sorted(tops - {"__pycache__"}):
            source = Path(dist.locate_file(top))
            if top.endswith(".pth") or not source.exists() or (folder / top).exists():
                continue
            (folder / top).symlink_to(source)


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"


def new_venv(path: Path, with_pip: bool = False) -> Venv:
    """A fresh venv of this interpreter's base Python (``venv`` from inside a venv uses the base)."""
    _run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)])
    return Venv(path)


def purelib(venv: Venv) -> Path:
    return Path(_run([str(venv.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())


def add_dependencies(venv: Venv, names: Iterable[str], folder: Path) -> None:
    """Make ``names`` (installed here) importable in ``venv``: linked into ``folder``, put on its path by a .pth."""
    link_distributions(names, folder)
    (purelib(venv) / "cachesvc-test-deps.pth").write_text(f"{folder}\n")


def venv(kind: str) -> Venv:
    """The run's venv of ``kind`` (KINDS), made once: the wheel installed by pip, not editable."""
    extras, more = KINDS[kind]
    return Venv(_once(f"venv-{kind}", lambda folder: _make_venv(folder, extras, more)) / "venv")


def _make_venv(folder: Path, extras, more) -> None:
    wheel = built().wheel
    env = new_venv(folder / "venv")
    requires = wheel_metadata(wheel).get_all("Requires-Dist") or []
    add_dependencies(env, requirement_closure(requires + list(more), extras), folder / "deps")
    spec = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    _run([sys.executable, "-m", "pip", "--python", str(env.python), "install", "-q", "--no-index", spec],
         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def bare_env(folder: Path, venv: Optional[Venv] = None, **extra: str) -> Dict[str, str]:
    """A fresh container's environment for a program of ``venv``: its own HOME and TMPDIR under ``folder``,
    PATH with the venv first and no folder of the checkout, no PYTHONPATH, no CACHESVC_* of the developer."""
    home, tmp = folder / "home", folder / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    path = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(ROOT)]
    env = {"PATH": os.pathsep.join(([str(venv.bin)] if venv else []) + path), "HOME": str(home), "TMPDIR": str(tmp),
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    env.update({name: os.environ[name] for name in _PASSED if name in os.environ})
    env.update(extra)
    return env


def imported_from(venv: Venv, modules: Iterable[str], env: Dict[str, str], cwd: Path) -> Dict[str, str]:
    """Where ``venv``'s Python imports each of ``modules`` from, run as ``env`` in ``cwd``."""
    code = "import importlib, json, sys\nprint(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))"
    return json.loads(_run([str(venv.python), "-c", code, *modules], env=env, cwd=cwd).stdout)


# -- transformers 4.x beside the suite's 5.x --------------------------------------------------------

#: the last 4.x, still what most deployments pin, with the hub and tokenizers it needs (its 5.x are the suite's)
TRANSFORMERS_4 = ("transformers==4.57.6", "huggingface_hub==0.36.2", "tokenizers==0.22.2")


def transformers_4() -> Path:
    """A folder holding transformers 4.57 (``pip install --target``, no dependencies beyond ``TRANSFORMERS_4``:
    the suite's venv has the rest), made once per run: put it first on a container's PYTHONPATH."""
    return _once("transformers-4", lambda folder: _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), *TRANSFORMERS_4]))
