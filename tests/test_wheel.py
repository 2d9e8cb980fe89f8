"""The wheel and the sdist, as built once per run from a clean copy of the tree (tests/shipped.py): every
module and data file of cachesvc/, client/ and migrations/ ships under its import name, the sdist
rebuilds the same wheel, the build says nothing, and a folder added to the tree ships without an edit of
pyproject.toml (issue 37: a hand-kept package list left cachesvc.content out of the wheel, and the editable
checkout the rest of the suite imports could not notice)."""
from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile

from tests import shipped

#: folder of the tree -> where its files land in the wheel (pyproject.toml's package-dir)
IMPORT_NAMES = {"cachesvc/": "cachesvc/", "client/": "cachesvc_client/", "migrations/": "cachesvc/migrations/"}


def shipped_name(rel: str) -> str:
    top = next(t for t in IMPORT_NAMES if rel.startswith(t))
    return IMPORT_NAMES[top] + rel[len(top):]


def test_the_wheel_holds_every_file_of_the_three_folders_and_nothing_else():
    expected = {shipped_name(p) for p in shipped.tracked_files() if p.startswith(tuple(IMPORT_NAMES))}
    got = shipped.wheel_files(shipped.built().wheel)
    assert not expected - got, f"missing from the wheel: {sorted(expected - got)}"
    assert not got - expected, f"in the wheel but not in the tree: {sorted(got - expected)}"
    assert {"cachesvc/content/__init__.py", "cachesvc/browse/templates/base.html", "cachesvc/browse/static/cachesvc.css",
            "cachesvc/api/static/swagger-init.js", "cachesvc/migrations/script.py.mako",
            "cachesvc_client/transport/__init__.py"} <= got


def test_the_sdist_rebuilds_the_same_wheel():
    made = shipped.built()
    assert shipped.wheel_files(made.rebuilt) == shipped.wheel_files(made.wheel)
    for name in ("entry_points.txt", "METADATA"):
        texts = []
        for wheel in (made.wheel, made.rebuilt):
            with zipfile.ZipFile(wheel) as z:
                texts.append(z.read(next(n for n in z.namelist() if n.endswith(f".dist-info/{name}"))))
        assert texts[0] == texts[1], name
    with tarfile.open(made.sdist) as sdist:
        names = {m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile()}
    wanted = {p for p in shipped.tracked_files() if p.startswith(tuple(IMPORT_NAMES))}
    assert not wanted - names, f"missing from the sdist: {sorted(wanted - names)}"
    assert {"pyproject.toml", "setup.py", "README.md"} <= names


def test_the_build_is_quiet():
    """No setuptools warning in either build: undeclared package data, a deprecated setting, a missing file."""
    log = shipped.built().log
    for said in ("absent from the `packages` configuration", "BuildBackendWarning", "SetuptoolsDeprecationWarning",
                 "warning: no files found", "_DeprecatedConfig"):
        assert said not in log, f"{said!r} in the build's output:\n{log[-4000:]}"


def test_the_wheel_declares_both_commands_and_the_client_dependencies_only():
    meta = shipped.wheel_metadata(shipped.built().wheel)
    plain = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert not [r for r in plain if r.split()[0].lower().startswith(("flask", "sqlalchemy", "torch", "gunicorn"))]
    with zipfile.ZipFile(shipped.built().wheel) as z:
        points = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
    assert "cachesvc = cachesvc.cli:main" in points and "cachesvc-client = cachesvc_client.cli:main" in points


def test_a_new_folder_ships_without_an_edit_of_pyproject(tmp_path):
    """New subfolders (a package under cachesvc/ and under client/, a data folder, a data file of a new kind)
    land in the wheel of a copy of the tree with pyproject.toml untouched."""
    src = shipped.clean_copy(tmp_path / "src")
    before = (src / "pyproject.toml").read_bytes()
    added = {
        "cachesvc/scratchpart/__init__.py": "", "cachesvc/scratchpart/deeper/__init__.py": "",
        "cachesvc/scratchpart/deeper/work.py": "X = 1\n",
        "client/scratchpart/__init__.py": "", "client/scratchpart/work.py": "X = 1\n",
        "cachesvc/browse/scratchdata/page.html": "<p>x</p>\n", "cachesvc/browse/static/icon.svg": "<svg/>\n",
    }
    for rel, text in added.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    # this venv's setuptools, no isolation: the discovery is what is tested, and the run's build uses isolation
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                           "-w", str(tmp_path / "out"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (src / "pyproject.toml").read_bytes() == before
    [wheel] = (tmp_path / "out").glob("cachesvc-*.whl")
    got = shipped.wheel_files(wheel)
    assert {shipped_name(rel) for rel in added} <= got, sorted({shipped_name(rel) for rel in added} - got)
