"""A proof's bytes: its entries (one per trace), the environment it pins, and where it travels.

    MAGIC | header length (8 bytes, big-endian) | header (JSON) | each entry's torch guard state

The header holds the format, the torch that traced, the environment variables (name -> value, or null
for unset) and, per entry, its portable descriptions, the source lines it traced (module, first line,
last line + 1, digest), its guard count and the length of its torch state. The proof travels as an entry
of the package's own zip (``attach``/``read``), so the version's digest and signature cover it like the
machine code it vouches for.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .guards import INPUT, first_line
from ...errors import CacheClientError

FORMAT = 2
MAGIC = b"cachesvc-proof\n"
#: where the proof travels inside the package (torch's loader reads only its own entries)
ENTRY = "cachesvc/proof.bin"
#: a proof larger than this is not read (a package's bytes are untrusted until the proof holds)
MAX_BYTES = 256 * 1024 * 1024


class NoProof(CacheClientError):
    """No proof can be made (at build) or it does not hold here (at load): the package does not serve."""

    def __init__(self, message: str):
        super().__init__(message, code="no_proof")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One trace's guards: ``header`` (descriptions, sources, count) and torch's serialized ``state``."""

    header: Dict[str, Any]
    state: bytes
    seconds: float = 0.0
    #: the code objects Dynamo traced (this process only: capture.environment_reads attributes reads to them)
    traced: frozenset = frozenset()


@dataclasses.dataclass(frozen=True)
class Built:
    """A proof as the build holds it: its entries and the environment it pins."""

    torch: str
    entries: Tuple[Entry, ...]
    environ: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)

    @property
    def guards(self) -> int:
        return sum(int(e.header.get("guards", 0)) for e in self.entries)

    @property
    def seconds(self) -> float:
        return sum(e.seconds for e in self.entries)

    @property
    def traced(self) -> frozenset:
        return frozenset().union(*(e.traced for e in self.entries))

    @property
    def reads_inputs(self) -> bool:
        """Whether a trace read a value outside the model's parameters, buffers and the call (a tensor in a
        plain attribute or a global, a numpy scalar: capture._record_inputs), which is the live process's."""
        return any(name.startswith(INPUT) for e in self.entries for name in e.header.get("described", {}))

    @property
    def attributes(self) -> List[str]:
        """The plain tensor attributes of the model the traces read, by path: the package binds the live ones."""
        return attributes(e.header for e in self.entries)

    def add(self, other: "Built") -> "Built":
        return dataclasses.replace(self, entries=self.entries + other.entries)

    def without(self, dropped: Sequence[int]) -> "Built":
        return dataclasses.replace(self, entries=tuple(e for i, e in enumerate(self.entries) if i not in dropped))

    def with_environment(self, names: Sequence[str]) -> "Built":
        """The proof, also pinning the environment variables ``names``: their values, or their absence, as
        they are in this process."""
        return dataclasses.replace(self, environ={name: os.environ.get(name) for name in sorted(set(names))})

    @property
    def data(self) -> bytes:
        header = {"format": FORMAT, "torch": self.torch, "environ": self.environ,
                  "entries": [dict(e.header, bytes=len(e.state)) for e in self.entries]}
        body = json.dumps(header, sort_keys=True).encode()
        return MAGIC + len(body).to_bytes(8, "big") + body + b"".join(e.state for e in self.entries)


def decode(data: bytes, torch_version: str) -> Tuple[Dict[str, Any], List[Tuple[Dict[str, Any], bytes]]]:
    """(header, [(entry header, entry state)]) of a proof made by ``torch_version``; NoProof when it is
    not one, or is damaged."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise NoProof("the proof is not one cachesvc made")
    size = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "big")
    start = len(MAGIC) + 8
    try:
        header = json.loads(data[start:start + size])
    except ValueError as exc:
        raise NoProof("the proof's header is damaged") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise NoProof(f"the proof's format is not {FORMAT} (another client version made it)")
    if header.get("torch") != torch_version:
        raise NoProof(f"the proof was made by torch {header.get('torch')}; this process has {torch_version}")
    entries, at = [], start + size
    for entry in _entries(header):
        entries.append((entry, data[at:at + entry["bytes"]]))
        at += entry["bytes"]
    if at != len(data) or not entries:
        raise NoProof("the proof's header is damaged")
    return header, entries


def attributes(entries: Any) -> List[str]:
    """The attribute paths of these entries' headers (capture._record_inputs), each once."""
    return sorted({fqn for entry in entries for fqn in entry.get("attributes", ())})


def _entries(header: Dict[str, Any]) -> List[Dict[str, Any]]:
    entries, environ = header.get("entries"), header.get("environ")
    if not isinstance(entries, list) or not isinstance(environ, dict):
        raise NoProof("the proof's header is damaged")
    for entry in entries:
        if not (isinstance(entry, dict) and isinstance(entry.get("described"), dict)
                and isinstance(entry.get("sources"), list) and isinstance(entry.get("bytes"), int)
                and entry["bytes"] >= 0 and isinstance(entry.get("attributes", []), list)
                and all(isinstance(fqn, str) for fqn in entry.get("attributes", []))):
            raise NoProof("the proof's header is damaged")
    return entries


def attach(package: str, built: Built) -> None:
    """Add the proof to the package at ``package`` (a zip: torch's .pt2 format)."""
    import zipfile

    with zipfile.ZipFile(package, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(ENTRY, built.data)


def read(package: str) -> bytes:
    """The proof inside the package at ``package``; NoProof when it carries none or it is damaged."""
    import zipfile

    try:
        with zipfile.ZipFile(package) as archive:
            info = archive.getinfo(ENTRY)
            if info.file_size > MAX_BYTES:
                raise NoProof(f"the package's proof is {info.file_size} bytes, over {MAX_BYTES}")
            return archive.read(info)
    except KeyError:
        raise NoProof("the package carries no proof (an older client built it): it cannot serve") from None
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError) as exc:
        raise NoProof(f"the package's proof could not be read: {first_line(exc)}") from exc
