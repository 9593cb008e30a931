"""A real HTTP receiver for the HTTP sink tests: a threaded ``http.server`` on a free port.

``Receiver`` records every request (method, path, headers, body) and answers by rule
(over HTTPS when given a certificate): 2xx by default; 422 for paths containing a refused
word; 503 with ``Retry-After`` while ``failing``; holding the answer while ``stalled``;
and ``stop`` / ``start`` close and reopen its port (an outage). It verifies each
signature itself (``hmac``, independently of the relay's code) when given the secret.
Delivered requests are turned into ``tests.support.Msg`` for
``wal_support.assert_contract``: the last path segment is the topic, headers are the
request's (lower-cased names), the offset the order of arrival.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import ssl
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from cdc_relay.local.helpers import HOST, free_port
from cdc_relay.local.kafka_security import TlsFiles
from tests.support import Msg


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    signature_ok: bool | None = None


@dataclass
class Receiver:
    """The test's HTTP server (module docstring)."""

    secret: bytes | None = None
    refuse: tuple[str, ...] = ()  # a path containing one of these is answered 422
    retry_after: str = "1"
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    failing: bool = False
    stalled: threading.Event = field(default_factory=threading.Event)  # set: not stalled
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _connections: set[socket.socket] = field(default_factory=set)
    tls: TlsFiles | None = None  # serve HTTPS with this certificate (cdc_relay.local.kafka_security)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.port}"

    def start(self) -> Receiver:
        self.stalled.set()
        self.port = self.port or free_port()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with receiver._lock:
                    receiver._connections.add(self.connection)

            def do_OPTIONS(self) -> None:
                self._answer(204)

            def do_POST(self) -> None:
                self._handle()

            def do_PUT(self) -> None:
                self._handle()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: nothing was received
                    self.close_connection = True
                    return
                receiver.stalled.wait()
                status = receiver.status_for(self.path)
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                            body, status, receiver.verify(self.headers, body))
                with receiver._lock:
                    receiver.seen.append(seen)
                extra = {"Retry-After": receiver.retry_after} if status == 503 else {}
                self._answer(status, extra)

            def _answer(self, status: int, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in (extra or {}).items():
                    self.send_header(name, value)
                text = b"refused by the test" if status >= 400 else b""
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

        self._server = ThreadingHTTPServer((HOST, self.port), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.keystore)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the port and every open connection (keep-alive ones too)."""
        self.stalled.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def status_for(self, path: str) -> int:
        if self.failing:
            return 503
        if any(word in path for word in self.refuse):
            return 422
        return 200

    def verify(self, headers: Any, body: bytes) -> bool | None:
        if self.secret is None:
            return None
        stamp, given = headers.get("X-Cdc-Relay-Timestamp"), headers.get("X-Cdc-Relay-Signature")
        if not stamp or not given:
            return False
        expected = hmac.new(self.secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(given, "v1=" + expected)

    def delivered(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if 200 <= s.status < 300]


def to_msgs(seen: list[Seen]) -> list[Msg]:
    """Delivered requests as messages: one per event (a batch's envelopes unpacked)."""
    out: list[Msg] = []
    for s in seen:
        topic = s.path.rstrip("/").rsplit("/", 1)[-1]
        if s.headers.get("content-type") == "application/json" and s.body.startswith(b"["):
            for e in orjson.loads(s.body):
                headers = {k: v.encode() for k, v in e["headers"].items()}
                out.append(Msg(topic, 0, len(out), e["key"].encode(), orjson.dumps(e["payload"]),
                               headers, e["timestamp"] or 0))
            continue
        headers = {k: v.encode() for k, v in s.headers.items()}
        out.append(Msg(topic, 0, len(out), headers.get("aggregate_id"), s.body, headers,
                       int(s.headers.get("timestamp", "0"))))
    return out
