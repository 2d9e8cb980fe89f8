"""Request schemas (marshmallow). flask-smorest validates requests with them
and writes them into the OpenAPI document at /api/v1/openapi.json.

Unknown fields are refused (marshmallow's default RAISE). Key, path and
digest rules come from ``cachesvc_client.shared.keys`` so client and service agree.
"""
from __future__ import annotations

from cachesvc_client.shared import keys, signing
from cachesvc_client.shared.rules import ENCODINGS
from marshmallow import Schema, ValidationError, fields, validate, validates_schema
from webargs.fields import DelimitedList

from .resolve import FALLBACK_STEPS


def _rule(check):
    def validator(value):
        try:
            check(value)
        except keys.InvalidKey as exc:
            raise ValidationError(str(exc)) from None
    return validator


def _printable(value):
    if not value.isprintable():  # the rule of keys.check_env; PostgreSQL also refuses NUL in text
        raise ValidationError("contains control characters or invalid unicode (a lone surrogate)")


def _text(max_len, **kw):
    return fields.String(validate=[validate.Length(min=1, max=max_len), _printable], **kw)


def _unicode(value):
    """Free text (meta, folders) may hold any character that has UTF-8 and that PostgreSQL stores."""
    if "\x00" in value:
        raise ValidationError("contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError("contains invalid unicode (a lone surrogate)") from None


def _free_text(max_len, **kw):
    return fields.String(validate=[validate.Length(max=max_len), _unicode], **kw)


def _filter(max_len, *more, **kw):
    """A filter compared with stored key text: the rules of that text (printable, its length), so a
    value no entry can hold is the same 422 on every database (PostgreSQL refuses NUL itself)."""
    return fields.String(validate=[validate.Length(max=max_len), _printable, *more], **kw)


#: the largest page offset of a listing (the JSON API and the HTML index)
MAX_OFFSET = 10**9


def _env_fields() -> dict:
    """The key's environment fields (``keys.ENV_FIELDS``), each required text: in a body's ``env`` and
    as resolve's query arguments alike."""
    return {f: _text(keys.MAX_ENV_VALUE, required=True) for f in keys.ENV_FIELDS}


EnvSchema = Schema.from_dict(_env_fields(), name="EnvSchema")


class FamilyKeySchema(Schema):
    """A key without its shape: a key family (``keys.family_digest``)."""
    name = fields.String(required=True, validate=_rule(keys.check_name))
    tags = fields.Dict(keys=fields.String(), values=fields.String(), load_default=dict,
                       validate=_rule(keys.check_tags))
    env = fields.Nested(EnvSchema, required=True)


class KeySchema(FamilyKeySchema):
    shape = fields.String(required=True, validate=_rule(keys.check_shape))


class FileSchema(Schema):
    root = fields.String(required=True, validate=_rule(keys.check_role))
    path = fields.String(required=True, validate=_rule(keys.check_relpath))
    sha256 = fields.String(required=True, validate=_rule(keys.check_digest))
    size = fields.Integer(required=True, strict=True, validate=validate.Range(0, keys.MAX_FILE_SIZE))
    mode = fields.Integer(load_default=0o644, strict=True, validate=validate.Range(0, 0o7777))


def _signature(value):
    try:
        signing.check_record(value)
    except signing.SigningError as exc:
        raise ValidationError(str(exc)) from None


class SignatureInSchema(Schema):
    public_key = fields.String(required=True, validate=validate.Length(max=signing.MAX_PUBLIC_KEY))
    signature = fields.String(required=True, validate=validate.Length(max=signing.MAX_SIGNATURE))


class PublishSchema(Schema):
    key = fields.Nested(KeySchema, required=True)
    kind = fields.String(load_default=keys.DEFAULT_KIND, validate=validate.OneOf(keys.KINDS))
    roots = fields.Dict(keys=fields.String(validate=_rule(keys.check_role)),
                        values=_free_text(4096, required=True), required=True)
    files = fields.List(fields.Nested(FileSchema), required=True)
    compile_seconds = fields.Float(load_default=None, allow_none=True, validate=validate.Range(0, 10**7))
    meta = fields.Dict(keys=_free_text(64), values=_free_text(1000), load_default=dict)
    merge = fields.Boolean(load_default=False, metadata={
        "description": "add the key's newest committed version's files at paths this manifest lacks, so the key "
                       "converges to the union of what its publishers compiled"})
    signature = fields.Nested(SignatureInSchema, load_default=None, validate=_signature, metadata={
        "description": "the publisher's Ed25519 signature of the manifest and key (cachesvc_client.shared.signing), "
                       "stored with the version and checked for shape only; a signed publish is never merged"})
    inline_targets = fields.Boolean(load_default=True, metadata={
        "description": "false: the answer lists each blob to upload as {sha256, size} only, and the client asks "
                       "for upload targets in batches (POST /api/v1/versions/<id>/uploads) as it uploads: an "
                       "answer that grows by ~90 bytes a blob, not ~1 KB of presigned URLs"})


class UploadedSchema(Schema):
    sha256 = fields.String(required=True, validate=_rule(keys.check_digest))
    encoding = fields.String(required=True, validate=validate.OneOf(ENCODINGS))


class PackMemberSchema(Schema):
    sha256 = fields.String(required=True, validate=_rule(keys.check_digest))
    offset = fields.Integer(required=True, strict=True, validate=validate.Range(0, 2**40))
    stored_size = fields.Integer(required=True, strict=True, validate=validate.Range(0, 2**40))
    encoding = fields.String(required=True, validate=validate.OneOf(ENCODINGS))
    size = fields.Integer(required=True, strict=True, validate=validate.Range(0, keys.MAX_FILE_SIZE))


class PackIndexSchema(Schema):
    sha256 = fields.String(required=True, validate=_rule(keys.check_digest),
                           metadata={"description": "sha256 of the pack's bytes (its name)"})
    members = fields.List(fields.Nested(PackMemberSchema), required=True, validate=validate.Length(min=1, max=100_000))


class CommitSchema(Schema):
    uploaded = fields.List(fields.Nested(UploadedSchema), load_default=list)
    packs = fields.List(fields.Nested(PackIndexSchema), load_default=list, metadata={
        "description": "packs uploaded for this version, each with where its members lie (cachesvc.content.packs)"})


class PackTargetSchema(Schema):
    sha256 = fields.String(required=True, validate=_rule(keys.check_digest))
    size = fields.Integer(required=True, strict=True, validate=validate.Range(0, 2**40))


class PackTargetsSchema(Schema):
    packs = fields.List(fields.Nested(PackTargetSchema), required=True, validate=validate.Length(min=1, max=10_000))


class UploadTargetsSchema(Schema):
    blobs = fields.List(fields.String(validate=_rule(keys.check_digest)), required=True,
                        validate=validate.Length(min=1, max=1000),
                        metadata={"description": "sha256 of blobs the create answer listed to upload"})
    zstd_sizes = fields.Dict(keys=fields.String(validate=_rule(keys.check_digest)),
                             values=fields.Integer(strict=True, validate=validate.Range(1, keys.MAX_FILE_SIZE)),
                             load_default=dict, validate=validate.Length(max=1000), metadata={
        "description": "sha256 -> the length of the blob's zstd body, compressed already: its zstd target is then "
                       "presigned for exactly that length (a target marked needs_size was the service's own)"})


class PackPutArgs(Schema):
    version = fields.Integer(required=True, validate=validate.Range(1, 2**31 - 1),
                             metadata={"description": "the pending version the pack is for"})


class BlobPutArgs(Schema):
    encoding = fields.String(load_default="identity", validate=validate.OneOf(ENCODINGS))
    version = fields.Integer(validate=validate.Range(1, 2**31 - 1),
                             metadata={"description": "the pending version that was told to upload the blob "
                                                      "(its upload target names it)"})


class ResolveArgs(Schema.from_dict(_env_fields(), name="ResolveEnvArgs")):
    name = fields.String(required=True, validate=_rule(keys.check_name))
    shape = fields.String(required=True, validate=_rule(keys.check_shape))
    tags = fields.String(load_default="{}", metadata={"description": "JSON object of string tags"})
    fallback = DelimitedList(fields.String(validate=validate.OneOf(FALLBACK_STEPS)), load_default=list,
                                    metadata={"description": "comma-separated steps tried in order when the exact "
                                                             "key has no version: shape (same key, any shape: "
                                                             "newest), shapes (the most restored shapes, up to "
                                                             "fallback_max_bytes), name (same environment, any "
                                                             "name)"})
    fallback_max_bytes = fields.Integer(validate=validate.Range(0, 2**62), metadata={
        "description": "byte budget of the `shapes` step; default CACHESVC_FALLBACK_MAX_BYTES"})
    kind = fields.String(load_default=keys.DEFAULT_KIND, validate=validate.OneOf(keys.KINDS),
                         metadata={"description": "the version kind wanted: " + ", ".join(keys.KINDS)})
    count = fields.Boolean(load_default=True, metadata={
        "description": "false: a look (`cachesvc-client check`), not a restore: no restore or miss is recorded"})


class VerdictSchema(Schema):
    versions = fields.List(fields.Integer(strict=True, validate=validate.Range(1, 2**31 - 1)), required=True,
                           validate=validate.Length(min=1, max=100),
                           metadata={"description": "the versions the restore delivered"})
    verdict = fields.String(required=True, validate=validate.OneOf(["paid_off", "partial", "no_hits"]))
    fallback = fields.String(load_default="", validate=validate.OneOf(("",) + FALLBACK_STEPS),
                             metadata={"description": "the fallback step of the restore; empty: the exact key"})
    first_call_seconds = fields.Float(load_default=None, allow_none=True, validate=validate.Range(0, 10**7), metadata={
        "description": "how long the restored process's first compiled call took; with a hit verdict the stats "
                       "count the version's compile_seconds minus this as saved (without it: nothing saved)"})


#: the bounds of a usage report (POST /api/v1/usage): key families a request, shapes a family, calls a count
MAX_USAGE_REPORTS = 16
MAX_USAGE_SHAPES = 64
MAX_CALLS = 2**31 - 1
SERVED_BY = ("package", "compile", "eager")


def _calls(how: str):
    return fields.Integer(required=True, strict=True, validate=validate.Range(0, MAX_CALLS),
                          metadata={"description": f"calls of this shape served {how}"})


class ServedSchema(Schema):
    package = _calls("by a package (the precompiled artifact the one call restored)")
    compile = _calls("by torch.compile")
    eager = _calls("by the model itself, uncompiled")

    @validates_schema
    def _some_calls(self, data, **_kw):
        if not any(data.get(how) for how in SERVED_BY):
            raise ValidationError("a shape needs at least one call: package, compile or eager above 0")


class UsageShapeSchema(Schema):
    shape = fields.String(required=True, validate=_rule(keys.check_shape),
                          metadata={"description": "the calls' input shape signature (the key's shape text)"})
    served = fields.Nested(ServedSchema, required=True,
                           metadata={"description": "the calls since the last report, by how each was served"})


class UsageReportSchema(Schema):
    key = fields.Nested(FamilyKeySchema, required=True,
                        metadata={"description": "the key family: the model's key without its shape"})
    shapes = fields.List(fields.Nested(UsageShapeSchema), required=True,
                         validate=validate.Length(min=1, max=MAX_USAGE_SHAPES),
                         metadata={"description": "each shape once, with its calls"})

    @validates_schema
    def _each_shape_once(self, data, **_kw):
        seen = set()
        for item in data["shapes"]:
            if item["shape"] in seen:
                raise ValidationError(f"shape {item['shape'][:100]!r} is given twice; give each shape once, its "
                                      f"calls summed", field_name="shapes")
            seen.add(item["shape"])


class UsageSchema(Schema):
    reports = fields.List(fields.Nested(UsageReportSchema), required=True,
                          validate=validate.Length(min=1, max=MAX_USAGE_REPORTS),
                          metadata={"description": "one item per key family (model) the process served"})
    seconds = fields.Float(load_default=None, allow_none=True, validate=validate.Range(0, 86400), metadata={
        "description": "the time the counts cover (since the sender's last report), for the reader; not stored"})


def _env_filter(field: str):
    return _text(keys.MAX_ENV_VALUE, metadata={"description": f"the environment's {field}: only its key families "
                                                              f"(all six environment fields, or none)"})


class DemandArgs(Schema.from_dict({f: _env_filter(f) for f in keys.ENV_FIELDS}, name="DemandEnvArgs")):
    name = fields.String(required=True, validate=_rule(keys.check_name), metadata={"description": "the model's name"})
    limit = fields.Integer(load_default=64, validate=validate.Range(1, 256),
                           metadata={"description": "shapes listed per key family, the most called first"})

    @validates_schema
    def _whole_environment(self, data, **_kw):
        given = [f for f in keys.ENV_FIELDS if f in data]
        if given and len(given) < len(keys.ENV_FIELDS):
            missing = [f for f in keys.ENV_FIELDS if f not in data]
            raise ValidationError(f"give every environment field ({', '.join(keys.ENV_FIELDS)}) or none; "
                                  f"missing: {', '.join(missing)}")


SORTS = ("newest", "largest", "most_restored", "last_restored")


class EntryFilterArgs(Schema):
    name = _filter(keys.MAX_NAME, metadata={"description": "exact name"})
    shape = _filter(keys.MAX_SHAPE, metadata={"description": "exact shape signature"})
    tags = fields.String(metadata={"description": "JSON object; entries whose tags equal it"})
    tag = fields.List(_filter(keys.MAX_TAG_KEY + 1 + keys.MAX_TAG_VALUE,
                              validate.Regexp(r"^[^=]+=.*$", error="expected KEY=VALUE")),
                      metadata={"description": "KEY=VALUE (repeatable); entries whose tags include every pair"})
    torch = _filter(keys.MAX_ENV_VALUE, metadata={"description": "exact torch version"})
    triton = _filter(keys.MAX_ENV_VALUE, metadata={"description": "exact Triton version"})
    cuda = _filter(keys.MAX_ENV_VALUE, metadata={"description": "exact CUDA version"})
    python = _filter(keys.MAX_ENV_VALUE, metadata={"description": "exact Python version"})
    device = _filter(keys.MAX_ENV_VALUE, metadata={"description": "exact device (the GPU name, else the CPU machine)"})
    arch = _filter(keys.MAX_ENV_VALUE, metadata={"description": "exact arch (sm_90, a gfx name, else the CPU's vector level)"})
    problem = fields.Boolean(metadata={"description": "true: only entries whose newest version's restores got no "
                                                      "cache hit (client.verify()); false: only the others"})
    kind = fields.String(validate=validate.OneOf(keys.KINDS),
                         metadata={"description": "entries with a committed version of this kind"})
    sort = fields.String(load_default="newest", validate=validate.OneOf(SORTS),
                         metadata={"description": "newest (last published), largest (newest version's bytes), "
                                                  "most_restored, last_restored"})
    limit = fields.Integer(load_default=50, validate=validate.Range(1, 1000))
    offset = fields.Integer(load_default=0, validate=validate.Range(0, MAX_OFFSET))


class StatsArgs(Schema):
    days = fields.Integer(load_default=30, validate=validate.Range(1, 3660),
                          metadata={"description": "days in the daily series"})


class PurgeSchema(Schema):
    not_restored_for = fields.Float(validate=validate.Range(0, 10**5), metadata={
        "description": "days since the version was last restored (a version never restored: since it was created)"})
    older_than = fields.Float(validate=validate.Range(0, 10**5), metadata={"description": "days since created"})
    keep_latest = fields.Integer(strict=True, validate=validate.Range(0, 10**6),
                                 metadata={"description": "keep this many newest versions of every key and kind"})
    torch_version = _text(200)
    name = _text(200)
    device = _text(200)
    max_total_bytes = fields.Integer(strict=True, validate=validate.Range(0, 2**62), metadata={
        "description": "evict the least recently restored (matching) versions until the stored bytes of "
                       "the committed versions fit"})
    dry_run = fields.Boolean(load_default=False, metadata={"description": "report, change nothing"})


class AuditArgs(Schema):
    action = fields.String(validate=validate.OneOf(["publish", "purge", "gc", "token.create", "token.revoke"]))
    limit = fields.Integer(load_default=100, validate=validate.Range(1, 1000))
    offset = fields.Integer(load_default=0, validate=validate.Range(0, MAX_OFFSET))


class TokenCreateSchema(Schema):
    name = _text(100, required=True)
    scope = fields.String(required=True, validate=validate.OneOf(["read", "write", "admin"]))


class ErrorDetailSchema(Schema):
    code = fields.String(required=True, metadata={"description": "machine-readable, e.g. unauthorized"})
    message = fields.String(required=True)
    details = fields.Raw()


class ErrorSchema(Schema):
    """Every error answer: ``{"error": {"code", "message", "details"}}`` (see cachesvc.errors)."""

    error = fields.Nested(ErrorDetailSchema, required=True)
