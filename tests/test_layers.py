"""The layers only look down (issue 29, item 1), read from the imports themselves (every import, those
inside functions too): storage knows bytes and keys only; no view reaches around the content door to
storage; errors.py imports nothing of the service above it."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Set

PACKAGE = Path(__file__).resolve().parent.parent / "cachesvc"

#: what storage must never import: the index and everything that knows it
ABOVE_STORAGE = ("cachesvc.index", "cachesvc.db", "cachesvc.models", "cachesvc.api", "cachesvc.browse",
                 "cachesvc.content", "cachesvc.errors", "cachesvc.publish", "cachesvc.resolve",
                 "cachesvc.lifecycle", "cachesvc.remote_cache", "cachesvc.app")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Set[str]:
    """Every module ``path`` imports, relative imports resolved, and ``from X import y`` read as both X
    and X.y (y may be a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def modules(folder: str) -> Iterator[Path]:
    yield from sorted((PACKAGE / folder).rglob("*.py"))


def reaches(names: Set[str], prefixes) -> Set[str]:
    return {n for n in names for p in prefixes if n == p or n.startswith(p + ".")}


def test_imports_are_read_right():
    assert "cachesvc.content" in imported(PACKAGE / "api" / "blobs.py")
    assert "cachesvc.storage.decoding" in imported(PACKAGE / "content" / "blobs.py")
    assert "cachesvc.storage" in imported(PACKAGE / "content" / "reading.py")


def test_storage_imports_nothing_that_knows_the_index():
    found = {str(p.relative_to(PACKAGE)): sorted(reaches(imported(p), ABOVE_STORAGE)) for p in modules("storage")}
    assert {p: names for p, names in found.items() if names} == {}


def test_no_view_imports_storage():
    found = {str(p.relative_to(PACKAGE)): sorted(reaches(imported(p), ["cachesvc.storage"]))
             for folder in ("api", "browse") for p in modules(folder)}
    assert {p: names for p, names in found.items() if names} == {}, "views call the content door (cachesvc.content)"


def test_errors_imports_no_layer_of_the_service():
    assert sorted(n for n in imported(PACKAGE / "errors.py") if n.startswith("cachesvc.")) == []
