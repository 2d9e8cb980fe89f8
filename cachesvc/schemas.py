"""Request schemas (marshmallow). flask-smorest validates requests with them
and writes them into the OpenAPI document at /api/v1/openapi.json.

Unknown fields are refused (marshmallow's default RAISE). Key, path and
digest rules come from ``cachesvc_client.keys`` so client and service agree.
"""
from __future__ import annotations

from cachesvc_client import keys
from marshmallow import Schema, ValidationError, fields, validate


def _rule(check):
    def validator(value):
        try:
            check(value)
        except keys.InvalidKey as exc:
            raise ValidationError(str(exc)) from None
    return validator


def _text(max_len, **kw):
    return fields.String(validate=validate.Length(min=1, max=max_len), **kw)


class EnvSchema(Schema):
    torch = _text(keys.MAX_ENV_VALUE, required=True)
    triton = _text(keys.MAX_ENV_VALUE, required=True)
    cuda = _text(keys.MAX_ENV_VALUE, required=True)
    python = _text(keys.MAX_ENV_VALUE, required=True)
    device = _text(keys.MAX_ENV_VALUE, required=True)
    arch = _text(keys.MAX_ENV_VALUE, required=True)


class KeySchema(Schema):
    name = fields.String(required=True, validate=_rule(keys.check_name))
    shape = fields.String(required=True, validate=_rule(keys.check_shape))
    tags = fields.Dict(keys=fields.String(), values=fields.String(), load_default=dict,
                       validate=_rule(keys.check_tags))
    env = fields.Nested(EnvSchema, required=True)


class FileSchema(Schema):
    root = fields.String(required=True, validate=_rule(keys.check_role))
    path = fields.String(required=True, validate=_rule(keys.check_relpath))
    sha256 = fields.String(required=True, validate=_rule(keys.check_digest))
    size = fields.Integer(required=True, strict=True, validate=validate.Range(0, keys.MAX_FILE_SIZE))
    mode = fields.Integer(load_default=0o644, strict=True, validate=validate.Range(0, 0o7777))


class PublishSchema(Schema):
    key = fields.Nested(KeySchema, required=True)
    kind = fields.String(load_default="inductor-dir", validate=validate.OneOf(["inductor-dir"]))
    roots = fields.Dict(keys=fields.String(validate=_rule(keys.check_role)),
                        values=fields.String(validate=validate.Length(min=1, max=4096)), required=True)
    files = fields.List(fields.Nested(FileSchema), required=True)
    compile_seconds = fields.Float(load_default=None, allow_none=True, validate=validate.Range(0, 10**7))
    meta = fields.Dict(keys=fields.String(validate=validate.Length(max=64)),
                       values=fields.String(validate=validate.Length(max=1000)), load_default=dict)


class UploadedSchema(Schema):
    sha256 = fields.String(required=True, validate=_rule(keys.check_digest))
    encoding = fields.String(required=True, validate=validate.OneOf(["identity", "zstd"]))


class CommitSchema(Schema):
    uploaded = fields.List(fields.Nested(UploadedSchema), load_default=list)


class BlobPutArgs(Schema):
    encoding = fields.String(load_default="identity", validate=validate.OneOf(["identity", "zstd"]))


class ResolveArgs(Schema):
    name = fields.String(required=True, validate=_rule(keys.check_name))
    shape = fields.String(required=True, validate=_rule(keys.check_shape))
    tags = fields.String(load_default="{}", metadata={"description": "JSON object of string tags"})
    torch = _text(keys.MAX_ENV_VALUE, required=True)
    triton = _text(keys.MAX_ENV_VALUE, required=True)
    cuda = _text(keys.MAX_ENV_VALUE, required=True)
    python = _text(keys.MAX_ENV_VALUE, required=True)
    device = _text(keys.MAX_ENV_VALUE, required=True)
    arch = _text(keys.MAX_ENV_VALUE, required=True)


class EntryFilterArgs(Schema):
    name = fields.String()
    shape = fields.String()
    tags = fields.String(metadata={"description": "JSON object; entries whose tags equal it"})
    torch = fields.String()
    triton = fields.String()
    cuda = fields.String()
    python = fields.String()
    device = fields.String()
    arch = fields.String()
    limit = fields.Integer(load_default=50, validate=validate.Range(1, 1000))
    offset = fields.Integer(load_default=0, validate=validate.Range(0, 10**9))
