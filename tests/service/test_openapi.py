"""The OpenAPI document is generated from the code, validates, and lists every endpoint with its auth."""
from __future__ import annotations

import pytest
from openapi_spec_validator import validate

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]

HTML = {"web.index", "web.entry", "web.stats_page", "account.login", "account.login_post", "account.logout",
        "web_admin.purge_preview", "web_admin.purge_confirmed", "web_admin.audit_page", "web_admin.tokens_page",
        "web_admin.create_token", "web_admin.revoke_token"}  # the pages (auth.PAGE_BLUEPRINTS): not the API


def test_document_validates_and_lists_every_endpoint_with_its_auth(app, client):
    spec = client.get("/api/v1/openapi.json").json
    validate(spec)
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    listed = 0
    for rule in app.url_map.iter_rules():
        if rule.endpoint in HTML or rule.endpoint == "static" or "openapi" in rule.rule:
            continue
        path = rule.rule.replace("<int:", "{").replace("<", "{").replace(">", "}")
        assert path in spec["paths"], path
        view = app.view_functions[rule.endpoint]
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            op = spec["paths"][path][method.lower()]
            listed += 1
            if getattr(view, "_cachesvc_scope", "open") != "open":
                assert op["security"] == [{"bearerAuth": []}], (path, method)
                assert {"401", "403"} <= set(op["responses"]), (path, method)
            else:
                assert "security" not in op, (path, method)
    methods = {"get", "put", "post", "delete", "patch"}
    assert listed == sum(len(methods & set(ops)) for ops in spec["paths"].values()), "no stale paths"
    purge = spec["paths"]["/api/v1/admin/purge"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    props = spec["components"]["schemas"][purge["$ref"].rsplit("/", 1)[1]]["properties"]
    assert {"not_restored_for", "older_than", "keep_latest", "torch_version", "name", "device",
            "max_total_bytes", "dry_run"} <= set(props)
    entries = {p["name"] for p in spec["paths"]["/api/v1/entries"]["get"]["parameters"]}
    assert {"name", "shape", "tags", "tag", "torch", "triton", "cuda", "python", "device", "arch", "sort",
            "limit", "offset"} <= entries
