"""Publish: snapshot the roots, send the manifest, upload what the service lacks, commit.

The service answers with the blobs it does not have; only those move, each
compressed with zstd when that saves at least 10% (a presigned target takes one length, so a zstd body's
is asked for once it is compressed: ``Uploads.target``). When the service offers
``packing``, the small ones travel in packs (``cachesvc_client.codec.packing``). Nothing becomes visible
until ``commit``, which the service accepts only when every blob is stored.
"""
from __future__ import annotations

import io
import logging
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

from .. import __version__, answers, settings
from ..process import driver_helpers, roots as roots_mod
from ..codec import packing
from ..shared import keys, signing
from ..codec.encoding import encode, file_sha256
from ..errors import BlobsMissing, CacheClientError, InvalidRequest, ServiceUnavailable
from ..process.fingerprint import torch_dir
from ..transport import blobs
from ..transport.api import ServiceAPI
from ..progress import Progress
from ..report import PublishReport

log = logging.getLogger("cachesvc_client")

#: The variables that place each shared role's folder (roots.SHARED_ROLES; the inductor root at torch's
#: default), and how a container says its own. Set, the process was given a folder of its own; all unset,
#: the folder is the host's default (``/tmp/torchinductor_<user>``, ``~/.triton/cache``, ``~/.nv``), which
#: every process of the user on the host writes to, and nothing on disk tells which of its files this
#: process made or read.
_TEMP_VARS = ("TMPDIR", "TEMP", "TMP")  # tempfile.gettempdir()'s order
PLACED_BY: Dict[str, Tuple[str, ...]] = {"inductor": _TEMP_VARS, "pch": _TEMP_VARS, "memo": _TEMP_VARS,
                                          "triton": ("TRITON_HOME", "TRITON_CACHE_DIR"), "nv": ("CUDA_CACHE_PATH",)}
_OWN_EXAMPLE = {"triton": "TRITON_HOME=$HOME", "nv": "CUDA_CACHE_PATH=$HOME/.nv/ComputeCache"}

#: tries per blob upload when storage answers 5xx or the connection breaks
UPLOAD_ATTEMPTS = 3
#: commits per publish: a commit that finds blobs missing uploads those again first
COMMIT_ATTEMPTS = 3
#: seconds create and commit may take per file of the manifest, on top of the client's per-call timeout:
#: the service's work on them is linear in the files (validate, record rows, check packs); ~10x what it
#: needs at the service's default file limit (docs/benchmarks.md, publish at scale), room for a loaded host
SECONDS_PER_FILE = 0.0005
#: blobs per request for upload targets (the service's limit is 1000); targets are fetched just before
#: their uploads, so presigned URLs do not expire behind a long queue of uploads
TARGET_BATCH = 500


def call_deadline(api: ServiceAPI, files: int) -> float:
    """The deadline of a create or commit of a manifest of ``files`` files."""
    return time.monotonic() + api.timeout + files * SECONDS_PER_FILE


def create(api: ServiceAPI, body: dict) -> dict:
    """POST the manifest, asking for upload targets in batches; a service from before that asked again
    with targets inline (it refuses the field it does not know)."""
    try:
        return api.call("POST", "/api/v1/versions", deadline=call_deadline(api, len(body["files"])),
                        json={**body, "inline_targets": False})
    except InvalidRequest as exc:
        if "inline_targets" not in f"{exc.message} {exc.details}":
            raise
    return api.call("POST", "/api/v1/versions", deadline=call_deadline(api, len(body["files"])), json=body)


def _targets_answer(doc) -> Dict[str, dict]:
    """sha256 -> {encoding: target} from an answer of POST /versions/<id>/uploads (Malformed when it is not one)."""
    rows = answers.json_object(doc).get("targets")
    if not isinstance(rows, list):
        raise answers.Malformed("answer.targets must be a list")
    out = {}
    for n, row in enumerate(rows):
        row = answers.json_object(row, f"targets[{n}]")
        targets = answers.json_object(row.get("targets"), f"targets[{n}].targets")
        for enc, target in targets.items():
            answers.url(answers.json_object(target, f"targets[{n}].targets.{enc}").get("url"),
                        f"targets[{n}].targets.{enc}.url")
        out[answers.digest(row.get("sha256"), f"targets[{n}].sha256")] = targets
    return out


def with_targets(api: ServiceAPI, version_id: int, items: List[dict]) -> List[dict]:
    """``items`` (create answer rows) each with its ``targets``, asked for those that came without; less
    those a concurrent publish has stored since (nothing to upload)."""
    need = [i["sha256"] for i in items if "targets" not in i]
    if not need:
        return items
    got = {}
    for at in range(0, len(need), TARGET_BATCH):
        got.update(api.call("POST", f"/api/v1/versions/{version_id}/uploads", json={"blobs": need[at:at + TARGET_BATCH]},
                            check=_targets_answer))
    return [i if "targets" in i else {**i, "targets": got[i["sha256"]]} for i in items
            if "targets" in i or i["sha256"] in got]


def send_loose(api: ServiceAPI, version_id: int, items: List[dict], send, workers: int) -> List[dict]:
    """Upload loose blobs, a batch of targets at a time."""
    sent = []
    for at in range(0, len(items), TARGET_BATCH):
        sent += pool_map(send, with_targets(api, version_id, items[at:at + TARGET_BATCH]), workers)
    return sent


def pool_map(fn, items: list, workers: int) -> list:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(fn, items))


def commit(api: ServiceAPI, version_id: int, sent: List[dict], packs: List[dict], files: int) -> dict:
    uploaded = [{"sha256": s["sha256"], "encoding": s["encoding"]} for s in sent]
    body = {"uploaded": uploaded, **({"packs": [{"sha256": p["sha256"], "members": p["members"]} for p in packs]}
                                     if packs else {})}  # older services refuse "packs"
    return api.call("POST", f"/api/v1/versions/{version_id}/commit", deadline=call_deadline(api, files), json=body)


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


class Uploads:
    """The uploads of one pending version: loose blobs (targets asked for in batches) and packs of small
    ones, each retried on a storage hiccup, then the commit (which re-uploads what it finds missing)."""

    def __init__(self, api: ServiceAPI, version_id: int, by_digest: Dict[str, str], progress: Progress, *,
                 workers: int, transfer_timeout: float):
        self.api, self.version_id, self.by_digest, self.progress = api, version_id, by_digest, progress
        self.workers, self.transfer_timeout = workers, transfer_timeout

    def put(self, target: dict, body_file, length: int, what: str) -> None:
        url = self.api.absolute(target["url"])
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                blobs.upload(self.api.session, {**target, "url": url}, self.api.auth_headers(url), body=body_file,
                             length=length, timeout=self.transfer_timeout)
                return
            except ServiceUnavailable as exc:
                # S3 stores answer 500/503 now and then (InternalError, SlowDown) and their
                # SDKs retry; so do we. A 4xx is an answer, not a hiccup.
                if attempt == UPLOAD_ATTEMPTS or (exc.status is not None and exc.status < 500):
                    raise
                log.debug("upload of %s failed (%s); retrying", what, exc.message)
                body_file.seek(0)
                time.sleep(0.2 * attempt)

    def send(self, item: dict) -> dict:
        digest = item["sha256"]
        encoding, body_file, length = encode(self.by_digest[digest], digest)
        self.progress.adjust_total(length - item["size"])  # the total starts uncompressed: progress.py
        try:
            self.put(self.target(item, encoding, length), body_file, length, digest[:12])
        finally:
            body_file.close()
        self.progress.advance(1, length)
        return {"sha256": digest, "encoding": encoding, "length": length}

    def target(self, item: dict, encoding: str, length: int) -> dict:
        """Where to PUT ``item``'s body of ``encoding``. A target the service marks ``needs_size`` is its own URL
        where storage takes presigned uploads, each signed for one length: asked again with the compressed
        length, it is presigned, so the bytes go straight to storage (through the service if it was stored since)."""
        target = item["targets"][encoding]
        if not target.get("needs_size"):
            return target
        got = self.api.call("POST", f"/api/v1/versions/{self.version_id}/uploads", check=_targets_answer,
                            json={"blobs": [item["sha256"]], "zstd_sizes": {item["sha256"]: length}})
        return got.get(item["sha256"], {}).get(encoding, target)

    def send_pack(self, group: List[dict]) -> dict:
        index, data = packing.build(group, self.by_digest)
        self.progress.adjust_total(len(data) - sum(i["size"] for i in group))
        target = self.api.pack_targets(self.version_id, [{"sha256": index["sha256"], "size": len(data)}])[0]["target"]
        self.put(target, io.BytesIO(data), len(data), f"pack {index['sha256'][:12]}")
        self.progress.advance(len(group), len(data))
        return {**index, "length": len(data), "group": group}

    def loose(self, items: List[dict]) -> List[dict]:
        return send_loose(self.api, self.version_id, items, self.send, self.workers)

    def all_then_commit(self, todo: List[dict], offer: dict, files: int) -> Tuple[dict, List[dict], List[dict]]:
        """Upload ``todo`` (the create answer's list; small blobs in packs when the service offers
        ``packing``) and commit: (the commit answer, the loose blobs sent, the packs sent)."""
        small = [i for i in todo if offer and i["size"] < offer["max_member"]]
        loose = [i for i in todo if not (offer and i["size"] < offer["max_member"])]
        groups = list(packing.groups(small, offer.get("target_size", 0))) if small else []
        # packs first: a few large bodies, then the loose blobs fill the workers
        packs = pool_map(self.send_pack, groups, self.workers) if groups else []
        sent = self.loose(loose)
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return commit(self.api, self.version_id, sent, packs, files), sent, packs
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
                         self.version_id, len(again), len(packs_again))
                self.progress.adjust_total(sum(i["size"] for i in again + [i for p in packs_again for i in p["group"]]))
                redone = {s["sha256"]: s for s in self.loose(again)}
                sent = [redone.get(s["sha256"], s) for s in sent]
                repacked = {p["sha256"]: p for p in pool_map(self.send_pack, [p["group"] for p in packs_again],
                                                             self.workers)}
                packs = [repacked.get(p["sha256"], p) for p in packs]
        raise AssertionError("unreachable: the last attempt returns or raises")


def sign(body: dict) -> None:
    """Sign the publish ``body`` with ``$CACHESVC_SIGNING_KEY`` (unset: leave it unsigned), and turn its merge
    off: the signature covers exactly its own files. A key that cannot be read raises CacheClientError."""
    path = settings.current().signing_key  # read where the key is used: the client's settings, not shared/
    try:
        signer = signing.Signer.from_file(path) if path else None
    except signing.SigningError as exc:
        raise CacheClientError(str(exc), code="signing_key") from None
    if signer is not None:
        body.update(signature=signer.sign(body["key"], body["kind"], body["files"]), merge=False)


def _check_not_empty(files: List[dict], wanted: List[roots_mod.Root], present: List[roots_mod.Root], kind: str) -> None:
    """InvalidRequest unless the snapshot holds files of the process's own roots: an empty version would hide
    the key's good one, and the host's shared dirs alone hold what neighbours left (roots.SHARED_ROLES)."""
    own = [f for f in files if f["root"] not in roots_mod.SHARED_ROLES] if kind == keys.DEFAULT_KIND else files
    if own:
        return
    shared = len(files) - len(own)
    raise InvalidRequest("nothing to publish: " + ", ".join(
        f"{r.path} ({'empty' if r in present else 'missing'})" for r in wanted if r.role not in roots_mod.SHARED_ROLES)
        + " holds no cache files" + (f" (the {shared} file(s) in the host's shared dirs, "
                                     f"{', '.join(sorted({f['root'] for f in files}))}, are not this compile's "
                                     "alone and never travel without it)" if shared else "")
        + "; publish after the compile, from the process (or cache dir) that ran it", code="empty_manifest")


def host_default(root: roots_mod.Root) -> Tuple[str, ...]:
    """The variables to set when ``root`` is the host's shared default folder for its role (``PLACED_BY``:
    none of them set, and for ``inductor``, the folder is torch's default dir); () when it is this process's own."""
    placed_by = PLACED_BY.get(root.role)
    if not placed_by or any(os.environ.get(v, "").strip() for v in placed_by):
        return ()
    # a cache dir elsewhere was chosen (TORCHINDUCTOR_CACHE_DIR, --cache-dir); at torch's default path it is the
    # shared one however it was named (CacheClient sets TORCHINDUCTOR_CACHE_DIR to it after a restore)
    if root.role == "inductor" and not roots_mod.inside(root.path, roots_mod.default_cache_dir()):
        return ()
    return placed_by


def own_roots(roots: List[roots_mod.Root]) -> Tuple[List[roots_mod.Root], List[str]]:
    """The default roots less the host's shared default folders (``host_default``: e.g. the precompiled
    headers under ``/tmp/torchinductor_<user>`` with TMPDIR unset), whose files may be any process's of this
    user: (the roots to publish, a warning for each left-out folder that holds files). InvalidRequest when the
    cache dir itself is torch's shared default: none of it is known to be this compile's."""
    kept, notes = [], []
    for root in roots:
        settings = host_default(root)
        if not settings:
            kept.append(root)
            continue
        if root.role == "inductor":
            raise InvalidRequest(
                f"the cache dir {root.path} is torch's default under the host's shared temp dir, where every process "
                "of this user writes: its files may be another process's. Set TORCHINDUCTOR_CACHE_DIR (or "
                "--cache-dir) to this compile's own folder, or TMPDIR to this process's own temp dir (a container's: "
                "TMPDIR=/tmp), in the compiling process and here", code="shared_cache_dir")
        held = sum(1 for _ in roots_mod.walk(root.path, root.exclude))
        if held:
            notes.append(f"left out {root.role} ({root.path}, {held} file(s)): the host's default folder, which every "
                         f"process of this user shares, so not this compile's alone; restoring processes rebuild what "
                         f"it held. Set {' or '.join(settings)} to this process's own folder (a container's: "
                         f"{_OWN_EXAMPLE.get(root.role, 'TMPDIR=/tmp')}) in the compiling process and here to "
                         "publish it")
    return kept, notes


def publish(api: ServiceAPI, key: dict, roots: List[roots_mod.Root], *, compile_seconds: Optional[float] = None,
            workers: int = 8, transfer_timeout: float = 600.0, merge: bool = True, kind: str = "inductor-dir",
            meta: Optional[Dict[str, str]] = None) -> PublishReport:
    """Snapshot ``roots`` and publish them under ``key`` as one version of ``kind``; ``meta`` adds to the
    version's metadata. With ``merge`` the service unions the manifest with the key's newest version
    (``cachesvc.publish.merging``), so publishers that restored it converge; a signed one never (``sign``)."""
    start, wanted = time.monotonic(), roots
    roots = [r for r in roots if os.path.isdir(r.path)]
    files, where = snapshot(roots, workers)
    _check_not_empty(files, wanted, roots, kind)
    if kind == keys.DEFAULT_KIND:  # a folder snapshot: Triton's driver helper where a restored process looks
        roots = driver_helpers.add(files, where, roots)  # (an artifact kind's version is its one file)
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
    sign(body)
    answer = create(api, body)
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
    with Progress(f"publish {key['name']}", len(todo), sum(i["size"] for i in todo), log, items="blobs",
                  bytes_bound=True) as progress:
        uploads = Uploads(api, report.version_id, by_digest, progress, workers=workers,
                          transfer_timeout=transfer_timeout)
        done, sent, packs = uploads.all_then_commit(todo, answer.get("packing") or {}, len(files))
    report.uploaded_blobs = len(sent) + sum(len(p["members"]) for p in packs)
    report.uploaded_bytes = sum(s["length"] for s in sent) + sum(p["length"] for p in packs)
    report.uploaded_packs = len(packs)
    report.status = done["status"]
    report.version_id = done["version"]["id"]
    report.files, report.bytes = done["version"]["file_count"], done["version"]["total_bytes"]  # merged
    report.seconds = time.monotonic() - start
    return report
