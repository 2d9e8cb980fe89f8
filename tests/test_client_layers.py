"""The client's floors (issue 40), read from its imports (those inside functions too): every import in
``client/`` goes to its own room or a floor below, as docs/architecture.md ("The client, in rooms") draws
them; the shared rules import the standard library only; the one call reaches the service through
``CacheClient`` alone; every module and room at the top is on a floor, and there are at most 15 modules
there. A new room has to be placed here before it can be imported."""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Iterator, Optional

CLIENT = Path(__file__).resolve().parent.parent / "client"

#: room (a folder or a top-level module) -> floor; an import may go to its own room or a lower floor
FLOORS = {"cli": 9, "one_call": 9, "build": 9,                # the callers (build: through the one call)
          "client": 8, "remote_cache": 8, "check": 8,         # the doors
          "publish": 7, "restore": 7, "verdicts": 7,          # the two paths, what a restore paid off,
          "usage": 7,                                         # what the fleet served
          "onefile": 6,                                       # the one-file kinds, made and loaded
          "transport": 5,                                     # all HTTP
          "process": 4,                                       # this process and its host
          "codec": 3, "progress": 3, "report": 3,             # bytes; what the paths tell people
          "errors": 2, "answers": 2, "settings": 2,           # exceptions, checked answers, the environment
          "shared": 1}                                        # the rules the service imports too
#: what a room may take from the package's door (``__init__``): its version, a constant set before any import
FROM_THE_DOOR = {"cachesvc_client.__version__"}


def module_name(path: Path) -> str:
    parts = ("cachesvc_client", *path.relative_to(CLIENT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, text: Optional[str] = None) -> Iterator[str]:
    """Every module ``path`` imports (``text``: its source, read from the file where not given), relative
    imports resolved; ``from cachesvc_client import x`` is cachesvc_client.x (a room, or a name of the door)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base == "cachesvc_client":
                yield from (f"{base}.{a.name}" for a in node.names)
            else:
                yield base


def room(module: str) -> Optional[str]:
    """The room of a client module (None: the package's door itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "cachesvc_client" and len(parts) > 1 else None


def client_files() -> Iterator[Path]:
    return (p for p in sorted(CLIENT.rglob("*.py")) if "__pycache__" not in p.parts)


def test_every_import_goes_to_its_own_room_or_a_floor_below():
    upward = []
    for path in client_files():
        mine = room(module_name(path))
        if mine is None:
            continue  # the door imports from every floor: that is what it is for
        for other in imported(path):
            theirs = room(other)
            if theirs is None or theirs == mine or other in FROM_THE_DOOR or not other.startswith("cachesvc_client"):
                continue
            if FLOORS.get(theirs, 99) > FLOORS[mine]:
                upward.append(f"{module_name(path)} -> {other}")
    assert upward == [], "imports run down the floors (docs/architecture.md, 'The client, in rooms')"


def test_every_module_and_room_at_the_top_is_on_a_floor_and_the_top_holds_at_most_15_modules():
    top = sorted(p.stem for p in CLIENT.glob("*.py") if p.name != "__init__.py")
    rooms = sorted(p.name for p in CLIENT.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert sorted(set(top + rooms) - set(FLOORS)) == [], "a new module or room: give it a floor in FLOORS"
    assert len(top) + 1 <= 15, top


def test_the_shared_rules_import_the_standard_library_only():
    """At import, the standard library only (the service and a torch-less client load them); within a
    function, also the signatures' optional extra, ``cryptography``, which says what to install when absent."""
    def outside(names, allowed=frozenset()) -> list:
        return sorted(m for m in names if m.split(".")[0] not in sys.stdlib_module_names | allowed
                      and room(m) != "shared")

    found = {}
    for path in sorted((CLIENT / "shared").glob("*.py")):
        top = "\n".join(ast.unparse(n) for n in ast.parse(path.read_text()).body
                        if isinstance(n, (ast.Import, ast.ImportFrom)))
        found[path.name] = outside(imported(path, top)) + outside(imported(path), {"cryptography"})
    assert {p: names for p, names in found.items() if names} == {}, "the service imports these: stdlib only"


def test_the_one_call_reaches_the_service_through_cache_client_alone():
    beside_the_door = ("transport", "publish", "restore")
    found = {str(p.relative_to(CLIENT)): sorted(m for m in imported(p) if room(m) in beside_the_door)
             for p in sorted((CLIENT / "one_call").rglob("*.py"))}
    assert {p: names for p, names in found.items() if names} == {}, "CacheClient's public methods, not its rooms"


def test_the_floors_are_read_right():
    """The reader itself: relative imports from a room, one of them up into a higher floor, are seen."""
    as_if_in_codec = CLIENT / "codec" / "bad.py"  # floor 3
    names = list(imported(as_if_in_codec, "from ..one_call import compiled\nfrom .. import __version__, settings\n"))
    assert names == ["cachesvc_client.one_call", "cachesvc_client.__version__", "cachesvc_client.settings"]
    assert FLOORS[room(names[0])] > FLOORS["codec"] > FLOORS[room(names[2])]
