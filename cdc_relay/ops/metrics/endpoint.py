"""Prometheus metrics, ``/healthz`` and ``/readyz`` (docs/design.md), served from a daemon thread.

The relay loops never touch a Prometheus object: they bump plain counters (``RelayStats``,
``PollStats``: cdc_relay/stats.py) and the collectors of
ops/metrics/collectors.py turn those into metric families at scrape time. This module owns
the rest: the slot lag probe, the health verdicts and the HTTP endpoint. What the loops
cannot know - how far the slot lags behind the server's WAL - comes from
``SlotLagProbe``: a timer thread with its own ordinary connection that reads
``pg_replication_slots`` / ``pg_current_wal_lsn()`` / ``pg_stat_replication`` every few
seconds (ops/status.py ``SlotReader``), and given a standby (``--standby-dsn``) the slot's
failover readiness on both servers (ops/failover/read.py ``FailoverReader``). It never runs on
the hot path and survives database outages: while it cannot read, the lag gauges are absent
and ``cdc_relay_slot_probe_success`` is 0.

Health: ``/healthz`` answers 503 when the loop is stuck - it is streaming (or polling)
but has not ticked for a while; while it is connecting, standing by for a busy slot or
backing off it is alive, so 200. ``/readyz`` answers 200 only while the replication
stream (or every poller) is connected and the producer is usable.

The HTTP server is ``http.server`` with access logging switched off: a request must not
put a plain-text line on stderr (docs/design.md, observability). Must not: mutate the stats, block the
loops, or open a connection per scrape.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cdc_relay.config import MetricsConfig
from cdc_relay.errors import ConfigError, RelayError
from cdc_relay.model import SlotStatus
from cdc_relay.ops.failover.facts import FailoverStatus
from cdc_relay.ops.failover.read import FailoverReader
from cdc_relay.ops.metrics.collectors import (
    BackfillCollector,
    BackfillFigures,
    FailoverCollector,
    PollCollector,
    ReadyCollector,
    SinkInfoCollector,
    TxnCollector,
    WalCollector,
    make_registry,
)
from cdc_relay.ops.status import SlotReader
from cdc_relay.stats import PollStats, RelayStats, TxnStats

log = logging.getLogger("cdc_relay.metrics")

LAG_INTERVAL = 5.0  # seconds between two slot lag probes
WAL_STALE_AFTER = 30.0  # a streaming loop that has not ticked for this long is stuck
POLL_STALE_AFTER = 90.0  # plus --interval: workers sleep up to the interval, wait for acks

HealthCheck = Callable[[], tuple[bool, str]]


# ---------------------------------------------------------------- the slot lag probe

class FailoverSource(Protocol):
    """Reads the failover verdict (ops/failover/read.py FailoverReader)."""

    def read(self) -> FailoverStatus: ...

    def close(self) -> None: ...


class SlotLagProbe:
    """Reads the slot's status (and, given a standby, failover readiness) every ``interval`` s."""

    def __init__(self, reader: SlotReader, *, interval: float = LAG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic,
                 failover: FailoverSource | None = None) -> None:
        self._reader = reader
        self._failover_reader = failover
        self.failover: FailoverStatus | None = None
        self.failover_ok = False
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slot-lag-probe", daemon=True)
        self.latest: SlotStatus | None = None  # None: no such slot (or not read yet)
        self.ok = False  # the last attempt succeeded
        self.read_at = 0.0  # clock() of the last attempt
        self.succeeded_at = 0.0  # wall-clock time of the last successful read

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def sample(self) -> None:
        """One probe: refresh ``latest`` or, on failure, mark the figures unknown."""
        try:
            self.latest = self._reader.read()
        except RelayError as exc:
            if self.ok or not self.read_at:
                log.warning("slot lag probe: %s; retrying every %.0fs", exc, self._interval)
            self.ok = False
            self.read_at = self._clock()
            return
        if not self.ok and self.read_at:
            log.info("slot lag probe: reading again")
        self.ok = True
        self.read_at = self._clock()
        self.succeeded_at = time.time()
        self._sample_failover()

    def _sample_failover(self) -> None:
        if self._failover_reader is None:
            return
        try:
            status = self._failover_reader.read()
        except RelayError as exc:
            if self.failover_ok:
                log.warning("failover probe: %s", exc)
            self.failover, self.failover_ok = None, False
            return
        if status.ready is False and (self.failover is None or self.failover.ready):
            log.warning("the slot is not failover-ready: %s", "; ".join(status.problems))
        self.failover, self.failover_ok = status, True

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self._interval)
        finally:
            self._reader.close()
            if self._failover_reader is not None:
                self._failover_reader.close()


# ---------------------------------------------------------------- health

def wal_health(stats: RelayStats, now: float, stale_after: float = WAL_STALE_AFTER) -> tuple[bool, str]:
    """Alive unless the stream is open and the loop has stopped turning."""
    if not stats.streaming:
        return True, "alive: not streaming (connecting, standing by or backing off)"
    age = now - stats.last_tick
    if age > stale_after:
        return False, f"stuck: the replication loop has not turned for {age:.0f}s"
    return True, "alive: streaming"


def wal_ready(stats: RelayStats) -> tuple[bool, str]:
    """Ready while the producer is usable and the replication stream is open.

    The producer comes first: the loop warms it before it opens the stream, so without a
    broker the stream is never open either, and the reason must name the broker.
    """
    if not stats.producer_ok:
        return False, "not ready: no usable producer (no broker answered, or the producer failed)"
    if not stats.streaming:
        return False, "not ready: the replication stream is not open"
    return True, "ready: streaming"


def poll_health(stats: PollStats, now: float, started: float,
                stale_after: float) -> tuple[bool, str]:
    """Alive while some worker has turned its loop recently (or since start-up)."""
    age = now - (stats.last_tick or started)
    if age > stale_after:
        return False, f"stuck: no poller has turned its loop for {age:.0f}s"
    return True, "alive: polling"


def poll_ready(stats: PollStats) -> tuple[bool, str]:
    """Ready while every worker has its connection and a broker answers."""
    if not stats.connected:
        return False, "not ready: the pollers are not connected to PostgreSQL"
    if not stats.broker_ok:
        return False, "not ready: waiting for the broker"
    return True, "ready: polling"


# ---------------------------------------------------------------- the HTTP endpoint

@dataclass(frozen=True, slots=True)
class Endpoints:
    """What the HTTP server answers with."""

    registry: CollectorRegistry
    health: HealthCheck
    ready: HealthCheck


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoints: Endpoints

    def server_bind(self) -> None:
        # HTTPServer's own looks the host up with getfqdn(): a DNS round trip at start-up.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback on stderr; a client that hung up is no news.
        log.debug("metrics request from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        endpoints = self.server.endpoints
        path = urlsplit(self.path).path
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(endpoints.registry), content_type)
        elif path in ("/healthz", "/readyz"):
            ok, reason = (endpoints.health if path == "/healthz" else endpoints.ready)()
            self._reply(200 if ok else 503, (reason + "\n").encode())
        elif path == "/":
            self._reply(200, b"cdc-relay: /metrics /healthz /readyz\n")
        else:
            self._reply(404, b"not found: try /metrics, /healthz or /readyz\n")

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """No access lines on stderr (they would break JSON logs)."""


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a daemon thread."""

    def __init__(self, config: MetricsConfig, endpoints: Endpoints) -> None:
        assert config.port is not None
        server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) \
            if ":" in config.host else _Server
        try:
            self._server = server_class((config.host, config.port), _Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {config.host}:{config.port}: "
                f"{exc.strerror or exc}; choose another --metrics-port or --metrics-host"
            ) from exc
        self._server.endpoints = endpoints
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http",
                                        kwargs={"poll_interval": 0.5}, daemon=True)

    @property
    def port(self) -> int:
        """The bound port (useful with ``--metrics-port 0``)."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _serving(server: MetricsServer, host: str) -> None:
    log.info("metrics on http://%s:%d/metrics (also /healthz, /readyz)", host, server.port,
             extra={"metrics_port": server.port})


@contextmanager
def serve_wal(config: MetricsConfig, stats: RelayStats, *, dsn: str, slot: str,
              backfill: BackfillFigures | None = None,
              sink: str = "kafka",
              txn: TxnStats | None = None) -> Iterator[MetricsServer | None]:
    """Serve WAL mode's metrics (with the slot lag probe, the backfill's and exactly-once's)."""
    if config.port is None:
        yield None
        return
    failover = None
    if config.standby_dsn is not None:
        failover = FailoverReader(dsn, config.standby_dsn, slot)
    probe = SlotLagProbe(SlotReader(dsn, slot), failover=failover)

    def ready() -> tuple[bool, str]:
        return wal_ready(stats)

    collectors: list[Any] = [WalCollector(stats, probe), ReadyCollector(ready),
                             SinkInfoCollector(sink)]
    if failover is not None:
        collectors.append(FailoverCollector(probe))
    if backfill is not None:
        collectors.append(BackfillCollector(backfill))
    if txn is not None:
        collectors.append(TxnCollector(txn))
    endpoints = Endpoints(make_registry(*collectors),
                          health=lambda: wal_health(stats, time.monotonic()), ready=ready)
    server = MetricsServer(config, endpoints)
    server.start()
    probe.start()
    _serving(server, config.host)
    try:
        yield server
    finally:
        probe.stop()
        server.close()


@contextmanager
def serve_poll(config: MetricsConfig, stats: PollStats, *,
               interval: float, sink: str = "kafka") -> Iterator[MetricsServer | None]:
    """Serve polling mode's metrics while the block runs."""
    if config.port is None:
        yield None
        return
    started = time.monotonic()
    stale_after = POLL_STALE_AFTER + interval

    def ready() -> tuple[bool, str]:
        return poll_ready(stats)

    endpoints = Endpoints(make_registry(PollCollector(stats), ReadyCollector(ready),
                                        SinkInfoCollector(sink)),
                          health=lambda: poll_health(stats, time.monotonic(), started, stale_after),
                          ready=ready)
    server = MetricsServer(config, endpoints)
    server.start()
    _serving(server, config.host)
    try:
        yield server
    finally:
        server.close()
