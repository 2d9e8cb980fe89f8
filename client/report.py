"""What publish and restore return: plain dataclasses that print well and serialise to JSON."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .progress import human


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
    warnings: List[str] = field(default_factory=list)  # things that will cost compile time despite the hit
    kind: str = "inductor-dir"  # the version kind restored (cachesvc_client.keys.KINDS)
    artifacts: List[str] = field(default_factory=list)  # other kinds: the fetched files, local paths
    meta: Dict[str, str] = field(default_factory=dict)  # other kinds: the version's metadata (torch, signature)
    loaded: Optional[Dict[str, int]] = None  # mega-cache with load=True: artifacts loaded, per type

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        if not self.hit:
            return f"restore {self.name} [{self.shape}]: miss ({self.reason}) in {self.seconds:.2f} s"
        what = "" if self.kind == "inductor-dir" else f" {self.kind}"
        text = (f"restore {self.name} [{self.shape}]:{what} hit version {self.version_id}: {self.files} files written "
                f"({human(self.bytes_written)}, {human(self.bytes)} transferred), {self.files_present} already "
                f"present, {self.seconds:.2f} s")
        if self.failed:
            text += f"; {len(self.failed)} file(s) left out: {self.failed[0]}" + (" ..." if len(self.failed) > 1 else "")
        if self.loaded is not None:
            text += "; loaded " + (", ".join(f"{n} {t}" for t, n in sorted(self.loaded.items())) or "nothing")
        return text


@dataclass
class PublishReport:
    status: str               # committed | unchanged
    name: str
    shape: str
    version_id: Optional[int] = None
    entry_id: Optional[int] = None
    files: int = 0            # files in the version
    bytes: int = 0            # logical bytes in the version
    uploaded_blobs: int = 0
    uploaded_bytes: int = 0   # bytes sent (as stored, possibly compressed)
    seconds: float = 0.0
    roots: Dict[str, str] = field(default_factory=dict)
    kind: str = "inductor-dir"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        what = "" if self.kind == "inductor-dir" else f" {self.kind}"
        return (f"publish {self.name} [{self.shape}]:{what} {self.status} version {self.version_id}: {self.files} files "
                f"({human(self.bytes)}), uploaded {self.uploaded_blobs} blobs ({human(self.uploaded_bytes)}) "
                f"in {self.seconds:.2f} s")
