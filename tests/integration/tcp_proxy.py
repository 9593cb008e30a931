"""A TCP proxy the integration tests put between the relay and a server to fail the network.

``cut()`` stands in for a network failure towards a broker the test shares with others (the
session's RabbitMQ and NATS); ``pause()`` for a stalled server.

``pause_requests()`` stalls one direction only: what the clients send is held while the
server's bytes still arrive, e.g. the relay's standby status updates stop reaching the
walsender while the WAL stream goes on. Bytes held by a pause are dropped by ``cut()``;
``resume()`` forwards them.

For PostgreSQL failovers (docs/high-availability.md): ``half_open()`` silences the
connections open now, in both directions, without closing either side (no FIN, no RST),
while new connections work, as after a NAT or load-balancer timeout; ``move_to(port)``
sends new connections to another server (the promoted standby), as a moved virtual IP
does. The proxy's own kernel still acknowledges what the client sends and answers its
TCP keepalive probes: only an application-level watchdog notices a half-open proxied
connection, TCP keepalives do not.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress
from dataclasses import dataclass, field


@dataclass
class _Link:
    """One proxied connection: its two sockets and whether it is frozen (half-open)."""

    client: socket.socket
    upstream: socket.socket
    flowing: threading.Event = field(default_factory=threading.Event)
    closed: bool = False


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; ``cut()`` drops every connection and refuses new ones.

    ``restore()`` accepts again.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self.accepted = 0  # connections forwarded so far (a reconnect adds one)
        self._cut = False
        self._closed = False
        self._requests = threading.Event()  # client -> target bytes may flow
        self._replies = threading.Event()  # target -> client bytes may flow
        self.resume()
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self) -> None:
        """Keep every connection open but forward nothing (a stalled server)."""
        self._requests.clear()
        self._replies.clear()

    def pause_requests(self) -> None:
        """Keep every connection open, forward what the target sends, hold what clients send."""
        self._requests.clear()

    def half_open(self) -> int:
        """Freeze every open connection both ways, closing neither side; return how many.

        New connections are forwarded as usual. ``resume()`` thaws the frozen ones (held
        bytes then arrive, as TCP retransmits them once a partition heals); ``cut()`` or
        ``close()`` closes them.
        """
        with self._lock:
            links = list(self._links)
        for link in links:
            link.flowing.clear()
        return len(links)

    def move_to(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        """Forward new connections to ``target_host:target_port``; open ones stay as they are."""
        with self._lock:
            self._target = (target_host, target_port)

    @property
    def open_connections(self) -> int:
        """Connections whose both sides are still open (frozen ones included)."""
        with self._lock:
            return sum(1 for link in self._links if not link.closed)

    def resume(self) -> None:
        with self._lock:
            links = list(self._links)
        for link in links:
            link.flowing.set()
        self._requests.set()
        self._replies.set()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            links, self._links = self._links, []
        for link in links:
            link.flowing.set()
            for sock in (link.client, link.upstream):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.resume()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse, target = self._cut, self._target
            if refuse:
                client.close()
                continue
            try:
                upstream = socket.create_connection(target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            link = _Link(client, upstream)
            link.flowing.set()
            with self._lock:
                self._links = [*(kept for kept in self._links if not kept.closed), link]
                self.accepted += 1
            for a, b, flowing in ((client, upstream, self._requests),
                                  (upstream, client, self._replies)):
                threading.Thread(target=self._pump, args=(a, b, flowing, link),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, flowing: threading.Event,
              link: _Link) -> None:
        try:
            while data := source.recv(65536):
                flowing.wait()
                link.flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # A frozen link passes on no close either: the server ending its side (e.g.
            # after wal_sender_timeout) must not reach the client as a FIN.
            link.flowing.wait()
            link.closed = True
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
