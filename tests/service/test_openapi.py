"""The OpenAPI document is generated from the code, validates, and lists every endpoint with its auth."""
from __future__ import annotations

import re

import pytest
from openapi_spec_validator import validate

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)

HTML = {"web.index", "web.entry", "web.stats_page", "account.login", "account.login_post", "account.logout",
        "web_admin.purge_preview", "web_admin.purge_confirmed", "web_admin.audit_page", "web_admin.tokens_page",
        "web_admin.create_token", "web_admin.revoke_token", "web_admin.purge_done",
        "web_admin.revoke_confirm"}  # the pages (auth.PAGE_BLUEPRINTS): not the API
DOCS = {"api-docs.openapi_swagger_ui", "api_docs_assets.asset", "api_docs_assets.init_script",
        "web.static"}  # Swagger UI's page, its files and start-up script, the pages' stylesheet


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_document_validates_and_lists_every_endpoint_with_its_auth(app, client):
    spec = client.get("/api/v1/openapi.json").json
    validate(spec)
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    listed = 0
    for rule in app.url_map.iter_rules():
        if rule.endpoint in HTML | DOCS or rule.endpoint in ("static", "web.static") or "openapi" in rule.rule:
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


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)  # anonymous read off: the docs stay open
def test_swagger_ui_at_api_v1_docs_serves_its_own_assets_and_needs_no_token(app):
    anonymous = app.test_client()
    page = anonymous.get("/api/v1/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert 'data-spec-url="/api/v1/openapi.json"' in html and "<script>" not in html  # no inline script (CSP)
    init = anonymous.get("/api/v1/docs/init.js")
    assert init.status_code == 200 and "SwaggerUIBundle(config)" in init.get_data(as_text=True)
    init.close()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(assets) == 4 and "/api/v1/docs/init.js" in assets, assets
    assets.remove("/api/v1/docs/init.js")
    assert all(a.startswith("/api/v1/docs/assets/") for a in assets), assets  # no CDN
    for url in assets:
        resp = anonymous.get(url)
        assert resp.status_code == 200 and resp.mimetype in ("text/javascript", "text/css"), url
        assert len(resp.data) > 10_000, url
        resp.close()
    assert anonymous.get("/api/v1/docs/assets/../__init__.py").status_code == 404
    assert anonymous.get("/api/v1/openapi.json").status_code == 200


#: answers that are bytes or text, not JSON
NOT_JSON = {("get", "/api/v1/blobs/{sha256}"), ("get", "/api/v1/packs/{sha256}"),
            ("get", "/api/v1/remote-cache/{cache}/{key}"), ("get", "/metrics")}


def _properties(spec, schema, seen, owner="answer"):
    """(schema name, property name, property) of ``schema`` and of every schema it refers to."""
    if "$ref" in schema:
        owner = schema["$ref"].rsplit("/", 1)[1]
        if owner in seen:
            return
        seen.add(owner)
        schema = spec["components"]["schemas"][owner]
    for prop_name, prop in schema.get("properties", {}).items():
        yield owner, prop_name, prop
        for sub in (prop, prop.get("items", {}), prop.get("additionalProperties") or {}, *prop.get("allOf", [])):
            if isinstance(sub, dict) and ("$ref" in sub or "properties" in sub):
                yield from _properties(spec, sub, seen, f"{owner}.{prop_name}")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_2xx_json_answer_has_a_schema_that_describes_every_field(client):
    spec = client.get("/api/v1/openapi.json").json
    with_schema = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method not in ("get", "put", "post", "delete", "patch"):
                continue  # path-level parameters
            for status, resp in op["responses"].items():
                content = resp.get("content", {})
                if not status.startswith("2") or (method, path) in NOT_JSON:
                    continue  # errors (the Error schema), and byte or text answers
                schema = content.get("application/json", {}).get("schema")
                assert schema, f"{method} {path} {status} has no schema"
                with_schema += 1
                for owner, name, prop in _properties(spec, schema, set()):
                    assert prop.get("description"), f"{method} {path}: {owner}.{name} has no description"
                if "$ref" in schema:
                    assert spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]][
                        "additionalProperties"] is False, f"{method} {path}: a field not listed must fail"
    assert with_schema >= 23  # 21 operations, the publish with two (201 pending, 200 unchanged or linked)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_document_is_written_when_first_read_and_is_the_one_flask_smorest_writes(app, database_url, storage_settings,
                                                                                       tmp_path, monkeypatch):
    """cachesvc.app._Api describes the views when the document is first read, not at each blueprint's registration
    (two thirds of building an app): requests do not write it, and it is, key for key and in order, the document
    flask-smorest's own registration writes."""
    import json

    import flask_smorest

    import cachesvc
    from cachesvc import app as app_module

    api = app.extensions["flask-smorest"]["apis"][""]["ext_obj"]
    client = app.test_client()
    assert api._undocumented and client.get("/healthz").status_code == 200 and api._undocumented
    lazy = client.get("/api/v1/openapi.json").json
    assert not api._undocumented and api.spec.to_dict() == lazy
    monkeypatch.setattr(app_module._Api, "register_blueprint", flask_smorest.Api.register_blueprint)
    eager = cachesvc.create_app({"TESTING": True, "DATA_DIR": str(tmp_path / "eager"), "DATABASE_URL": database_url,
                                 **storage_settings})
    assert not eager.extensions["flask-smorest"]["apis"][""]["ext_obj"]._undocumented
    assert json.dumps(eager.test_client().get("/api/v1/openapi.json").json) == json.dumps(lazy)
