"""The layers only look down (issue 29, item 1; issue 40), read from the imports themselves (every import,
those inside functions too): storage knows bytes and keys only; no view reaches around the content door to
storage, and no service (publish, resolve, lifecycle, the remote cache) either, but for storage's types;
the API and the pages never import each other (they share ``cachesvc.readmodel`` and
``cachesvc.services``); errors.py imports nothing of the service above it; and the service imports of the
client package only the shared stdlib rules (``SHARED_CLIENT_MODULES``)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Set

PACKAGE = Path(__file__).resolve().parent.parent / "cachesvc"

#: what storage must never import: the index and everything that knows it
ABOVE_STORAGE = ("cachesvc.index", "cachesvc.db", "cachesvc.models", "cachesvc.api", "cachesvc.browse",
                 "cachesvc.content", "cachesvc.errors", "cachesvc.publish", "cachesvc.resolve",
                 "cachesvc.lifecycle", "cachesvc.remote_cache", "cachesvc.app", "cachesvc.readmodel",
                 "cachesvc.services", "cachesvc.demand")

#: the services that hold a store but go through the content door for its bytes: of storage they import
#: its types module only (the Storage they hand on, StorageError)
SERVICES = ("publish", "resolve", "lifecycle", "remote_cache.py")
STORAGE_TYPES = "cachesvc.storage.types"

#: the client's modules the service may import: its shared, stdlib-only rules (the client's __init__
#: imports lazily, so importing one loads no other part of the client)
SHARED_CLIENT_MODULES = ("cachesvc_client.shared.keys", "cachesvc_client.shared.rules",
                         "cachesvc_client.shared.signing", "cachesvc_client.shared.units")


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
    """Every module of the room ``folder`` (a package folder, or one module's file name)."""
    if folder.endswith(".py"):
        yield PACKAGE / folder
    else:
        yield from sorted((PACKAGE / folder).rglob("*.py"))


def client_modules(path: Path) -> Set[str]:
    """The modules of the client package ``path`` imports: ``import a.b`` is a.b; ``from a import b`` is a.b
    where a is a package of the client that is not itself a shared module (b is then a module of it), else a."""
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "cachesvc_client")
        elif isinstance(node, ast.ImportFrom) and not node.level and \
                (node.module or "").split(".")[0] == "cachesvc_client":
            if node.module in SHARED_CLIENT_MODULES:
                out.add(node.module)
            else:
                out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


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


def test_services_import_only_the_types_of_storage():
    found = {str(p.relative_to(PACKAGE)): sorted(n for n in reaches(imported(p), ["cachesvc.storage"])
                                                 if n not in ("cachesvc.storage", STORAGE_TYPES)
                                                 and not n.startswith(STORAGE_TYPES + "."))
             for folder in SERVICES for p in modules(folder)}
    # "from ..storage.types import X" reads as cachesvc.storage too (X may be a module): the bare package is
    # allowed above only when it comes with .types; a "from ..storage import X" names cachesvc.storage.X
    bare = {str(p.relative_to(PACKAGE)) for folder in SERVICES for p in modules(folder)
            if "cachesvc.storage" in imported(p) and STORAGE_TYPES not in imported(p)}
    assert ({p: names for p, names in found.items() if names}, bare) == ({}, set()), \
        "bytes go through the content door (cachesvc.content); of storage only cachesvc.storage.types"


def test_the_demand_room_and_the_read_model_know_no_bytes_and_no_view():
    """They keep rows only: the demand's writes (``cachesvc.demand``) and what the views and pages read
    (``cachesvc.readmodel``) touch neither storage nor content, and call no view."""
    apart = ["cachesvc.storage", "cachesvc.content", "cachesvc.api", "cachesvc.browse"]
    found = {str(p.relative_to(PACKAGE)): sorted(reaches(imported(p), apart))
             for folder in ("demand", "readmodel") for p in modules(folder)}
    assert len(found) >= 6 and {p: names for p, names in found.items() if names} == {}


def test_the_api_and_the_pages_never_import_each_other():
    found = {str(p.relative_to(PACKAGE)): sorted(reaches(imported(p), [f"cachesvc.{other}"]))
             for folder, other in (("api", "browse"), ("browse", "api")) for p in modules(folder)}
    assert {p: names for p, names in found.items() if names} == {}, \
        "the rows both show are cachesvc.readmodel's, the app's parts cachesvc.services'"


def test_the_service_imports_only_the_shared_rules_of_the_client():
    read_right = {"cachesvc_client.shared.keys", "cachesvc_client.shared.signing"}
    assert client_modules(PACKAGE / "index.py") == read_right
    found = {str(p.relative_to(PACKAGE)): sorted(client_modules(p) - set(SHARED_CLIENT_MODULES))
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert {p: names for p, names in found.items() if names} == {}, \
        f"the service imports of cachesvc_client only {', '.join(SHARED_CLIENT_MODULES)}"


def test_errors_imports_no_layer_of_the_service():
    assert sorted(n for n in imported(PACKAGE / "errors.py") if n.startswith("cachesvc.")) == []
