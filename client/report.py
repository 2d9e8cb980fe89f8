"""What publish and restore return: plain dataclasses that print well and serialise to JSON."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .shared.units import format_size


def _show(value: str) -> str:
    return value if value and not any(c.isspace() or c in "'\"" for c in value) else repr(value)


def describe_differences(differs: List[dict]) -> str:
    """``[{field, wanted, have}]`` as ``torch 2.13.1 != 2.13.0, device 'NVIDIA H200' != 'NVIDIA H100 80GB HBM3'``."""
    return ", ".join(f"{d['field']} {_show(d['wanted'])} != {_show(d['have'])}" for d in differs)


def describe_entry(candidate: dict) -> str:
    """One of the service's ``nearest`` or ``fallback.entries`` rows, for a log line."""
    e = candidate["entry"]
    return (f"entry {e['id']} {e['name']} [{e['shape']}] version {candidate.get('version_id')}: "
            f"{describe_differences(candidate['differs']) or 'same key'}")


@dataclass
class RestoreReport:
    hit: bool
    name: str
    shape: str
    version_id: Optional[int] = None
    entry_id: Optional[int] = None
    files: int = 0            # files written by this restore
    files_present: int = 0    # files already in place with the right content
    bytes: int = 0            # bytes transferred (as stored, possibly compressed)
    bytes_written: int = 0    # bytes placed on disk
    seconds: float = 0.0
    failed: List[str] = field(default_factory=list)  # "role:path: why", left out of the restore
    roots: Dict[str, str] = field(default_factory=dict)  # role -> local folder restored into
    reason: str = ""          # why a miss was a miss
    # the miss was the service's, not the key's (no or bad URL, unreachable, 5xx, a refused token):
    # another restore from this process now would wait and fail the same way
    service_down: bool = False
    warnings: List[str] = field(default_factory=list)  # things that will cost compile time despite the hit
    fallback: str = ""        # the fallback step that answered (shape | shapes | name); "" for the exact key
    versions: List[int] = field(default_factory=list)  # every version restored (several for a `shapes` fallback)
    fallback_entries: List[dict] = field(default_factory=list)  # the service's fallback.entries: what differs
    nearest: List[dict] = field(default_factory=list)  # on a miss: the closest entries and what differs
    started_at: float = 0.0   # time.time() when the restore began (client.verify() looks for newer files)
    kind: str = "inductor-dir"  # the version kind restored (cachesvc_client.shared.keys.KINDS)
    artifacts: List[str] = field(default_factory=list)  # other kinds: the fetched files, local paths
    meta: Dict[str, str] = field(default_factory=dict)  # other kinds: the version's metadata (torch, signature)
    loaded: Optional[Dict[str, int]] = None  # mega-cache with load=True: artifacts loaded, per type
    tags: Dict[str, str] = field(default_factory=dict)  # the key's tags
    env: Dict[str, str] = field(default_factory=dict)   # the key's environment (cachesvc_client.shared.keys.ENV_FIELDS)
    env_file: str = ""        # the env file that environment came from ("" when read by this process)
    signed_by: Dict[str, str] = field(default_factory=dict)  # the version's signer: fingerprint, comment ({}: unsigned)
    refused: bool = False     # a version was found but its signature was refused (CACHESVC_TRUSTED_KEYS): see reason
    warmed: Optional[Dict[str, Any]] = None  # the one call's warm_up(): the shapes it ran, how each was served
    phases: Optional[Dict[str, float]] = None  # the one call's compile(): where its seconds went (CompiledModel.phases)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def for_key(cls, key: dict, **fields) -> "RestoreReport":
        """A miss (so far) for ``key`` (``CacheClient.key()``)."""
        return cls(hit=False, name=key["name"], shape=key["shape"], tags=key["tags"], env=key["env"], **fields)

    def stamp_record(self) -> dict:
        """What ``restored.json`` keeps of this restore, beside its files (``cachesvc-client status``)."""
        return {"versions": self.versions, "fallback": self.fallback, "restored_at": self.started_at,
                "key": {"name": self.name, "shape": self.shape, "tags": self.tags, "env": self.env},
                "kind": self.kind, "entry_id": self.entry_id, "roots": self.roots, "files_written": self.files,
                "files_present": self.files_present, "bytes": self.bytes, "bytes_written": self.bytes_written,
                "left_out": len(self.failed), "seconds": round(max(0.0, time.time() - self.started_at), 3)}

    def summary(self, nearest: bool = True) -> str:
        """One line. ``nearest=False``: a miss says "nearest: as above" for the entries a line before named."""
        if not self.hit:
            text = f"restore {self.name} [{self.shape}]: miss ({self.reason}) in {self.seconds:.2f} s"
            if self.nearest:
                text += ("; nearest: " + "; ".join(describe_entry(c) for c in self.nearest[:3]) if nearest
                         else "; nearest: as above")
            return text
        what = ("" if self.kind == "inductor-dir" else f"{self.kind} ") + f"hit version {self.version_id}"
        if self.fallback:
            what = (f"fallback '{self.fallback}' ({self.reason}), version(s) {', '.join(map(str, self.versions))} "
                    f"[{'; '.join(describe_entry(c) for c in self.fallback_entries)}]")
        text = (f"restore {self.name} [{self.shape}]: {what}: {self.files} files written "
                f"({format_size(self.bytes_written)}, {format_size(self.bytes)} transferred), "
                f"{self.files_present} already present, {self.seconds:.2f} s")
        if self.failed:
            text += f"; {len(self.failed)} file(s) left out: {self.failed[0]}" + (" ..." if len(self.failed) > 1 else "")
        if self.loaded is not None:
            text += "; loaded " + (", ".join(f"{n} {t}" for t, n in sorted(self.loaded.items())) or "nothing")
        return text


@dataclass
class PublishReport:
    status: str               # committed | unchanged | linked | skipped
    name: str
    shape: str
    version_id: Optional[int] = None
    entry_id: Optional[int] = None
    files: int = 0            # files in the version
    bytes: int = 0            # logical bytes in the version
    uploaded_blobs: int = 0
    uploaded_bytes: int = 0   # bytes sent (as stored, possibly compressed)
    uploaded_packs: int = 0   # of the uploaded blobs, how many packs the small ones travelled in
    seconds: float = 0.0
    roots: Dict[str, str] = field(default_factory=dict)
    admitted: bool = True     # False: skipped by the admission rule (nothing sent)
    reason: str = ""          # why skipped or linked
    kind: str = "inductor-dir"
    warnings: List[str] = field(default_factory=list)  # settings that will cost restoring processes compile time

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        if self.status in ("skipped", "linked"):
            return f"publish {self.name} [{self.shape}]: {self.status}: {self.reason}"
        what = "" if self.kind == "inductor-dir" else f" {self.kind}"
        text = (f"publish {self.name} [{self.shape}]:{what} {self.status} version {self.version_id}: "
                f"{self.files} files ({format_size(self.bytes)}), uploaded {self.uploaded_blobs} blobs "
                f"({format_size(self.uploaded_bytes)}) in {self.seconds:.2f} s")
        return text + (f"; {len(self.warnings)} warning(s)" if self.warnings else "")
