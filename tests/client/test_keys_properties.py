"""Property-based tests (hypothesis) of the key and path rules in ``cachesvc_client.shared.keys``, and of
restore's on-disk guard ``safe_target`` (issue 5, part 1: property tests for the path and key rules)."""
from __future__ import annotations

import hashlib
import os
import re
import tempfile

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cachesvc_client.shared import keys
from cachesvc_client.restore.plan import safe_target

#: Deterministic for CI (derandomize), no example database written to the work tree.
PROPS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

# -- strategies ------------------------------------------------------------------------------

#: Printable characters a component may hold: any printable character but '/', '\\' (and so no NUL).
_component_chars = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"),
                                 blacklist_characters="/\\")


def _printable_component(s: str) -> bool:
    return s not in (".", "..") and s.isprintable() and len(s.encode("utf-8")) <= keys.MAX_COMPONENT


components = st.text(_component_chars, min_size=1, max_size=40).filter(_printable_component)
# Also the edges: components at the byte limit, and names made of dots that are not '.' or '..'.
edge_components = st.sampled_from(["...", ".a", "a.", "..a", "x" * keys.MAX_COMPONENT, "é" * 127, "~", " ", "a b"])


@st.composite
def relpaths(draw, max_parts: int = 8) -> str:
    """Paths check_relpath must accept: 1..max_parts valid components, '/'-joined, within MAX_PATH."""
    parts = draw(st.lists(st.one_of(components, edge_components), min_size=1, max_size=max_parts))
    path = "/".join(parts)
    assume(len(path) <= keys.MAX_PATH and len(path.encode("utf-8")) <= keys.MAX_PATH_BYTES
           and not re.match(r"^[A-Za-z]:", path))
    return path


def accepts(check, value) -> bool:
    try:
        check(value)
        return True
    except keys.InvalidKey:
        return False


def expected_valid(path: str) -> bool:
    """The documented rule, written out independently of keys.check_relpath."""
    if not path or len(path) > keys.MAX_PATH or "\x00" in path or "\\" in path:
        return False
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        return False
    return all(p not in ("", ".", "..") and p.isprintable()
               and len(p.encode("utf-8")) <= keys.MAX_COMPONENT for p in path.split("/")) \
        and len(path.encode("utf-8")) <= keys.MAX_PATH_BYTES


# Arbitrary strings, biased towards the characters the rule is about.
tricky_text = st.text(st.one_of(st.sampled_from(list("/.\\\x00:aZ é\n\t\ud800\udcff")), st.characters()), max_size=60)

# -- check_relpath ---------------------------------------------------------------------------


@PROPS
@given(relpaths())
def test_check_relpath_accepts_valid_paths_unchanged(path):
    assert keys.check_relpath(path) == path


@PROPS
@given(st.one_of(tricky_text, relpaths()))
def test_check_relpath_accepts_exactly_the_documented_paths(path):
    assert accepts(keys.check_relpath, path) == expected_valid(path), repr(path)


@PROPS
@given(st.one_of(tricky_text, relpaths()))
def test_an_accepted_path_joined_to_a_root_stays_under_it(path):
    assume(accepts(keys.check_relpath, path))
    root = "/srv/cache/inductor"
    joined = os.path.normpath(os.path.join(root, path))
    assert joined.startswith(root + os.sep), (path, joined)
    assert os.path.commonpath([root, joined]) == root


@PROPS
@given(relpaths())
def test_absolute_paths_are_refused(path):
    for absolute in ("/" + path, "//" + path, "C:/" + path, "c:" + path):
        with pytest.raises(keys.InvalidKey, match="absolute|empty"):
            keys.check_relpath(absolute)


@PROPS
@given(relpaths(), st.data())
def test_dot_dot_anywhere_is_refused(path, data):
    parts = path.split("/")
    at = data.draw(st.integers(0, len(parts)))
    bad = "/".join(parts[:at] + [data.draw(st.sampled_from(["..", "."]))] + parts[at:])
    with pytest.raises(keys.InvalidKey, match="'..' component"):
        keys.check_relpath(bad)


@PROPS
@given(relpaths(), st.data(), st.sampled_from(["\\", "\x00"]))
def test_backslash_and_nul_anywhere_are_refused(path, data, char):
    at = data.draw(st.integers(0, len(path)))
    with pytest.raises(keys.InvalidKey, match="NUL or backslash"):
        keys.check_relpath(path[:at] + char + path[at:])


@PROPS
@given(relpaths(), st.data())
def test_empty_components_are_refused(path, data):
    parts = path.split("/")
    at = data.draw(st.integers(1, len(parts)))  # at 0 it would be absolute, refused for that
    bad = "/".join(parts[:at] + [""] + parts[at:])
    with pytest.raises(keys.InvalidKey, match="empty"):
        keys.check_relpath(bad)


@PROPS
@given(relpaths(max_parts=3), st.integers(1, 400))
def test_paths_over_the_limits_are_refused(path, extra):
    with pytest.raises(keys.InvalidKey, match="limit"):
        keys.check_relpath(path + "/" + "a" * (keys.MAX_PATH - len(path) + extra))
    for long in ("a" * (keys.MAX_COMPONENT + 1 + extra % 100), "é" * (keys.MAX_COMPONENT // 2 + 1)):  # bytes
        with pytest.raises(keys.InvalidKey, match="longer than"):
            keys.check_relpath("x/" + long)


def test_the_path_limit_counts_utf8_bytes_so_postgresql_can_index_it():
    at_limit = "/".join(["€" * 80] * 8 + ["€" * 40])  # 688 characters of 3-byte UTF-8: 2,048 bytes
    assert len(at_limit.encode("utf-8")) == keys.MAX_PATH_BYTES and len(at_limit) < keys.MAX_PATH
    assert keys.check_relpath(at_limit) == at_limit
    with pytest.raises(keys.InvalidKey, match="2049 bytes long in UTF-8; the limit is 2048"):
        keys.check_relpath(at_limit + "a")


@pytest.mark.parametrize("path", ["a\ud800", "\udfff/b", "x/\udcff"])
def test_a_lone_surrogate_is_refused_as_invalid_unicode(path):
    with pytest.raises(keys.InvalidKey, match="lone surrogate"):
        keys.check_relpath(path)


@pytest.mark.parametrize("value", [None, 1, b"a/b", ["a"], {"a": 1}])
def test_check_relpath_refuses_non_strings(value):
    with pytest.raises(keys.InvalidKey, match="path must be a string"):
        keys.check_relpath(value)


# -- key_digest ------------------------------------------------------------------------------

texts = st.text(_component_chars, min_size=1, max_size=20).filter(str.isprintable)
tag_keys = st.from_regex(r"\A[A-Za-z0-9_.:-]{1,16}\Z")
tag_maps = st.dictionaries(tag_keys, texts, max_size=6)
envs = st.fixed_dictionaries({f: texts for f in keys.ENV_FIELDS})


@PROPS
@given(texts, texts, tag_maps, envs, st.randoms(use_true_random=False))
def test_key_digest_ignores_tag_and_env_order(name, shape, tags, env, rnd):
    items, env_items = list(tags.items()), list(env.items())
    rnd.shuffle(items)
    rnd.shuffle(env_items)
    assert keys.key_digest(name, shape, dict(items), dict(env_items)) == keys.key_digest(name, shape, tags, env)


@PROPS
@given(texts, texts, tag_maps, envs, st.data())
def test_key_digest_changes_when_any_field_changes(name, shape, tags, env, data):
    before = keys.key_digest(name, shape, tags, env)
    other = data.draw(texts)
    field = data.draw(st.sampled_from(["name", "shape", "tag value", "new tag", "env"]))
    if field == "name":
        assume(other != name)
        name = other
    elif field == "shape":
        assume(other != shape)
        shape = other
    elif field == "tag value":
        assume(tags)
        k = data.draw(st.sampled_from(sorted(tags)))
        assume(tags[k] != other)
        tags = {**tags, k: other}
    elif field == "new tag":
        k = data.draw(tag_keys)
        assume(k not in tags)
        tags = {**tags, k: other}
    else:
        f = data.draw(st.sampled_from(keys.ENV_FIELDS))
        assume(env[f] != other)
        env = {**env, f: other}
    assert keys.key_digest(name, shape, tags, env) != before, field


# -- family_digest: a key without its shape (the fleet's demand is kept per family) -----------------


@PROPS
@given(texts, tag_maps, envs, st.randoms(use_true_random=False))
def test_family_digest_ignores_tag_and_env_order(name, tags, env, rnd):
    items, env_items = list(tags.items()), list(env.items())
    rnd.shuffle(items)
    rnd.shuffle(env_items)
    assert keys.family_digest(name, dict(items), dict(env_items)) == keys.family_digest(name, tags, env)


@PROPS
@given(texts, texts, tag_maps, envs, st.data())
def test_family_digest_changes_with_name_tags_and_env_and_is_never_a_key_digest(name, shape, tags, env, data):
    family = keys.family_digest(name, tags, env)
    assert family != keys.key_digest(name, shape, tags, env)
    assert len(family) == 64 and keys.check_digest(family) == family
    other = data.draw(texts)
    field = data.draw(st.sampled_from(["name", "new tag", "env"]))
    if field == "name":
        assume(other != name)
        name = other
    elif field == "new tag":
        k = data.draw(tag_keys)
        assume(k not in tags)
        tags = {**tags, k: other}
    else:
        f = data.draw(st.sampled_from(keys.ENV_FIELDS))
        assume(env[f] != other)
        env = {**env, f: other}
    assert keys.family_digest(name, tags, env) != family, field


def test_family_digest_is_pinned():
    """The client and the service compute it apart (the client for its reports, the service to name the
    family it keeps): a change to the canonical text is a change to the wire."""
    env = dict(zip(keys.ENV_FIELDS, ("2.13.0", "3.6.0", "12.8", "3.11", "NVIDIA H200", "sm_90")))
    text = ('family:{"env":{"arch":"sm_90","cuda":"12.8","device":"NVIDIA H200","python":"3.11","torch":"2.13.0",'
            '"triton":"3.6.0"},"name":"llama","tags":{"mode":"default"}}')
    assert keys.family_digest("llama", {"mode": "default"}, env) == hashlib.sha256(text.encode()).hexdigest()


# -- manifest_digest -------------------------------------------------------------------------

shas = st.text("0123456789abcdef", min_size=64, max_size=64)
rows = st.fixed_dictionaries({"root": st.sampled_from(["inductor", "triton", "pch"]), "path": relpaths(max_parts=3),
                              "sha256": shas, "mode": st.integers(0, 0o777)})
manifests = st.lists(rows, min_size=1, max_size=8, unique_by=lambda r: (r["root"], r["path"]))


@PROPS
@given(manifests, st.randoms(use_true_random=False))
def test_manifest_digest_ignores_row_order(files, rnd):
    shuffled = list(files)
    rnd.shuffle(shuffled)
    assert keys.manifest_digest(shuffled) == keys.manifest_digest(files)


@PROPS
@given(manifests, st.data())
def test_manifest_digest_changes_when_a_rows_path_sha_or_mode_changes(files, data):
    before = keys.manifest_digest(files)
    i = data.draw(st.integers(0, len(files) - 1))
    field = data.draw(st.sampled_from(["path", "sha256", "mode"]))
    new = data.draw({"path": relpaths(max_parts=3), "sha256": shas, "mode": st.integers(0, 0o777)}[field])
    assume(new != files[i][field])
    changed = [dict(f) for f in files]
    changed[i][field] = new
    assert keys.manifest_digest(changed) != before, field


# -- wrong types name the field --------------------------------------------------------------

not_mappings = st.one_of(st.none(), st.integers(), st.text(), st.lists(st.text(), max_size=3), st.binary())
not_strings = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.booleans(), st.binary(),
                        st.lists(st.integers(), max_size=2), st.dictionaries(st.text(), st.text(), max_size=2))


@PROPS
@given(not_mappings.filter(lambda v: v is not None))
def test_check_tags_refuses_a_non_object(value):
    with pytest.raises(keys.InvalidKey, match="^tags must be an object"):
        keys.check_tags(value)


@PROPS
@given(tag_keys, not_strings)
def test_check_tags_refuses_a_non_string_value_naming_the_tag(key, value):
    with pytest.raises(keys.InvalidKey, match=f"^tags\\.{re.escape(key)} must be a string"):
        keys.check_tags({key: value})


@PROPS
@given(not_mappings)
def test_check_env_refuses_a_non_object(value):
    with pytest.raises(keys.InvalidKey, match="^env must be an object"):
        keys.check_env(value)


@PROPS
@given(envs, st.sampled_from(keys.ENV_FIELDS), not_strings)
def test_check_env_refuses_a_non_string_value_naming_the_field(env, field, value):
    with pytest.raises(keys.InvalidKey, match=f"^env\\.{field} must be a string"):
        keys.check_env({**env, field: value})


# -- restore's guard on disk -----------------------------------------------------------------

@settings(PROPS, max_examples=100)
@given(relpaths(max_parts=5), st.integers(0, 5))
def test_safe_target_of_a_valid_path_is_inside_the_root(path, existing):
    """With real folders: some of the path's parents already exist, the rest do not."""
    keys.check_relpath(path)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.realpath(tmp)
        parents = path.split("/")[:-1][:existing]
        if parents:
            os.makedirs(os.path.join(root, *parents))
        target = safe_target(root, path)
        assert os.path.commonpath([root, os.path.realpath(target)]) == root
        assert os.path.realpath(target) != root
        assert os.path.normpath(target) == os.path.join(root, *path.split("/"))
