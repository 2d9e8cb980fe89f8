"""Transport: every byte the client sends or receives over HTTP goes through here.

    session.py    Transport (the requests.Session and the blob pools), new_session, connect rules, bounded reads
    deadlines.py  Deadline: a whole request cut off at its moment, whatever the server does
    api.py        ServiceAPI: the service's JSON API (resolve, versions, commit, verdicts, entries)
    blobs.py      blob GETs (a blob, a pack run) and uploads, to the service or presigned storage
    remote.py     HTTPBackend: Inductor's remote-cache backend (GET/PUT of one value)

Above it: ``restore`` (blob GETs through ``ServiceAPI.transport``), ``publish``
(uploads through the API's session) and ``remote_cache`` (the Inductor hook
over ``remote.HTTPBackend``). Nothing here writes a final file.
"""
from .api import ServiceAPI
from .deadlines import Deadline
from .session import CONNECT_TIMEOUT, Transport

__all__ = ["CONNECT_TIMEOUT", "Deadline", "ServiceAPI", "Transport"]
