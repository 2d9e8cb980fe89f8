"""A faulty HTTP proxy on loopback: forwards to a real server, then answers slowly, never, or changed.

    FaultyHTTP(target_port, fault=lambda path: None | "trickle-body" | "stall-body" | "trickle-headers")
    FaultyHTTP(target_port, rewrite=lambda path, status, headers, body: (status, headers, body))

Each request is forwarded to ``127.0.0.1:<target_port>`` unchanged but for its
protocol and Connection header (HTTP/1.0, close: the real server answers
whole and closes), the whole
answer is read, then sent to the client as ``fault(path)`` says:

    None               at once
    "trickle-body"     the headers at once, then the body ``chunk`` bytes every ``delay`` s (never a silent
                       ``delay``: a read timeout cannot catch it)
    "stall-body"       the headers, then nothing; the connection stays open
    "trickle-headers"  the status line, then header bytes one every ``delay`` s, never ending

``rewrite`` changes the answer first (a service or storage that lies). The
request's signature (SigV4 presigned URLs) stays valid: the Host header and
the URL are forwarded as they came. One thread per connection; every thread
ends when its client goes away or the proxy closes. For tests only.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

Rewrite = Callable[[str, int, Dict[str, str], bytes], Tuple[int, Dict[str, str], bytes]]


def _read_head(sock: socket.socket) -> Tuple[bytes, bytes]:
    """(head up to and including the blank line, what followed it) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the end of the head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _headers(head: bytes) -> Dict[str, str]:
    out = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip()
    return out


def _head(status_line: str, headers: Dict[str, str]) -> bytes:
    return (status_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1")


class FaultyHTTP:
    """See the module docstring. ``url`` is the proxy's base URL; ``requests`` lists the paths it saw."""

    def __init__(self, target_port: int, fault: Callable[[str], Optional[str]] = lambda path: None,
                 rewrite: Optional[Rewrite] = None, delay: float = 0.5, chunk: int = 1):
        self.target_port, self.fault, self.rewrite, self.delay, self.chunk = target_port, fault, rewrite, delay, chunk
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: List[str] = []
        self._closed = threading.Event()
        self._socks: List[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"faulty-http-{self.port}").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            head, rest = _read_head(client)
            length = int(_headers(head).get("Content-Length", "0") or 0)
            while len(rest) < length:
                chunk = client.recv(65536)
                if not chunk:
                    return
                rest += chunk
            line, _, fields = head.partition(b"\r\n")
            method, path, _version = line.decode("latin-1").split(" ", 2)
            self.requests.append(path)
            kept = [f for f in fields.split(b"\r\n") if f and not f.lower().startswith(b"connection:")]
            upstream_head = "\r\n".join([f"{method} {path} HTTP/1.0", *(f.decode("latin-1") for f in kept),
                                          "Connection: close", "", ""]).encode("latin-1")
            status, headers, body = self._forward(upstream_head, rest)
            if self.rewrite is not None:
                status, headers, body = self.rewrite(path, status, headers, body)
                headers["Content-Length"] = str(len(body))
            self._answer(client, self.fault(path), status, headers, body)
        except (OSError, ValueError):
            pass  # the client went away (cut off at its deadline), or the proxy closed
        finally:
            client.close()

    def _forward(self, head: bytes, body: bytes) -> Tuple[int, Dict[str, str], bytes]:
        with socket.create_connection(("127.0.0.1", self.target_port), timeout=60) as upstream:
            upstream.sendall(head + body)
            answer = b""
            while True:
                chunk = upstream.recv(1 << 20)
                if not chunk:
                    break
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        headers = {k: v for k, v in _headers(head + b"\r\n").items() if k.lower() != "connection"}
        headers["Connection"] = "close"
        return status, headers, body

    def _answer(self, client: socket.socket, fault: Optional[str], status: int, headers: Dict[str, str],
                body: bytes) -> None:
        status_line = f"HTTP/1.1 {status} X"
        if fault == "trickle-headers":
            client.sendall(f"{status_line}\r\nX-Slow: ".encode())
            while not self._closed.is_set():  # one header line that never ends
                client.sendall(b"a")
                time.sleep(self.delay)
            return
        client.sendall(_head(status_line, headers))
        if fault == "stall-body":
            self._closed.wait()
        elif fault == "trickle-body":
            for i in range(0, len(body), self.chunk):
                if self._closed.is_set():
                    return
                client.sendall(body[i:i + self.chunk])
                time.sleep(self.delay)
        else:
            client.sendall(body)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def __enter__(self) -> "FaultyHTTP":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
