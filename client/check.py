"""Will it hit here? Resolve a key as a restore would, without downloading or writing anything.

    check(api, key, kind=, trust=, require_hit=)  -> CheckReport
    CheckReport.summary() / .to_dict()             what `cachesvc-client check` prints
    EXIT_HIT, EXIT_MISS, EXIT_USAGE, EXIT_DOWN     its exit statuses (0, 1, 2, 3)

The verdict is the restore's own: the same resolve (asked with ``count=false``,
so a look is recorded as neither a restore nor a miss), the same signature
rule (``restore.pipeline.refusal``) and the same required hit. What it cannot
foresee is the transfer itself (storage down, a full disk). On a miss it names
the nearest entry field by field (torch, triton, cuda, python, device, arch,
shape, tags, name) and whether that entry's newest version would pass this
client's trusted keys. Stdlib and the client's own modules only: with an env
file nothing imports torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .shared import signing
from .errors import CacheClientError
from .restore.pipeline import refusal
from .transport.api import ServiceAPI
from .shared.units import format_size

EXIT_HIT, EXIT_MISS, EXIT_USAGE, EXIT_DOWN = 0, 1, 2, 3


@dataclass
class CheckReport:
    hit: bool
    name: str
    shape: str
    kind: str = "inductor-dir"
    reason: str = ""           # a miss: why (as the restore's report would say it)
    entry_id: Optional[int] = None
    version_id: Optional[int] = None
    files: int = 0             # files the version lists
    bytes: int = 0             # bytes a restore into an empty cache dir moves (as stored: its blobs, each once)
    bytes_written: int = 0     # bytes it writes
    signed_by: Dict[str, str] = field(default_factory=dict)
    signature: str = ""        # what this client's trusted keys say of the version (or the nearest one's)
    refused: bool = False      # a version exists, but its signature is refused
    required: bool = False     # a hit was required (require_hit, CACHESVC_REQUIRE_HIT)
    nearest: Optional[dict] = None  # a miss: the closest entry, its version and the fields that differ
    env: Dict[str, str] = field(default_factory=dict)
    tags: Dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def exit_code(self) -> int:
        return EXIT_HIT if self.hit else EXIT_MISS

    def summary(self) -> str:
        head = f"check {self.name} [{self.shape}]" + ("" if self.kind == "inductor-dir" else f" {self.kind}")
        if self.hit:
            lines = [f"{head}: hit: entry {self.entry_id} version {self.version_id}, {self.files} files, would move "
                     f"{format_size(self.bytes)} ({format_size(self.bytes_written)} on disk)"]
        else:
            lines = [f"{head}: miss ({self.reason})" + ("; a hit is required" if self.required else "")]
        if self.signature:
            lines.append(f"  signature: {self.signature}")
        if self.nearest:
            e = self.nearest["entry"]
            lines.append(f"  nearest: entry {e['id']} {e['name']} [{e['shape']}] version {self.nearest['version_id']}")
            lines += [f"    {d['field']:<7} here {d['wanted']!r}, there {d['have']!r}" for d in self.nearest["differs"]]
            if not self.nearest["differs"]:
                lines.append("    same key")
        return "\n".join(lines)


def _signature_text(trust: Optional[signing.Trust], record: Optional[dict], problem: str) -> str:
    who = signing.describe(record)
    signer = f"signed by {who['fingerprint']}" + (f" ({who['comment']})" if who['comment'] else "") if who \
        else "unsigned"
    if trust is None:
        return f"{signer}; this client requires no signature"
    return f"refused: {problem}" if problem else f"{signer}: trusted here"


def _nearest_signature(api: ServiceAPI, candidate: dict, kind: str, trust: Optional[signing.Trust],
                       deadline: float) -> str:
    """Whether the nearest entry's newest version would pass ``trust`` (resolved as a look, its own key)."""
    e = candidate["entry"]
    key = {"name": e["name"], "shape": e["shape"], "tags": e["tags"], "env": e["env"]}
    try:
        answer = api.resolve(key, deadline=deadline, kind=kind, count=False)
    except CacheClientError as exc:
        return f"unknown ({exc.message})"
    if not answer["hit"]:
        return f"unknown (its version is not resolvable: {answer['reason']})"
    return _signature_text(trust, answer["version"]["signature"], refusal(trust, key, kind, answer))


def check(api: ServiceAPI, key: dict, *, kind: str, trust: Optional[signing.Trust], require_hit: bool,
          deadline: float) -> CheckReport:
    """The verdict a restore of ``key`` and ``kind`` would reach now (see the module docstring). Raises the
    CacheClientError of a service that cannot answer (ServiceUnavailable, a refused token, a malformed answer)."""
    report = CheckReport(hit=False, name=key["name"], shape=key["shape"], kind=kind, env=key["env"], tags=key["tags"],
                         required=require_hit)
    answer = api.resolve(key, deadline=deadline, kind=kind, count=False)
    if not answer["hit"]:
        report.reason = answer["reason"]
        if answer["nearest"]:
            report.nearest = answer["nearest"][0]
            report.signature = "nearest entry's version: " + _nearest_signature(api, report.nearest, kind, trust,
                                                                                 deadline)
        return report
    version = answer["version"]
    report.entry_id, report.version_id = answer["entry"]["id"], version["id"]
    report.signed_by = signing.describe(version["signature"]) or {}
    problem = refusal(trust, key, kind, answer)
    report.signature = _signature_text(trust, version["signature"], problem)
    if problem:
        report.reason, report.refused = f"signature refused: {problem}", True
        return report
    files: List[dict] = answer["files"]
    report.hit, report.files = True, len(files)
    report.bytes = sum(answer["blobs"][d]["stored_size"] for d in {f["sha256"] for f in files} if d in answer["blobs"])
    report.bytes_written = sum(f["size"] for f in files)
    return report
