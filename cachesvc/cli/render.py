"""What the admin commands print, from the admin API's answers (the same dicts in both modes)."""
from __future__ import annotations

from typing import Iterable, List

from cachesvc_client.shared.units import format_size


def purge_lines(result: dict) -> List[str]:
    verb = "would purge" if result["dry_run"] else "purged"
    lines = [f"{verb} {e['name']} {e['shape']} ({e['env']['torch']}, {e['env']['device']}): "
             f"versions {', '.join(map(str, e['versions']))} ({format_size(e['bytes'])})" for e in result["entries"]]
    n = len(result["entries"])
    lines.append(f"{verb} {result['version_count']} version(s) of {n} entr{'y' if n == 1 else 'ies'}; "
                 f"{format_size(result['bytes_freed'])} freed {'once' if result['dry_run'] else 'when'} "
                 f"the GC grace has passed")
    if result.get("gc"):
        lines.append(gc_line(result["gc"]))
    return lines


def gc_line(r: dict) -> str:
    orphans = r["orphans_deleted"] + r.get("orphan_packs_deleted", 0)
    line = (f"gc: {r['blobs_deleted']} blobs and {r.get('packs_deleted', 0)} packs ({format_size(r['bytes_freed'])}) "
            f"deleted, {orphans} orphan objects, {r['versions_deleted']} dead versions, "
            f"{r['entries_deleted']} empty entries")
    if r.get("delete_failures"):
        line += f"; {r['delete_failures']} object deletes failed (the next gc retries them)"
    return line


def token_created(t: dict) -> List[str]:
    """The token alone on the last line (scripts take it with `tail -1`)."""
    return [f"created token {t['id']} {t['name']!r} with scope {t['scope']}; keep it secret, it is not stored:",
            t["token"]]


def token_rows(tokens: Iterable[dict]) -> List[str]:
    return [f"{t['id']:>4}  {t['name']:<24} {t['scope']:<6} created {t['created_at']}"
            + (f"  revoked {t['revoked_at']}" if t["revoked_at"] else "") for t in tokens]


def revoked(tokens: Iterable[dict]) -> List[str]:
    return [f"revoked token {t['id']} {t['name']!r} ({t['scope']})" for t in tokens]
