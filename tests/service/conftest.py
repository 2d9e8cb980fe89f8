"""Fixtures the service tests share (a conftest, not a test module, so every test file here gets them)."""
from __future__ import annotations

import pytest

from tests.helpers import key, publish
from tests.helpers.service import age


@pytest.fixture
def catalog(app, client):
    """Six versions in three entries; sizes 100..600 bytes, all content distinct. Returns {label: version id}.

        mlp (cpu)      v1 created 30 d ago, never restored   v2 created 20 d, restored 0.5 d ago   v3 created 1 d
        bert (2.12.0)  v4 created 40 d, restored 35 d ago      v5 created 2 d
        mlp (H200)     v6 created 0.25 d ago
    """
    plan = [("v1", key(), 30, None), ("v2", key(), 20, 0.5), ("v3", key(), 1, None),
            ("v4", key(name="bert", torch="2.12.0"), 40, 35), ("v5", key(name="bert", torch="2.12.0"), 2, None),
            ("v6", key(device="NVIDIA H200"), 0.25, None)]
    ids = {}
    for i, (label, k, created, restored) in enumerate(plan):
        ids[label] = publish(client, {"f": bytes([65 + i]) * (100 * (i + 1))}, k)["version"]["id"]
        age(app, ids[label], created, restored)
    return ids
