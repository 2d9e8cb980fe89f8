"""Publish: snapshot the roots, send the manifest, upload what the service lacks, commit.

The service answers with the blobs it does not have; only those move, each
compressed with zstd when that saves at least 10%. When the service offers
``packing``, the small ones travel in packs (``cachesvc_client.packing``). Nothing becomes visible
until ``commit``, which the service accepts only when every blob is stored.
"""
from __future__ import annotations

import io
import logging
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

from . import __version__, driver_helpers, packing, roots as roots_mod
from .encoding import encode, file_sha256
from .errors import BlobsMissing, ServiceUnavailable
from .fingerprint import torch_dir
from .transport import blobs
from .transport.api import ServiceAPI
from .progress import Progress
from .report import PublishReport

log = logging.getLogger("cachesvc_client")

#: tries per blob upload when storage answers 5xx or the connection breaks
UPLOAD_ATTEMPTS = 3
#: commits per publish: a commit that finds blobs missing uploads those again first
COMMIT_ATTEMPTS = 3


def pool_map(fn, items: list, workers: int) -> list:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(fn, items))


def keying_warnings() -> List[str]:
    """Settings of this process that key its compile state apart from a process without them.

    torch keys AOTAutograd entries by the whole functorch config, the remote AOTAutograd cache switch
    included (``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1``, or ``enable_remote_cache()``); FX graph keys
    leave it out. A version published from such a process gives processes without it FX graph hits
    but AOTAutograd misses: they trace the model's joint graph again (about 2 s of the mlp's 5 s
    first call on the CPU, bench/ttfi.py). A test pins that torch behaviour.
    """
    config = sys.modules.get("torch._functorch.config")
    on = (getattr(config, "enable_remote_autograd_cache", None) if config is not None
          else os.environ.get("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE") == "1")
    if not on:
        return []
    return ["this process has the remote AOTAutograd cache on (TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1 or "
            "enable_remote_cache()), which torch puts in the AOTAutograd cache keys: processes restoring this "
            "version without it will hit the FX graph cache but miss AOTAutograd and trace again. Publish "
            "from a process set up like the ones that restore."]


def snapshot(roots: List[roots_mod.Root], workers: int = 8) -> Tuple[List[dict], Dict[Tuple[str, str], str]]:
    """Walk the roots and hash every file. Returns (manifest rows, (role, path) -> absolute path)."""
    found = []
    for root in roots:
        if os.path.isdir(root.path):
            for rel, abspath, size, mode in roots_mod.walk(root.path, root.exclude):
                found.append((root.role, rel, abspath, size, mode))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda row: file_sha256(row[2]), found))
    files, where = [], {}
    for (role, rel, abspath, size, mode), digest in zip(found, digests):
        files.append({"root": role, "path": rel, "sha256": digest, "size": size,
                      "mode": 0o755 if mode & 0o111 else 0o644})
        where[(role, rel)] = abspath
    return files, where


def admit(compile_seconds: Optional[float], min_compile_seconds: float) -> str:
    """Why a publish is not worth it ("" when it is): a cold compile shorter than ``min_compile_seconds``
    (JAX's ``jax_persistent_cache_min_compile_time_secs`` rule). Unknown compile time: admitted."""
    if compile_seconds is not None and compile_seconds < min_compile_seconds:
        return (f"the compile took {compile_seconds:.2f} s, under the {min_compile_seconds:.2f} s threshold "
                "(min_compile_seconds / CACHESVC_MIN_COMPILE_SECONDS): restoring would not pay; nothing sent")
    return ""


def publish(api: ServiceAPI, key: dict, roots: List[roots_mod.Root], *, compile_seconds: Optional[float] = None,
            workers: int = 8, transfer_timeout: float = 600.0, merge: bool = True, kind: str = "inductor-dir",
            meta: Optional[Dict[str, str]] = None) -> PublishReport:
    """Snapshot ``roots`` and publish them under ``key`` as one version of ``kind``; ``meta`` adds to the
    version's metadata. With ``merge`` the service unions the manifest with the key's newest version
    (``cachesvc.merging``), so publishers that restored it converge."""
    start = time.monotonic()
    roots = [r for r in roots if os.path.isdir(r.path)]
    files, where = snapshot(roots, workers)
    roots = driver_helpers.add(files, where, roots)  # Triton's driver helper where a restored process looks
    log.info("publish %s: %d files, %.1f MB in %d roots, hashed in %.1f s", key["name"], len(files),
             sum(f["size"] for f in files) / 1e6, len(roots), time.monotonic() - start)
    body = {
        "key": key,
        "kind": kind,
        "roots": {r.role: os.path.abspath(r.path) for r in roots},
        "files": files,
        "compile_seconds": compile_seconds,
        "merge": merge,
        "meta": {"host": platform.node()[:200], "client": __version__, "pid": str(os.getpid()),
                 "torch_dir": torch_dir() or "", **(meta or {})},
    }
    answer = api.create_version(body)
    report = PublishReport(status=answer["status"], name=key["name"], shape=key["shape"],
                           version_id=answer["version"]["id"], entry_id=answer["entry"]["id"],
                           files=len(files), bytes=sum(f["size"] for f in files), roots=body["roots"],
                           kind=kind)
    if answer["status"] == "linked":
        linked = answer["linked_to"]
        report.reason = (f"the same content is stored as version {linked['version_id']} of entry "
                         f"{linked['entry_id']}: recorded this key as version {report.version_id}, uploaded nothing")
    if answer["status"] in ("unchanged", "linked"):
        report.files, report.bytes = answer["version"]["file_count"], answer["version"]["total_bytes"]
        report.seconds = time.monotonic() - start
        return report

    by_digest = {}
    for f in files:
        by_digest.setdefault(f["sha256"], where[(f["root"], f["path"])])
    todo = answer["upload"]

    offer = answer.get("packing") or {}
    small = [i for i in todo if offer and i["size"] < offer["max_member"]]
    loose = [i for i in todo if not (offer and i["size"] < offer["max_member"])]

    def put(target: dict, body_file, length: int, what: str) -> None:
        url = api.absolute(target["url"])
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                blobs.upload(api.session, {**target, "url": url}, api.auth_headers(url), body=body_file,
                             length=length, timeout=transfer_timeout)
                return
            except ServiceUnavailable as exc:
                # S3 stores answer 500/503 now and then (InternalError, SlowDown) and their
                # SDKs retry; so do we. A 4xx is an answer, not a hiccup.
                if attempt == UPLOAD_ATTEMPTS or (exc.status is not None and exc.status < 500):
                    raise
                log.debug("upload of %s failed (%s); retrying", what, exc.message)
                body_file.seek(0)
                time.sleep(0.2 * attempt)

    def send(item: dict) -> dict:
        digest = item["sha256"]
        encoding, body_file, length = encode(by_digest[digest], digest)
        progress.adjust_total(length - item["size"])  # the total starts uncompressed: progress.py
        try:
            put(item["targets"][encoding], body_file, length, digest[:12])
        finally:
            body_file.close()
        progress.advance(1, length)
        return {"sha256": digest, "encoding": encoding, "length": length}

    def send_pack(group: List[dict]) -> dict:
        index, data = packing.build(group, by_digest)
        progress.adjust_total(len(data) - sum(i["size"] for i in group))
        target = api.pack_targets(report.version_id, [{"sha256": index["sha256"], "size": len(data)}])[0]["target"]
        put(target, io.BytesIO(data), len(data), f"pack {index['sha256'][:12]}")
        progress.advance(len(group), len(data))
        return {**index, "length": len(data), "group": group}

    groups = list(packing.groups(small, offer.get("target_size", 0))) if small else []
    with Progress(f"publish {key['name']}", len(todo), sum(i["size"] for i in todo), log, items="blobs",
                  bytes_bound=True) as progress:
        # packs first: a few large bodies, then the loose blobs fill the workers
        packs = pool_map(send_pack, groups, workers) if groups else []
        sent = pool_map(send, loose, workers)
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                done = api.commit(report.version_id, [{"sha256": s["sha256"], "encoding": s["encoding"]} for s in sent],
                                  [{"sha256": p["sha256"], "members": p["members"]} for p in packs])
                break
            except BlobsMissing as exc:
                # A blob we uploaded is not in storage at commit: another publisher of the same blob
                # was overwriting it at that instant (some S3 servers delete, then rename), or it was
                # lost. We still hold the file: upload those again and commit again.
                missing = set((exc.details or {}).get("missing", []))
                missing_packs = set((exc.details or {}).get("missing_packs", []))
                again = [item for item in loose if item["sha256"] in missing]
                packs_again = [p for p in packs if p["sha256"] in missing_packs]
                if (attempt == COMMIT_ATTEMPTS or not (again or packs_again) or len(again) < len(missing)
                        or len(packs_again) < len(missing_packs)):
                    raise
                log.info("commit of version %s found %d blob(s) and %d pack(s) missing; uploading them again",
                         report.version_id, len(again), len(packs_again))
                progress.adjust_total(sum(i["size"] for i in again + [i for p in packs_again for i in p["group"]]))
                redone = {s["sha256"]: s for s in pool_map(send, again, workers)}
                sent = [redone.get(s["sha256"], s) for s in sent]
                repacked = {p["sha256"]: p for p in pool_map(send_pack, [p["group"] for p in packs_again], workers)}
                packs = [repacked.get(p["sha256"], p) for p in packs]
    report.uploaded_blobs = len(sent) + sum(len(p["members"]) for p in packs)
    report.uploaded_bytes = sum(s["length"] for s in sent) + sum(p["length"] for p in packs)
    report.uploaded_packs = len(packs)
    report.status = done["status"]
    report.version_id = done["version"]["id"]
    report.files, report.bytes = done["version"]["file_count"], done["version"]["total_bytes"]  # merged
    report.seconds = time.monotonic() - start
    return report
