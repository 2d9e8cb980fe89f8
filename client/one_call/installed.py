"""Which code belongs to an installed distribution, and that distribution's ``name==version``.

The key (identity.py) follows the deploy's own code and keys an installed library's by its version
instead: transformers' BERT reaches 8 s of its library when followed, and a library's version names its
code. Installed means a file under site-packages (dist-packages), or in a folder that holds the
distribution's metadata (``pip install --target``, as GPU images vendor libraries). Every reader here runs
at a restart's ``compile()``, so each reads only what it needs: the few .dist-info folders concerned, and
those as text.
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Set

#: where pip puts installed distributions: their code is keyed by version, not followed
INSTALLED_DIRS = frozenset({"site-packages", "dist-packages"})


@functools.lru_cache(maxsize=4096)
def installed_file(file: Optional[str]) -> bool:
    """Whether ``file`` is an installed distribution's; unknown (None) is not (its code is followed)."""
    if file is None:
        return False
    path = Path(file)
    return not INSTALLED_DIRS.isdisjoint(path.parts) or _in_distribution_root(path)


def _in_distribution_root(path: Path) -> bool:
    """Whether ``path`` is in a top-level package that a distribution declares, in the folder that holds that
    distribution's metadata: code installed outside a site-packages folder (``pip install --target /opt/libs``
    with PYTHONPATH, as GPU images vendor libraries). Followed instead, its walk reached module-level values
    made anew in every process (transformers' telemetry SESSION_ID, a uuid4): the key changed at every start
    and nothing ever hit. Only a name declared by a distribution whose metadata is in that very folder: the
    deploy's own ``models/`` beside a vendored library is followed, even where a distribution elsewhere
    declares a ``models`` too (keyed by that one's version, a changed model would be the same key)."""
    for parent in path.parents:
        names = _distribution_root(parent)
        if names is not None:
            return Path(path.relative_to(parent).parts[0]).stem in names
    return False


@functools.lru_cache(maxsize=4096)
def _distribution_root(folder: Path) -> Optional[frozenset]:
    """The top-level names the distributions whose metadata (.dist-info) is in ``folder`` declare; None when
    none is there. Per folder, on demand: reading every installed distribution's metadata to find the few
    folders that hold any was most of the key at every ``compile()`` of a model in the deploy's own files."""
    try:
        if not any(entry.name.endswith(".dist-info") for entry in os.scandir(folder)):
            return None
    except OSError:
        return None
    names: Set[str] = set()
    for dist in importlib.metadata.distributions(path=[str(folder)]):
        names.update(_top_levels(dist))
    return frozenset(names)


def _top_levels(dist: importlib.metadata.Distribution) -> Set[str]:
    """The importable top-level names ``dist`` declares (top_level.txt), else those of its files (RECORD),
    as importlib.metadata.packages_distributions reads them. RECORD's first column is read as text: ``dist.files``
    makes a path object of every line (transformers: 1,555 of them, 33 ms of a restart's key)."""
    declared = (dist.read_text("top_level.txt") or "").split()
    if declared:
        return set(declared)
    record = dist.read_text("RECORD")
    if record is None:  # an egg-info's installed-files.txt or SOURCES.txt: importlib's own reader
        paths = [f.parts for f in dist.files or () if f.parts]
    else:
        paths = [(line.rsplit(",", 2)[0].strip('"') if line.count(",") >= 2 else line).split("/", 1)
                 for line in record.splitlines()]
    names = {parts[0] if len(parts) > 1 else Path(parts[0]).stem for parts in paths}
    return {name for name in names if name and "." not in name}


def _name_version(dist: importlib.metadata.Distribution) -> str:
    """``Name==Version`` from the metadata's header lines, which end at its first blank line. ``dist.metadata``
    parses the whole file as an e-mail, long description included (transformers': 6 ms a distribution)."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    fields = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in fields:
            fields[key] = value.strip()
    if len(fields) < 2:  # not the usual layout: the parser's answer
        return f"{dist.metadata['Name']}=={dist.version}"
    return f"{fields['Name']}=={fields['Version']}"


def installed(module_name: str, target: Any = None) -> bool:
    """Whether the code comes from an installed distribution's file; unknown is not (it is followed)."""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if file is None:  # a module no longer in sys.modules: the function's own file
        file = getattr(getattr(target, "__code__", None), "co_filename", None)
    return installed_file(file)


@functools.lru_cache(maxsize=1)
def _distributions() -> dict:
    return importlib.metadata.packages_distributions()


@functools.lru_cache(maxsize=None)
def versions(top: str) -> str:
    """The installed distributions that provide the top-level package ``top``, with their versions. The
    distribution of the same name first (transformers, numpy: one metadata file read), else every
    distribution's metadata (``packages_distributions``: 1-2 s over a venv of 200 of them, which was most
    of a transformers model's key at every ``compile()``)."""
    try:
        dist = importlib.metadata.distribution(top)
        if top in _top_levels(dist):
            return _name_version(dist)
    except (importlib.metadata.PackageNotFoundError, ValueError, OSError):
        pass
    named = _named_after(top)  # a namespace package's distributions: opentelemetry-api, -sdk (0.19 s saved)
    if named:
        return ",".join(named)
    found = []
    for dist in sorted(set(_distributions().get(top, ()))):
        try:
            found.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist}==?")
    return ",".join(found) or "-"


def _named_after(top: str) -> List[str]:
    """``name==version`` of the distributions on sys.path whose names start with ``top`` (``opentelemetry_api``
    for ``opentelemetry``) and that declare it, sorted: read from those few .dist-info folders, not every one."""
    want = top.lower().replace("-", "_").replace(".", "_")
    found: Set[str] = set()
    for entry in sys.path:
        try:
            names = [e.name for e in os.scandir(entry or ".") if e.name.endswith(".dist-info")]
        except OSError:
            continue
        for name in names:
            stem = name[: -len(".dist-info")].split("-", 1)[0].lower().replace(".", "_")
            if stem != want and not stem.startswith(want + "_"):
                continue
            dist = importlib.metadata.PathDistribution(Path(entry or ".") / name)
            try:
                if top in _top_levels(dist):
                    found.add(_name_version(dist))
            except (ValueError, OSError, TypeError):
                continue
    return sorted(found)
