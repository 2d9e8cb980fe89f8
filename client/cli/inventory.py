"""What a machine holds and what the service holds: ``cachesvc-client status``, ``ls`` and ``stats``.

``local_status(cache_dir)`` reads the record the last restore left in the cache dir
(``<inductor root>/.cachesvc/restored.json``: the key, the version, files and bytes,
when, and the verdict ``client.verify()`` added) and checks that the files it placed
are still there unchanged (size and mtime, no hashing). ``list_entries`` pages
``GET /api/v1/entries`` (and, for versions, ``GET /api/v1/entries/<id>``);
``service_stats`` is ``GET /api/v1/stats``. The ``*_text`` functions render them for
people: tables with human-readable sizes; the CLI's ``--json`` prints the dicts.
"""
from __future__ import annotations

import datetime as dt
import os
import time
from typing import Dict, Iterable, List, Optional, Sequence

from ..process import roots as roots_mod
from ..transport.api import ServiceAPI
from ..restore.place import load_stamp, stamp_file
from ..shared.units import format_size

#: rows asked per page of GET /api/v1/entries
PAGE = 200
#: a table cell longer than this is cut (--json has it whole)
MAX_CELL = 40


# -- this machine ---------------------------------------------------------------------------------

def local_status(cache_dir: str) -> dict:
    """The last restore into ``cache_dir`` and how its files stand now; ``{"restored": False}`` when none."""
    out: dict = {"cache_dir": cache_dir, "record": stamp_file(cache_dir)}
    doc = load_stamp(cache_dir)
    if not doc.get("versions") and doc.get("version_id") is None:
        return dict(out, restored=False)
    roots = doc.get("roots") if isinstance(doc.get("roots"), dict) else {}
    on_disk = {"in_place": 0, "changed": 0, "missing": 0}
    files = doc.get("files") if isinstance(doc.get("files"), dict) else {}
    for label, recorded in files.items():
        role, _, rel = str(label).partition("/")
        on_disk[_file_state(roots.get(role) or _local_root(role, cache_dir), rel, recorded)] += 1
    keep = ("key", "kind", "version_id", "versions", "entry_id", "fallback", "restored_at", "seconds",
            "files_written", "files_present", "bytes", "bytes_written", "left_out", "roots", "verdict")
    return dict(out, restored=True, **{k: doc.get(k) for k in keep}, files=on_disk)


def _local_root(role: str, cache_dir: str) -> Optional[str]:
    try:
        return roots_mod.resolve_root(role, cache_dir)
    except ValueError:
        return None


def _file_state(root: Optional[str], rel: str, recorded) -> str:
    try:
        st = os.stat(os.path.join(root, rel)) if root else None
    except OSError:
        st = None
    if st is None:
        return "missing"
    # a JSON list [size, mtime_ns, sha256] (older stamps: without the digest); anything else: changed
    return "in_place" if isinstance(recorded, list) and [st.st_size, st.st_mtime_ns] == recorded[:2] else "changed"


def status_text(s: dict) -> str:
    if not s["restored"]:
        return (f"nothing restored into {s['cache_dir']} (no {s['record']}): no `cachesvc-client restore` or "
                "client.restore() has hit here")
    key = s.get("key") or {}
    lines = [("cache dir", s["cache_dir"])]
    if key:
        tags = " ".join(f"{k}={v}" for k, v in sorted((key.get("tags") or {}).items()))
        lines += [("key", f"{key.get('name')} [{key.get('shape')}]" + (f" {tags}" if tags else "")),
                  ("environment", ", ".join(f"{k} {v}" for k, v in (key.get("env") or {}).items()))]
    versions = ", ".join(map(str, s.get("versions") or [s.get("version_id")]))
    what = f"fallback '{s['fallback']}': version(s) {versions}" if s.get("fallback") else f"version {versions}"
    lines.append(("restored", f"{what} of entry {s.get('entry_id', '?')} ({s.get('kind') or 'inductor-dir'})"))
    when = _when(s.get("restored_at"))
    if s.get("seconds") is not None:
        when += f", in {s['seconds']:.2f} s"
    lines.append(("when", when))
    if s.get("files_written") is not None:
        lines.append(("files", f"{s['files_written'] + s['files_present']}: {s['files_written']} written "
                               f"({format_size(s['bytes_written'])}; {format_size(s['bytes'])} transferred), "
                               f"{s['files_present']} already present, {s['left_out']} left out"))
    f = s["files"]
    lines.append(("on disk now", f"{f['in_place']} in place, {f['changed']} changed, {f['missing']} missing"))
    lines.append(("verdict", _verdict_text(s.get("verdict"))))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _verdict_text(v: Optional[dict]) -> str:
    if not v:
        return "none yet (the app records one with client.verify() after its first compiled call)"
    return (f"{v['verdict']} ({_when(v.get('at'))}): FX graph {v.get('fxgraph_hits', 0)} hit(s), "
            f"{v.get('fxgraph_misses', 0)} miss(es); AOTAutograd {v.get('aotautograd_hits', 0)} hit(s), "
            f"{v.get('aotautograd_misses', 0)} miss(es); still compiled {v.get('triton_compiles', 0)} Triton and "
            f"{v.get('cpp_builds', 0)} C++ kernel(s){'' if v.get('reported') else '; not reported to the service'}")


def _when(epoch: Optional[float]) -> str:
    if not epoch:
        return "-"
    at = dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{at} ({_ago(time.time() - epoch)})"


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{max(0.0, seconds):.0f} s ago"


# -- the service ----------------------------------------------------------------------------------

def list_entries(api: ServiceAPI, filters: Dict[str, object], *, limit: int, versions: bool, page: int = PAGE) -> dict:
    """Entries matching ``filters`` (GET /api/v1/entries query arguments), up to ``limit`` (0: all), ``page`` a request.

    With ``versions`` each entry row gets ``"versions_detail"``: its committed versions (GET
    /api/v1/entries/<id>) without their file lists, each with ``hit_rate``."""
    rows: List[dict] = []
    offset, total = 0, 0
    while True:
        want = page if not limit else min(page, limit - len(rows))
        got = api.call("GET", "/api/v1/entries", params={**filters, "limit": want, "offset": offset})
        rows += got["entries"]
        total = got["total"]
        if got.get("next_offset") is None or (limit and len(rows) >= limit):
            break
        offset = got["next_offset"]
    if versions:
        for row in rows:
            detail = api.call("GET", f"/api/v1/entries/{int(row['id'])}")
            row["versions_detail"] = [dict({k: v for k, v in ver.items() if k != "files"},
                                           hit_rate=_hit_rate(ver)) for ver in detail["versions"]]
    return {"total": total, "shown": len(rows), "entries": rows}


def _hit_rate(version: dict) -> Optional[float]:
    """Share of the verified restores of a version (client.verify()) whose process got cache hits."""
    verified = version.get("verify_count") or 0
    return round((verified - (version.get("no_hit_count") or 0)) / verified, 3) if verified else None


def entries_text(listing: dict, *, versions: bool) -> str:
    rows = listing["entries"]
    if versions:
        headers = ["ENTRY", "NAME", "SHAPE", "VERSION", "KIND", "FILES", "SIZE", "RESTORES", "VERIFIED",
                   "HIT RATE", "COMMITTED", "SIGNED BY"]
        cells = [[e["id"], e["name"], e["shape"], v["id"], v["kind"], v["file_count"], format_size(v["total_bytes"]),
                  v["restore_count"], v["verify_count"], _percent(v["hit_rate"]) + (" problem" if v["problem"] else ""),
                  _date(v["committed_at"]), signer_text(v.get("signed_by"))]
                 for e in rows for v in e["versions_detail"]]
    else:
        headers = ["ID", "NAME", "SHAPE", "TAGS", "TORCH", "DEVICE", "KINDS", "VERSIONS", "SIZE", "RESTORES",
                   "LAST RESTORED"]
        cells = [[e["id"], e["name"], e["shape"], " ".join(f"{k}={v}" for k, v in sorted(e["tags"].items())) or "-",
                  e["env"]["torch"], e["env"]["device"], ",".join(e.get("kinds") or []), e["versions"],
                  format_size(e["size"]), e["restore_count"], _date(e["last_restored_at"])] for e in rows]
    more = listing["total"] - listing["shown"]
    footer = (f"{listing['shown']} of {listing['total']} entries" +
              (f" ({more} more: --limit 0 shows all)" if more > 0 else ""))
    return (table(headers, cells) + "\n" if cells else "") + footer


def signer_text(signed_by: Optional[dict]) -> str:
    """A version's ``signed_by`` as ``SHA256:... comment`` (``-``: unsigned)."""
    if not signed_by:
        return "-"
    return f"{signed_by['fingerprint']} {signed_by.get('comment') or ''}".strip()


def service_stats(api: ServiceAPI, days: int) -> dict:
    return api.call("GET", "/api/v1/stats", params={"days": max(1, days)})


#: (field of GET /api/v1/stats, label, how to show it)
_STATS = (("entries", "entries", str), ("versions", "versions", str), ("blobs", "blobs", str),
          ("stored_bytes", "stored", format_size), ("logical_bytes", "logical (before dedup)", format_size),
          ("dedup_ratio", "dedup ratio", lambda r: f"{r:.2f}x"), ("publishes", "publishes", str),
          ("restores", "restores", str), ("misses", "misses", str),
          ("restore_rate", "restore rate", lambda r: _percent(r)), ("hits", "verified hits", str),
          ("hit_rate", "hit rate (verdicts)", lambda r: _percent(r)), ("fallbacks", "fallback restores", str),
          ("compile_seconds_saved", "compile time saved", lambda s: _duration(s)), ("gc_runs", "GC runs", str))


def stats_text(stats: dict, days: int) -> str:
    known = {field for field, _, _ in _STATS}
    lines = [(label, "-" if stats.get(field) is None else show(stats[field]))
             for field, label, show in _STATS if field in stats]
    lines += [(k.replace("_", " "), str(v)) for k, v in stats.items()  # fields of a newer service
              if k not in known and k != "daily" and isinstance(v, (int, float, str))]
    width = max(len(k) for k, _ in lines)
    text = "\n".join(f"{k:<{width}}  {v}" for k, v in lines)
    daily = (stats.get("daily") or [])[-days:] if days else []
    if daily:
        text += "\n\n" + table(["DATE", "STORED", "PUBLISHES", "RESTORES", "MISSES", "HITS"],
                               [[d["date"], format_size(d["stored_bytes"]), d["publishes"], d.get("restores", "-"),
                                 d["misses"], d["hits"]]
                                for d in daily])
    return text


# -- formatting -----------------------------------------------------------------------------------

def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Plain columns, two spaces apart; numbers right-aligned; long cells cut to MAX_CELL characters."""
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = [bool(cells) and all(_is_number(r[i]) for r in cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in cells])


def _cell(value: object) -> str:
    text = "-" if value is None else " ".join(str(value).split())
    return text if len(text) <= MAX_CELL else text[:MAX_CELL - 3] + "..."


def _is_number(text: str) -> bool:
    return text.replace(".", "", 1).isdigit()


def _percent(rate: Optional[float]) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def _date(iso: Optional[str]) -> str:
    return iso.replace("T", " ")[:16] if iso else "-"
