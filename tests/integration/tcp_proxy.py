"""A TCP proxy the integration tests put between the relay and a server to fail the network.

``cut()`` stands in for a network failure towards a broker the test may not restart (the
machine's shared RabbitMQ and NATS); ``pause()`` for a stalled server.
``pause_requests()`` stalls one direction only: what the clients send is held while the
server's bytes still arrive, e.g. the relay's standby status updates stop reaching the
walsender while the WAL stream goes on. Bytes held by a pause are dropped by ``cut()``;
``resume()`` forwards them.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; ``cut()`` drops every connection and refuses new ones.

    ``restore()`` accepts again.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
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

    def resume(self) -> None:
        self._requests.set()
        self._replies.set()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
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
                refuse = self._cut
            if refuse:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for a, b, flowing in ((client, upstream, self._requests),
                                  (upstream, client, self._replies)):
                threading.Thread(target=self._pump, args=(a, b, flowing), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, flowing: threading.Event) -> None:
        try:
            while data := source.recv(65536):
                flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
