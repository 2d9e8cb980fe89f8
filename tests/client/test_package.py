"""The package's face: ``import cachesvc_client.shared.keys`` (what the service and an init container's key rules
need) imports the standard library only, and the public names still come from ``cachesvc_client``."""
from __future__ import annotations

import json
import subprocess
import sys

import cachesvc_client

#: third-party modules the rest of the client needs; none of them may be imported for ``keys``
HEAVY = ("requests", "urllib3", "filelock", "tqdm", "zstandard", "click", "torch")


def _modules_after(statement: str) -> list:
    code = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_importing_the_shared_key_rules_imports_no_third_party_module():
    loaded = _modules_after("import cachesvc_client.shared.keys, cachesvc_client.shared.units")
    assert "cachesvc_client.shared.keys" in loaded  # the probe sees imports at all
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert [m for m in loaded if m.startswith("cachesvc_client.")] == ["cachesvc_client.shared",
                                                                       "cachesvc_client.shared.keys",
                                                                       "cachesvc_client.shared.units"]


def test_the_public_names_are_importable_from_the_package_and_import_their_module_on_first_use():
    loaded = _modules_after("from cachesvc_client import CacheClient, RestoreReport, CacheClientError")
    assert "cachesvc_client.client" in loaded and "requests" in loaded
    for name in cachesvc_client.__all__:
        assert getattr(cachesvc_client, name) is not None, name
    assert cachesvc_client.apply_torch_fixes is cachesvc_client.process.torch_fixes.apply
    assert set(cachesvc_client.__all__) <= set(dir(cachesvc_client))


def test_an_unknown_name_is_an_attribute_error():
    try:
        cachesvc_client.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("cachesvc_client.no_such_thing did not raise AttributeError")


def test_every_http_connection_is_made_in_the_transport_layer():
    """The API calls, the blob transfers and the remote cache share one HTTP layer (``transport/``): no
    other module imports requests or urllib3, and only ``transport/session.py`` makes a requests.Session."""
    import ast
    from pathlib import Path

    client = Path(cachesvc_client.__file__).parent
    outside, sessions = [], []
    for path in sorted(client.rglob("*.py")):
        rel = path.relative_to(client).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] in ("requests", "urllib3") for n in names) and not rel.startswith("transport/"):
                outside.append(rel)
            made = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Session"
            if made and getattr(node.func.value, "id", "") == "requests":
                sessions.append(rel)
    assert outside == []
    assert sessions == ["transport/session.py"]
