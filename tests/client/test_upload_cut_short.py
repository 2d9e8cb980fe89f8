"""An upload whose answer is cut short (the service killed while answering: a chunked reply that ends
early) is ServiceUnavailable, as a refused connection is. A killed gunicorn produces it only sometimes
(tests/reliability/test_faults.py once saw ChunkedEncodingError escape), so a socket that always does."""
from __future__ import annotations

import io
import socket
import threading

import pytest
import requests

from cachesvc_client.errors import ServiceUnavailable
from cachesvc_client.transport import blobs


def cut_short_server() -> str:
    """A server that reads one request and answers a chunked 200 whose first chunk never comes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def answer() -> None:
        conn, _ = sock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                         b"Content-Type: application/json\r\n\r\n99\r\n")
        sock.close()

    threading.Thread(target=answer, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}/upload"


def test_an_answer_cut_short_is_service_unavailable():
    url = cut_short_server()
    with requests.Session() as session, pytest.raises(ServiceUnavailable, match="upload to .* failed"):
        blobs.upload(session, {"url": url}, {}, body=io.BytesIO(b"x"), length=1, timeout=5)
