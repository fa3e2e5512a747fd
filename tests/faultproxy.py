"""A fault-injecting HTTP proxy in front of the test S3 server, for failures on the wire.

The proxy runs in the test process (threads on a loopback port) and forwards each request to
the server, unless a rule added with :meth:`FaultProxy.fail` matches it:

``"reset"``
    the connection is reset before anything is forwarded (the request never reached S3);
``"forward_reset"``
    the request is forwarded and served, then the connection is reset instead of answering
    (the request took effect, the client never hears so);
``"status"``
    an S3 error response with that status (``403`` is ``AccessDenied``) and nothing forwarded;
``"cut"``
    the request is forwarded and answered, but the connection is reset half-way through the
    answer's body (a download that breaks off).

Fixture (registered in ``tests/conftest.py``): ``fault_proxy``, a proxy in front of
``s3_server`` with the client environment of ``s3_root`` pointed at it.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import urlsplit

import pytest

_CODES = {403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError", 503: "SlowDown"}
_HOP_HEADERS = ("connection", "content-length", "transfer-encoding", "server", "date")


@dataclass
class Rule:
    method: str
    match: str     # a substring of the request's path
    action: str
    times: int     # how many matching requests it fails; -1: every one
    status: int = 500

    def takes(self, method: str, path: str) -> bool:
        return self.times != 0 and method == self.method and self.match in path


class FaultProxy:
    """A proxy to ``upstream`` (``http://host:port``) that fails the requests its rules
    match; ``requests`` lists every request seen as (method, path, action or "")."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname, parts.port)
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self.requests: list[tuple[str, str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="faultproxy", daemon=True)
        self._thread.start()

    def fail(self, method: str, match: str, action: str, times: int = 1,
             status: int = 500) -> None:
        """Fail the next ``times`` (-1: all) ``method`` requests whose path holds ``match``."""
        if action not in ("reset", "forward_reset", "status", "cut"):
            raise ValueError(f"unknown fault {action!r}")
        with self._lock:
            self._rules.append(Rule(method, match, action, times, status))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def seen(self, method: str, match: str) -> list[str]:
        """The actions taken on the ``method`` requests whose path holds ``match`` ("" when
        forwarded untouched), in order."""
        with self._lock:
            return [a for m, p, a in self.requests if m == method and match in p]

    def _take(self, method: str, path: str) -> Rule | None:
        with self._lock:
            rule = next((r for r in self._rules if r.takes(method, path)), None)
            if rule is not None and rule.times > 0:
                rule.times -= 1
            self.requests.append((method, path, rule.action if rule else ""))
            return rule

    def forward(self, method: str, path: str, headers: dict, body: bytes
                ) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return body

        def _reset(self) -> None:
            """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes,
                    cut: bool = False) -> None:
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in _HOP_HEADERS:
                    self.send_header(name, value)
            if self.command == "HEAD":  # no body: the object's length passes on
                length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
                self.send_header("Content-Length", length)
            else:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if cut:
                self.wfile.write(body[:len(body) // 2])
                self.wfile.flush()
                return self._reset()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _serve(self) -> None:
            body = self._body()
            rule = proxy._take(self.command, self.path)
            if rule is not None and rule.action == "reset":
                return self._reset()
            if rule is not None and rule.action == "status":
                xml = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                       f"{_CODES.get(rule.status, 'InternalError')}</Code><Message>injected"
                       f"</Message></Error>").encode()
                return self._answer(rule.status, [("Content-Type", "application/xml")], xml)
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("transfer-encoding", "content-length")}
            headers["Content-Length"] = str(len(body))
            answer = proxy.forward(self.command, self.path, headers, body)
            if rule is not None and rule.action == "forward_reset":
                return self._reset()
            self._answer(*answer, cut=rule is not None and rule.action == "cut")

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    return Handler


@pytest.fixture
def fault_proxy(s3_server, s3_root, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of the test server; ``s3_root``'s client environment
    goes through it."""
    import s3server

    proxy = FaultProxy(s3_server.endpoint)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.setenv(name, proxy.endpoint)
    s3server.clear_filesystem_caches()
    try:
        yield proxy
    finally:
        proxy.close()
        s3server.clear_filesystem_caches()
