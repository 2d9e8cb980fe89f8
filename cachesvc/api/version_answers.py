"""The schemas of the answers that carry entries and versions: publish, commit, a version, resolve, the
entries listing and detail, purge (the rules of ``cachesvc.api.answers`` hold: every field the view
returns is listed and described, and an answer holding a field not listed fails the fuzz test).

Split from ``answers`` to keep modules small; the building blocks (an entry, a version, a file row) are
shared by several answers here.
"""
from __future__ import annotations

from marshmallow import Schema, fields

from .answers import BlobEncodingTargetsSchema, GcSchema, _d, _time


class VerbatimDump:
    """For answers that grow with a version's files (up to CACHESVC_MAX_FILES): flask-smorest sends the
    answer as the view built it instead of dumping it field by field, which cost 12 us a file (a 1,000-file
    resolve 11.5 ms more, 5x its JSON encoding; resolve's budget is 20 ms at p99). The schema still
    documents the answer, and the fuzz test's response_schema_conformance fails on a field the view adds
    and the schema does not list (``additionalProperties: false``), where a dump would drop it silently."""

    def dump(self, obj, *, many=None):
        return obj

# -- entries, versions and their files (index.entry_summary, version_summary, file_row) ------------------

def _strings(text: str):
    return fields.Dict(keys=fields.String(), values=fields.String(), **_d(text))


class EntrySummarySchema(Schema):
    id = fields.Integer(**_d("the entry's id"))
    name = fields.String(**_d("the key's name"))
    shape = fields.String(**_d("the key's shape"))
    tags = _strings("the key's tags")
    env = _strings("the key's environment: torch, triton, cuda, python, device, arch")
    created_at = _time("when the entry was created")
    last_restored_at = _time("when a resolve last delivered one of its versions; null before any", nullable=True)
    restore_count = fields.Integer(**_d("resolves that delivered one of its versions"))


class SignatureSchema(Schema):
    public_key = fields.String(**_d("the signer's OpenSSH public key line (ssh-ed25519 AAAA... comment)"))
    signature = fields.String(**_d("base64 of the Ed25519 signature of cachesvc_client.shared.signing.manifest_bytes"))


class SignerSchema(Schema):
    fingerprint = fields.String(**_d("SHA256:... of the key, as ssh-keygen -l prints it"))
    comment = fields.String(**_d("the key's comment (who made it, e.g. ci@build)"))


class VersionSummarySchema(Schema):
    id = fields.Integer(**_d("the version's id"))
    entry_id = fields.Integer(**_d("the id of its entry (its key)"))
    kind = fields.String(**_d("what it holds: inductor-dir (a cache directory snapshot) or another kind"))
    state = fields.String(**_d("pending (uploading), committed (resolvable) or purged (awaiting GC)"))
    manifest_digest = fields.String(**_d("sha256 of its manifest (its files' roots, paths, sha256 and modes)"))
    file_count = fields.Integer(**_d("files in the version"))
    total_bytes = fields.Integer(**_d("the files' sizes added up"))
    roots = _strings("each root (role) with the absolute folder it was published from")
    compile_seconds = fields.Float(**_d("the publisher's cold compile seconds; null when not reported",
                                        allow_none=True))
    meta = _strings("the publisher's metadata (host, client version...), plus the service's linked_from "
                    "and merged_with")
    created_at = _time("when the publish started")
    committed_at = _time("when it was committed; null while pending", nullable=True)
    last_restored_at = _time("when a resolve last delivered it; null before any", nullable=True)
    restore_count = fields.Integer(**_d("resolves that delivered it"))
    verify_count = fields.Integer(**_d("verdicts recorded for it"))
    no_hit_count = fields.Integer(**_d("of those, restores that delivered files but got no cache hit"))
    last_verdict = fields.String(**_d("the last trusted verdict: paid_off, partial or no_hits; null before one",
                                      allow_none=True))
    problem = fields.Boolean(**_d("the last trusted verdict was no_hits: the version restores but does not hit"))
    signature = fields.Nested(SignatureSchema, allow_none=True, metadata={
        "description": "the publisher's Ed25519 signature of the manifest and key (checked for shape only; "
                       "clients with CACHESVC_TRUSTED_KEYS verify it); null: unsigned"})
    signed_by = fields.Nested(SignerSchema, allow_none=True, metadata={
        "description": "the signing key's fingerprint (SHA256:..., as ssh-keygen -l) and comment; null: unsigned"})


class ManifestFileSchema(Schema):
    root = fields.String(**_d("the root (role) the path is relative to"))
    path = fields.String(**_d("the file's path under its root"))
    sha256 = fields.String(**_d("sha256 of the file's bytes (its blob)"))
    size = fields.Integer(**_d("the file's size in bytes"))
    mode = fields.Integer(**_d("the file's permission bits"))


class VersionDetailSchema(VerbatimDump, VersionSummarySchema):
    files = fields.List(fields.Nested(ManifestFileSchema), **_d("its files, by root and path"))


# -- publish (publish.versions.create_version, commit_version; publish.admission.link) -------------------

class BlobToUploadSchema(Schema):
    sha256 = fields.String(**_d("the blob's sha256 (of its decoded bytes)"))
    size = fields.Integer(**_d("its decoded size in bytes"))
    targets = fields.Nested(BlobEncodingTargetsSchema, **_d(
        "one upload target per encoding (send one of them); absent with `inline_targets: false`: ask "
        "POST /api/v1/versions/<id>/uploads"))


class PackingSchema(Schema):
    max_member = fields.Integer(**_d("blobs up to this many stored bytes may travel in a pack"))
    target_size = fields.Integer(**_d("the size to aim a pack at, in bytes"))
    max_size = fields.Integer(**_d("the largest pack the service takes, in bytes"))


class LinkedToSchema(Schema):
    entry_id = fields.Integer(**_d("the entry whose committed version has the same content"))
    version_id = fields.Integer(**_d("that version"))


class PublishAnswerSchema(VerbatimDump, Schema):
    status = fields.String(**_d("pending (upload, then commit), unchanged (equals the key's newest version) or "
                                "linked (equals another key's version: committed at once)"))
    entry = fields.Nested(EntrySummarySchema, **_d("the key's entry"))
    version = fields.Nested(VersionSummarySchema, **_d(
        "the pending version; the key's newest one (unchanged); the committed new one (linked)"))
    upload = fields.List(fields.Nested(BlobToUploadSchema), **_d(
        "the blobs the service lacks, to upload before the commit (empty unless pending)"))
    packing = fields.Nested(PackingSchema, **_d("how small blobs may travel in packs (pending only)"))
    linked_to = fields.Nested(LinkedToSchema, **_d("the version of equal content (linked only)"))


class CommitAnswerSchema(Schema):
    status = fields.String(**_d("committed, or unchanged (a concurrent publish committed the same content "
                                "first; this version was dropped)"))
    version = fields.Nested(VersionSummarySchema, **_d("the committed version (unchanged: the key's newest one)"))


# -- resolve (resolve.resolver, resolve.answer.blob_entries, resolve.fallback, resolve.explain) -----------

class ResolveBlobSchema(Schema):
    url = fields.String(**_d("where to GET the blob's stored bytes: a presigned URL or a path on this service "
                             "(a packed blob: the member alone)"))
    encoding = fields.String(**_d("how it is stored: identity or zstd"))
    size = fields.Integer(**_d("decoded size in bytes (equal to its files' size)"))
    stored_size = fields.Integer(**_d("size as stored in bytes"))
    stored_sha256 = fields.String(**_d("sha256 of the stored bytes, where the service checked them itself"))
    pack = fields.String(**_d("a packed blob: where to GET its pack (a ranged GET of the slice will do)"))
    pack_sha256 = fields.String(**_d("a packed blob: its pack's sha256"))
    pack_size = fields.Integer(**_d("a packed blob: its pack's size in bytes; null when unknown", allow_none=True))
    offset = fields.Integer(**_d("a packed blob: where its stored bytes start in the pack"))


class KeyDifferenceSchema(Schema):
    field = fields.String(**_d("the key field: name, shape, tags (as JSON text) or an environment field"))
    wanted = fields.String(**_d("its value in the key asked for"))
    have = fields.String(**_d("its value in this entry's key"))


class CandidateSchema(Schema):
    entry = fields.Nested(EntrySummarySchema, **_d("the entry"))
    version_id = fields.Integer(**_d("its newest committed version (a fallback: the version used)"))
    differs = fields.List(fields.Nested(KeyDifferenceSchema), **_d("the key fields it differs in"))
    env_differs = fields.Boolean(**_d("(nearest only) an environment field differs: no fallback can use it"))


class FallbackSchema(Schema):
    step = fields.String(**_d("the fallback step that answered: shape, shapes or name"))
    versions = fields.List(fields.Integer(), **_d("the versions delivered, in priority order (of two files at "
                                                  "one path, keep the first)"))
    entries = fields.List(fields.Nested(CandidateSchema), **_d("each version's entry and how its key differs"))


class ResolveAnswerSchema(VerbatimDump, Schema):
    hit = fields.Boolean(**_d("whether there is something to restore (the exact key, or a fallback)"))
    reason = fields.String(**_d("a miss or a fallback: why the exact key missed"))
    nearest = fields.List(fields.Nested(CandidateSchema), **_d(
        "a miss: the closest committed entries, fewest differing key fields first"))
    entry = fields.Nested(EntrySummarySchema, **_d("a hit: the entry (a fallback: the first version's)"))
    version = fields.Nested(VersionSummarySchema, **_d("a hit: the version (a fallback: the first one)"))
    files = fields.List(fields.Nested(ManifestFileSchema), **_d("a hit: the files to restore"))
    blobs = fields.Dict(keys=fields.String(), values=fields.Nested(ResolveBlobSchema),
                        **_d("a hit: where to fetch each blob, by its sha256"))
    fallback = fields.Nested(FallbackSchema, **_d("a fallback hit: which step answered, with which versions"))


# -- browse (readmodel.list_entries, entry_detail) --------------------------------------------------------

class EntryRowSchema(EntrySummarySchema):
    versions = fields.Integer(**_d("its committed versions (of the kind filtered on)"))
    size = fields.Integer(**_d("the newest committed version's bytes: what a restore fetches"))
    versions_bytes = fields.Integer(**_d("the bytes of all its committed versions"))
    newest_version_id = fields.Integer(**_d("its newest committed version"))
    last_published_at = _time("when its newest version was committed")
    problem = fields.Boolean(**_d("the newest version's last trusted verdict was no_hits"))
    kinds = fields.List(fields.String(), **_d("the kinds of its committed versions, sorted"))
    shared_bytes = fields.Integer(**_d("stored bytes of the newest version's blobs that another committed "
                                       "version names too"))
    purged_versions = fields.Integer(**_d("its versions purged and not yet removed by GC"))


class EntryListSchema(Schema):
    total = fields.Integer(**_d("entries matching the filters"))
    limit = fields.Integer(**_d("the page size asked for"))
    offset = fields.Integer(**_d("entries skipped"))
    sort = fields.String(**_d("the order: newest, largest, most_restored or last_restored"))
    next_offset = fields.Integer(**_d("the next page's offset; null on the last page", allow_none=True))
    entries = fields.List(fields.Nested(EntryRowSchema), **_d("the page's entries"))


class EntryFileSchema(ManifestFileSchema):
    stored_size = fields.Integer(**_d("its blob's stored size in bytes; null when the blob is not stored",
                                      allow_none=True))
    encoding = fields.String(**_d("its blob's encoding; null when the blob is not stored", allow_none=True))
    shared = fields.Boolean(**_d("another committed version (of any entry) names its blob too"))


class EntryVersionSchema(VersionSummarySchema):
    newest_of_kind = fields.Boolean(**_d("the newest committed version of its kind: what a resolve returns"))
    blob_count = fields.Integer(**_d("distinct blobs its files name"))
    stored_bytes = fields.Integer(**_d("stored bytes of those blobs"))
    shared_bytes = fields.Integer(**_d("stored bytes of those another committed version names too"))
    shared_with = fields.Dict(keys=fields.String(), values=fields.Integer(), **_d(
        "other versions of this entry (by id) with the number of blobs it shares with each"))
    files = fields.List(fields.Nested(EntryFileSchema), **_d("its files, by root and path"))


class SharedBlobsSchema(Schema):
    versions = fields.List(fields.Integer(), **_d("two versions of the entry"))
    blobs = fields.Integer(**_d("blobs both name"))
    stored_bytes = fields.Integer(**_d("those blobs' stored bytes"))


class EntryPurgedVersionSchema(VersionSummarySchema):
    purged_at = _time("when it was purged")


class EntryDetailSchema(VerbatimDump, EntrySummarySchema):
    versions = fields.List(fields.Nested(EntryVersionSchema), **_d("its committed versions, newest first"))
    shared_blobs = fields.List(fields.Nested(SharedBlobsSchema), **_d("each pair of versions that share blobs"))
    purged_versions = fields.List(fields.Nested(EntryPurgedVersionSchema), **_d(
        "its versions purged and not yet removed by GC (no files)"))
    size = fields.Integer(**_d("the newest committed version's bytes; 0 without one"))


# -- purge (lifecycle.collect.purge, lifecycle.actions.purge) ---------------------------------------------

class PurgeCriteriaSchema(Schema):
    not_restored_for = fields.Float(**_d("days since last restored (or created)"))
    older_than = fields.Float(**_d("days since created"))
    keep_latest = fields.Integer(**_d("newest versions kept of every key and kind"))
    torch_version = fields.String(**_d("the entries' torch version"))
    name = fields.String(**_d("the entries' name"))
    device = fields.String(**_d("the entries' device"))
    max_total_bytes = fields.Integer(**_d("the stored bytes the committed versions had to fit in"))


class PurgeEntrySchema(Schema):
    id = fields.Integer(**_d("the entry's id"))
    name = fields.String(**_d("the key's name"))
    shape = fields.String(**_d("the key's shape"))
    env = _strings("the key's environment")
    versions = fields.List(fields.Integer(), **_d("its versions purged"))
    bytes = fields.Integer(**_d("their total bytes"))


class PurgeVersionSchema(Schema):
    id = fields.Integer(**_d("the version's id"))
    entry_id = fields.Integer(**_d("its entry"))
    name = fields.String(**_d("its key's name"))
    total_bytes = fields.Integer(**_d("its files' bytes"))
    created_at = _time("when it was published")
    last_restored_at = _time("when a resolve last delivered it; null before any", nullable=True)


class PurgeAnswerSchema(Schema):
    dry_run = fields.Boolean(**_d("true: reported only, nothing changed"))
    criteria = fields.Nested(PurgeCriteriaSchema, **_d("the criteria given"))
    entries = fields.List(fields.Nested(PurgeEntrySchema), **_d("the entries with versions purged, by name"))
    versions = fields.List(fields.Nested(PurgeVersionSchema), **_d("the versions purged, least recently used first"))
    version_count = fields.Integer(**_d("how many"))
    bytes_freed = fields.Integer(**_d("stored bytes of blobs no remaining version names (GC deletes them after "
                                      "the grace)"))
    gc = fields.Nested(GcSchema, **_d("the GC run after the purge; null on a dry run", allow_none=True))
