"""Why a resolve missed (the nearest entries and the fields that differ) and the fallback steps."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from cachesvc.models import Event
from tests.helpers import key, publish, resolve_params

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)


def resolve(client, k, **extra):
    resp = client.get("/api/v1/resolve", query_string={**resolve_params(k), **extra})
    assert resp.status_code == 200, resp.json
    return resp.json


@pytest.mark.parametrize("field, wanted, have", [
    ("shape", "f32[4,256]", "f32[8,256]"),
    ("torch", "2.13.1", "2.13.0+cpu"),
    ("triton", "3.5.0", "none"),
    ("cuda", "12.8", "none"),
    ("python", "3.12", "3.11"),
    ("device", "NVIDIA H200", "x86_64"),
    ("arch", "sm90", "avx512"),
])
def test_a_miss_names_the_nearest_entry_and_the_one_field_that_differs(client, field, wanted, have):
    publish(client, {"a": b"a" * 100})
    answer = resolve(client, key(**{field: wanted}))
    assert answer["hit"] is False and answer["reason"] == "no entry has this key"
    first = answer["nearest"][0]
    assert first["differs"] == [{"field": field, "wanted": wanted, "have": have}]
    assert first["env_differs"] is (field != "shape")
    assert first["entry"]["name"] == "mlp" and first["version_id"] >= 1


def test_a_miss_names_differing_tags_and_name(client):
    publish(client, {"a": b"a"}, key(tags={"mode": "default"}))
    answer = resolve(client, key(tags={"mode": "max-autotune"}))
    assert answer["nearest"][0]["differs"] == [
        {"field": "tags", "wanted": '{"mode":"max-autotune"}', "have": '{"mode":"default"}'}]
    answer = resolve(client, key(name="other", tags={"mode": "default"}))  # same environment, other name
    assert [d["field"] for d in answer["nearest"][0]["differs"]] == ["name"]


def test_nearest_is_ranked_by_differing_fields_and_skips_strangers(client):
    publish(client, {"a": b"1"}, key(shape="s1", torch="2.12.0"))          # 2 fields differ
    publish(client, {"a": b"2"}, key(shape="s2"))                           # 1 field differs
    publish(client, {"a": b"3"}, key(name="bert", torch="2.1", device="x"))  # other name and env: no relation
    answer = resolve(client, key(shape="wanted"))
    assert [len(n["differs"]) for n in answer["nearest"]] == [1, 2]
    assert answer["nearest"][0]["entry"]["shape"] == "s2"
    assert resolve(client, key(name="nobody", torch="9"))["nearest"] == []


def test_nearest_means_close_the_same_name_first_and_never_another_model_with_other_inputs(client):
    """Issue 27 item 13: the distance is (another name, then fields that differ). An entry of the same
    environment that differs in name, shape and tags at once is not near; one of the same name is nearer
    than another name however many environment fields it differs in."""
    publish(client, {"a": b"1"}, key(name="bert", shape="f32[1,128]", tags={"mode": "max"}))   # a stranger
    publish(client, {"a": b"2"}, key(shape="f32[8,256]", torch="2.12.0", python="3.12", cuda="12.1"))
    publish(client, {"a": b"3"}, key(name="mlp-v2", shape="f32[8,256]"))                      # a rename
    answer = resolve(client, key(shape="f32[8,256]"))
    names = [n["entry"]["name"] for n in answer["nearest"]]
    assert names == ["mlp", "mlp-v2"], answer["nearest"]
    assert [len(n["differs"]) for n in answer["nearest"]] == [3, 1], "the same name first, then fewest fields"
    assert resolve(client, key(name="gpt", shape="f32[2]", tags={"x": "y"}))["nearest"] == []


def test_an_entry_without_a_committed_version_is_not_offered(client):
    client.post("/api/v1/versions", json={"key": key(shape="pending"), "roots": {"inductor": "/c"},
                                          "files": [{"root": "inductor", "path": "p", "sha256": "0" * 64,
                                                     "size": 1}]})
    assert resolve(client, key(shape="wanted"))["nearest"] == []


def test_fallback_shape_restores_the_newest_other_shape_and_is_labelled(client, app):
    publish(client, {"old": b"o" * 10}, key(shape="s1"))
    newest = publish(client, {"new": b"n" * 10}, key(shape="s2"))
    answer = resolve(client, key(shape="wanted"), fallback="shape")
    assert answer["hit"] is True
    assert answer["fallback"]["step"] == "shape"
    assert answer["fallback"]["versions"] == [newest["version"]["id"]]
    assert answer["fallback"]["entries"][0]["differs"] == [{"field": "shape", "wanted": "wanted", "have": "s2"}]
    assert [f["path"] for f in answer["files"]] == ["new"]
    assert answer["version"]["id"] == newest["version"]["id"] and answer["reason"] == "no entry has this key"
    with app.extensions["cachesvc"].db.session() as s:
        assert s.scalars(select(Event.kind).where(Event.kind.in_(("fallback", "miss"))).order_by(Event.id)).all() == [
            "miss", "fallback"]
    stats = client.get("/api/v1/stats").json
    assert stats["fallbacks"] == 1
    assert "cachesvc_fallbacks_total 1.0" in client.get("/metrics").get_data(as_text=True)


def test_fallback_never_crosses_an_environment_field(client):
    publish(client, {"a": b"a"}, key(shape="s1", torch="2.12.0"))
    publish(client, {"b": b"b"}, key(name="other", device="NVIDIA H200"))
    answer = resolve(client, key(shape="wanted"), fallback="shape,shapes,name")
    assert answer["hit"] is False
    assert {n["env_differs"] for n in answer["nearest"]} == {True}


def test_fallback_shapes_unions_the_most_restored_shapes_within_the_byte_budget(client):
    for shape, data in (("s1", b"1" * 100), ("s2", b"2" * 100), ("s3", b"3" * 300)):
        publish(client, {f"file-{shape}": data, "shared": b"same"}, key(shape=shape))
    for shape, times in (("s3", 3), ("s2", 2), ("s1", 1)):
        for _ in range(times):
            assert resolve(client, key(shape=shape))["hit"]
    answer = resolve(client, key(shape="wanted"), fallback="shapes", fallback_max_bytes=250)
    # s3 (most restored) is 304 bytes: over the budget; s2 then s1 fit
    assert answer["fallback"]["step"] == "shapes"
    assert [e["entry"]["shape"] for e in answer["fallback"]["entries"]] == ["s2", "s1"]
    assert [f["path"] for f in answer["files"]] == ["file-s2", "shared", "file-s1", "shared"]
    everything = resolve(client, key(shape="wanted"), fallback="shapes", fallback_max_bytes=10**6)
    assert [e["entry"]["shape"] for e in everything["fallback"]["entries"]] == ["s3", "s2", "s1"]


def test_fallback_steps_are_tried_in_order(client):
    publish(client, {"bert": b"b"}, key(name="bert"))
    answer = resolve(client, key(shape="wanted"), fallback="shape,name")
    assert answer["fallback"]["step"] == "name"  # no other shape of mlp: the next step answered
    assert answer["fallback"]["entries"][0]["differs"][0] == {"field": "name", "wanted": "mlp", "have": "bert"}
    publish(client, {"mlp": b"m"}, key(shape="s1"))
    assert resolve(client, key(shape="wanted"), fallback="shape,name")["fallback"]["step"] == "shape"
    assert resolve(client, key(shape="wanted"), fallback="name,shape")["fallback"]["step"] == "name"


def test_fallback_name_prefers_the_same_tags(client):
    publish(client, {"a": b"a"}, key(name="a", tags={"mode": "default"}))
    publish(client, {"b": b"b"}, key(name="b", tags={"mode": "other"}))
    answer = resolve(client, key(name="c", tags={"mode": "default"}), fallback="name")
    assert answer["fallback"]["entries"][0]["entry"]["name"] == "a"


def test_unknown_fallback_step_gets_422(client):
    resp = client.get("/api/v1/resolve", query_string={**resolve_params(key()), "fallback": "shape,anything"})
    assert resp.status_code == 422 and "fallback" in json.dumps(resp.json)
