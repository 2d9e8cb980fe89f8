"""The answers' schemas (marshmallow): what the 2xx answers hold, for the OpenAPI document and Swagger UI.

flask-smorest dumps a view's answer through its schema, so each schema lists every field the view
returns: a field missing here is dropped from the answer, silently (the dumped answer still matches
the document). The fuzz test checks every answer against the document (schemathesis'
response_schema_conformance), where an answer's schema refuses fields it does not list
(``additionalProperties: false``): that catches a field added to a view and not listed only for the
answers sent as the view built them (``version_answers.VerbatimDump``: publish, a version, resolve, an
entry). Times are ISO 8601 UTC strings (``2026-01-31T12:00:00Z``), as ``index.iso`` writes them.
"""
from __future__ import annotations

from marshmallow import Schema, fields


def _d(text: str, **kw) -> dict:
    return dict(metadata={"description": text}, **kw)


def _time(text: str, nullable: bool = False):
    return fields.String(**_d(text + " (ISO 8601, UTC)", allow_none=nullable))


class HealthSchema(Schema):
    status = fields.String(**_d("`ok`: the database answers (and, for /readyz, the blob storage)"))
    version = fields.String(**_d("the service's version"))


class TokenSchema(Schema):
    id = fields.Integer(**_d("the token's id"))
    name = fields.String(**_d("the token's name"))
    scope = fields.String(**_d("read, write or admin (each includes the ones before it)"))
    created_at = _time("when it was created")
    revoked_at = _time("when it was revoked; null while it is active", nullable=True)


class TokenListSchema(Schema):
    tokens = fields.List(fields.Nested(TokenSchema), **_d("every token, oldest first (never the token itself)"))


class TokenCreatedSchema(TokenSchema):
    token = fields.String(**_d("the bearer token: shown this once, store it now"))


class TokenRevokedSchema(Schema):
    revoked = fields.List(fields.Nested(TokenSchema), **_d("the tokens this revoked"))


class VerdictCountsSchema(Schema):
    id = fields.Integer(**_d("the version's id"))
    verify_count = fields.Integer(**_d("verdicts recorded for the version"))
    no_hit_count = fields.Integer(**_d("of those, restores that delivered files but got no cache hit"))
    last_verdict = fields.String(**_d("the last trusted verdict: paid_off, partial or no_hits; null before one",
                                      allow_none=True))
    problem = fields.Boolean(**_d("the last trusted verdict was no_hits: the version restores but does not hit"))


class VerdictAnswerSchema(Schema):
    versions = fields.List(fields.Nested(VerdictCountsSchema), **_d("each version's counters after this verdict"))
    counted_toward_problem = fields.Boolean(**_d(
        "whether this verdict can set `problem`: sent with a token and for an exact-key restore"))


class RemoteCacheItemSchema(Schema):
    cache = fields.String(**_d("the remote cache's name (fx-graph, autotune, ...)"))
    key = fields.String(**_d("Inductor's key of the value"))
    sha256 = fields.String(**_d("sha256 of the value's bytes, checked at every GET"))
    size = fields.Integer(**_d("the value's size in bytes"))


class BlobStoredSchema(Schema):
    sha256 = fields.String(**_d("the blob's sha256 (of its decoded bytes)"))
    size = fields.Integer(**_d("decoded size in bytes"))
    stored_size = fields.Integer(**_d("size as stored (zstd frames or identity) in bytes"))
    encoding = fields.String(**_d("how it is stored: identity or zstd"))
    status = fields.String(**_d("stored (written now) or already_stored (stored meanwhile; nothing written)"))


class BlobDamageSchema(Schema):
    sha256 = fields.String(**_d("the blob's sha256"))
    status = fields.String(**_d("intact (its stored bytes decode to it: nothing changed), forgotten (they do not: "
                                "the next publish naming it uploads it again) or not_stored"))
    reason = fields.String(**_d("what was wrong with the stored bytes (forgotten only)"))


class PackStoredSchema(Schema):
    sha256 = fields.String(**_d("the pack's sha256 (its name)"))
    stored_size = fields.Integer(**_d("the pack's size in bytes"))
    status = fields.String(**_d("stored (written now) or already_stored (recorded meanwhile; nothing written)"))


class UploadTargetSchema(Schema):
    method = fields.String(**_d("the HTTP method to send the bytes with (PUT)"))
    url = fields.String(**_d("where to send them: a presigned S3 URL, or a path on this service"))
    headers = fields.Dict(keys=fields.String(), values=fields.String(), **_d("headers the request must carry"))
    needs_size = fields.Boolean(**_d("true on a zstd target of this service where storage takes presigned uploads: "
                                     "each is signed for one length, so ask POST /api/v1/versions/<id>/uploads "
                                     "with zstd_sizes once the body is compressed, or send it here"))


class PackUploadTargetSchema(Schema):
    sha256 = fields.String(**_d("the pack's sha256"))
    target = fields.Nested(UploadTargetSchema, **_d("where to upload it"))


class PackUploadTargetsSchema(Schema):
    targets = fields.List(fields.Nested(PackUploadTargetSchema), **_d("one upload target per pack asked for"))


class BlobEncodingTargetsSchema(Schema):
    identity = fields.Nested(UploadTargetSchema, **_d("where to upload the blob's bytes as they are"))
    zstd = fields.Nested(UploadTargetSchema, **_d("where to upload them as zstd frames"))


class BlobUploadTargetSchema(Schema):
    sha256 = fields.String(**_d("the blob's sha256 (of its decoded bytes)"))
    targets = fields.Nested(BlobEncodingTargetsSchema, **_d("one upload target per encoding; send one of them"))


class BlobUploadTargetsSchema(Schema):
    targets = fields.List(fields.Nested(BlobUploadTargetSchema),
                          **_d("an upload target for each blob asked for that is not stored yet"))
    stored = fields.List(fields.String(), **_d("blobs asked for that a concurrent publish stored since the "
                                              "create answer (nothing to upload)"))


class GcSchema(Schema):
    blobs_deleted = fields.Integer(**_d("blobs no protecting version names, deleted"))
    bytes_freed = fields.Integer(**_d("stored bytes those deletions freed"))
    delete_failures = fields.Integer(**_d("objects storage failed to delete (retried by the next GC)"))
    entries_deleted = fields.Integer(**_d("entries left without versions, deleted"))
    incoming_deleted = fields.Integer(**_d("uploads of versions that never committed, deleted: temp files cut off mid-body (local) or presigned uploads left in the incoming folder (S3)"))
    orphan_packs_deleted = fields.Integer(**_d("pack objects no row records, deleted"))
    orphans_deleted = fields.Integer(**_d("blob objects no row records, deleted"))
    packs_deleted = fields.Integer(**_d("packs no stored blob lies in any more, deleted"))
    remote_cache_items_evicted = fields.Integer(**_d("remote-cache items evicted (CACHESVC_REMOTE_CACHE_*)"))
    versions_deleted = fields.Integer(**_d("rows of expired pending and long-purged versions, deleted"))


class AuditRecordSchema(Schema):
    id = fields.Integer(**_d("the record's id"))
    at = _time("when it happened")
    actor = fields.String(**_d("who: token:<name>, anonymous or cli:<user>"))
    action = fields.String(**_d("publish, purge, gc, token.create or token.revoke"))
    target = fields.String(**_d("what it acted on, e.g. `entry 3 version 7`"))
    bytes = fields.Integer(**_d("bytes published, or freed"))
    details = fields.Dict(**_d("the action's own details (a publish's files, a GC's counters)"))


class AuditListSchema(Schema):
    records = fields.List(fields.Nested(AuditRecordSchema), **_d("the records, newest first"))
    limit = fields.Integer(**_d("the page size asked for"))
    offset = fields.Integer(**_d("records skipped"))


class StatsDaySchema(Schema):
    date = fields.String(**_d("the day (YYYY-MM-DD, UTC)"))
    stored_bytes = fields.Integer(**_d("stored bytes at the day's end"))
    restores = fields.Integer(**_d("resolves that delivered a version that day"))
    misses = fields.Integer(**_d("resolves that delivered nothing that day"))
    verdicts = fields.Integer(**_d("verdicts reported that day (client.verify())"))
    hits = fields.Integer(**_d("verdicts that saw cache hits that day"))
    hit_rate = fields.Float(**_d("the day's hits / verdicts; null on a day without verdicts", allow_none=True))
    compile_seconds_saved = fields.Float(**_d("compile seconds the day's hit verdicts saved"))
    publishes = fields.Integer(**_d("versions published that day"))


class StatsSchema(Schema):
    entries = fields.Integer(**_d("entries (keys) with at least one version"))
    versions = fields.Integer(**_d("committed versions"))
    blobs = fields.Integer(**_d("stored blobs"))
    logical_bytes = fields.Integer(**_d("bytes the committed versions' files add up to"))
    stored_bytes = fields.Integer(**_d("bytes stored for them (each blob once, compressed)"))
    dedup_ratio = fields.Float(**_d("logical_bytes / stored_bytes; null when nothing is stored", allow_none=True))
    publishes = fields.Integer(**_d("versions published"))
    restores = fields.Integer(**_d("resolves that delivered a version"))
    misses = fields.Integer(**_d("resolves that delivered nothing"))
    fallbacks = fields.Integer(**_d("of the restores, those a fallback step answered"))
    restore_rate = fields.Float(**_d("restores / (restores + misses); null before any", allow_none=True))
    verdicts = fields.Dict(keys=fields.String(), values=fields.Integer(),
                           **_d("verdicts by kind: paid_off, partial, no_hits"))
    hits = fields.Integer(**_d("verdicts that saw cache hits (paid_off, partial)"))
    hit_rate = fields.Float(**_d("hits / verdicts; null before any", allow_none=True))
    compile_seconds_saved = fields.Float(**_d(
        "cold compile seconds minus the restored first call, summed over exact-key hit verdicts"))
    gc_runs = fields.Integer(**_d("garbage collections run"))
    daily = fields.List(fields.Nested(StatsDaySchema), **_d("one row per day, oldest first"))


class DroppedShapeSchema(Schema):
    shape = fields.String(**_d("a shape of the report that was not recorded"))
    reason = fields.String(**_d("why: the name has no entry, or a cap (the setting named) is reached"))


class UsageRecordedSchema(Schema):
    name = fields.String(**_d("the model's name, as reported"))
    family = fields.String(**_d("the key family's digest (keys.family_digest of name, tags and env)"))
    shapes = fields.Integer(**_d("how many of the report's shapes were recorded"))
    dropped = fields.List(fields.Nested(DroppedShapeSchema), **_d("the shapes not recorded, each with why"))


class UsageAnswerSchema(Schema):
    recorded = fields.List(fields.Nested(UsageRecordedSchema), **_d("one item per report item, in order"))


class ServedCallsSchema(Schema):
    package = fields.Integer(**_d("calls served by a package"))
    compile = fields.Integer(**_d("calls served by torch.compile"))
    eager = fields.Integer(**_d("calls served by the model itself, uncompiled"))


class DemandShapeSchema(Schema):
    shape = fields.String(**_d("the input shape signature"))
    calls = fields.Integer(**_d("its calls reported so far, however served"))
    served = fields.Nested(ServedCallsSchema, **_d("those calls by how each was served"))
    first_seen = _time("when a report first named it")
    last_seen = _time("when a report last named it")


class DemandFamilySchema(Schema):
    name = fields.String(**_d("the model's name"))
    family = fields.String(**_d("the key family's digest (keys.family_digest of name, tags and env)"))
    env = fields.Dict(keys=fields.String(), values=fields.String(), **_d("the family's environment fields"))
    tags = fields.Dict(keys=fields.String(), values=fields.String(), **_d("the family's tags"))
    calls = fields.Integer(**_d("the calls of all its shapes on record"))
    shapes = fields.List(fields.Nested(DemandShapeSchema), **_d(
        "its most called shapes (up to `limit`), by calls, then by shape text"))
    shapes_on_record = fields.Integer(**_d("how many shapes the family has on record (CACHESVC_DEMAND_MAX_SHAPES "
                                           "at most)"))


class DemandAnswerSchema(Schema):
    items = fields.List(fields.Nested(DemandFamilySchema), **_d(
        "the name's key families, the most called first; empty when nothing was reported for it"))
