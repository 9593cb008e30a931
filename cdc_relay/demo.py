"""``cdc-relay demo``: the whole pipeline on throwaway local services, with live latency.

Owns the demo's run: check the prerequisites, start a private PostgreSQL cluster and a
memory-only broker (cdc_relay.local, local_broker), initialise the outbox (the code behind ``cdc-relay
init``), start the **real relay as a subprocess** (``cdc-relay run`` or ``poll``, as a
user would: the demo shows the shipped command, not an in-process shortcut), write
sample orders at a steady rate - the ``orders`` row and its event (``outbox.emit``) in
one transaction - and consume them back from Kafka with ``assign()``. Latency is
commit → receipt (the writer thread stamps after COMMIT, the consumer on receipt). The
run ends by itself with a summary; an event that never arrived is *lost*.

Everything it started is stopped in one ``finally``, also on Ctrl-C or SIGTERM (a second
Ctrl-C during that cleanup is ignored, so no server is left behind). Like
``cdc_relay.outbox``, this is application-side code importing psycopg and
confluent-kafka itself.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.errors import LocalServiceError, RelayError
from cdc_relay.local import PostgresCluster
from cdc_relay.local_broker import Broker
from cdc_relay.local_helpers import find_pg_bin_dir, tansu_binary
from cdc_relay.outbox import emit

TOPIC = "outbox.event.order"
PARTITIONS = 4
SLOT = "cdc_relay"
_ORDERS_DDL = """CREATE TABLE IF NOT EXISTS orders (
    id text PRIMARY KEY, customer text NOT NULL, total numeric(10, 2) NOT NULL,
    status text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"""


class DemoError(RelayError):
    """The demo could not run to its end (a service or the relay failed)."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What ``cdc-relay demo`` was asked to do."""

    events: int = 1_000
    rate: float = 50.0
    mode: str = "wal"  # "wal" or "poll"
    plugin: str = "wal2json"
    drain_timeout: float = 30.0

    def relay_args(self, dsn: str, brokers: str) -> list[str]:
        """The ``cdc-relay`` arguments of the relay under demonstration."""
        common = ["--dsn", dsn, "--brokers", brokers, "--log-level", "warning"]
        if self.mode == "poll":
            return ["poll", *common]
        return ["run", *common, "--plugin", self.plugin, "--slot", SLOT]

    def describe(self) -> str:
        kind = f"WAL mode ({self.plugin})" if self.mode == "wal" else "polling mode (NOTIFY)"
        return f"{kind}, {self.events:,} events at {self.rate:g}/s"


@dataclass
class Book:
    """Commit and receipt times per event id, shared by the writer thread and the consumer.

    Either may come first (a receipt can be stamped before the writer thread has recorded
    its commit), so each side pairs with the other under one lock.
    """

    commits: dict[str, float] = field(default_factory=dict)
    receipts: dict[str, float] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)  # appended only: slices are safe
    paired: int = 0  # committed events that were received
    duplicates: int = 0
    out_of_order: int = 0
    _last_seq: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _pair(self, committed: float | None, received: float | None) -> None:
        if committed is not None and received is not None:
            self.paired += 1
            self.latencies_ms.append((received - committed) * 1000)

    def committed(self, event_id: str, at: float) -> None:
        """The writer committed ``event_id`` at ``at``."""
        with self._lock:
            self.commits[event_id] = at
            self._pair(at, self.receipts.get(event_id))

    def received(self, event_id: str, aggregate_id: str, seq: int, at: float) -> None:
        """The consumer got ``event_id`` (duplicates and per-order order are checked here)."""
        with self._lock:
            if event_id in self.receipts:
                self.duplicates += 1
                return
            self.receipts[event_id] = at
            self._pair(self.commits.get(event_id), at)
            last = self._last_seq.get(aggregate_id, 0)
            self.out_of_order += seq < last
            self._last_seq[aggregate_id] = max(seq, last)


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value or ""


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """The demo's result; ``ok`` when nothing was lost."""

    written: int
    received: int
    duplicates: int
    lost: int
    out_of_order: int
    p50_ms: float
    p99_ms: float
    seconds: float

    @property
    def ok(self) -> bool:
        return self.lost == 0

    def __str__(self) -> str:
        return "\n".join([
            "summary:",
            f"  events written   {self.written:,}",
            f"  events received  {self.received:,}",
            f"  duplicates       {self.duplicates:,}",
            f"  lost             {self.lost:,}",
            f"  out of order     {self.out_of_order:,} (per order: placed → paid → shipped)",
            f"  latency          p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms "
            "(commit → consumer receipt)",
            f"  duration         {self.seconds:.1f} s",
        ])


def check_prerequisites(config: DemoConfig) -> None:
    """LocalServiceError naming what to install, before anything is started."""
    find_pg_bin_dir()
    try:
        tansu_binary()
    except LocalServiceError as exc:
        raise LocalServiceError(f"{exc} (the demo's local broker; `make demo` installs it)") from exc
    if config.mode == "wal" and config.plugin != "pgoutput":
        cluster = PostgresCluster()
        if not cluster.has_plugin(config.plugin):
            raise LocalServiceError(
                f"{config.plugin} is not installed for PostgreSQL {cluster.version}: "
                f"apt-get install postgresql-{cluster.version}-{config.plugin} "
                "(or run the demo with --plugin pgoutput, which needs no extension)")


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so one cleanup path serves both.

    Installed explicitly: a shell starts background jobs with SIGINT ignored, and the
    demo must still stop everything when it gets one.
    """
    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


class Demo:
    """One demo run. ``run()`` starts, streams, summarises and always stops everything."""

    def __init__(self, config: DemoConfig, echo: Callable[[str], None],
                 status: Callable[[str], None]) -> None:
        self.config, self.echo, self.status = config, echo, status
        self.cluster: PostgresCluster | None = None
        self.broker: Broker | None = None
        self.relay: subprocess.Popen[bytes] | None = None
        self.consumer: Consumer | None = None
        self.tmp: Path | None = None
        self.book = Book()
        self.written = 0
        self.writer_error: BaseException | None = None
        self.stop_writing = threading.Event()
        self.writer: threading.Thread | None = None

    # ------------------------------------------------------------ the run

    def run(self) -> DemoSummary:
        """Start everything, write and consume, return the summary; always clean up."""
        check_prerequisites(self.config)
        self.tmp = Path(tempfile.mkdtemp(prefix="cdc-relay-demo-"))
        previous_switch = sys.getswitchinterval()
        sys.setswitchinterval(0.001)  # receipts are stamped in Python: keep GIL waits short
        try:
            with _signals_interrupt():
                dsn, brokers = self._start_services()
                self._start_relay(dsn, brokers)
                self._subscribe(brokers)
                self._wait_relay_ready(dsn)
                summary = self._stream(dsn)
                self.echo(str(summary))
                return summary
        except KeyboardInterrupt:
            self.echo("\ninterrupted: stopping everything the demo started")
            raise
        finally:
            sys.setswitchinterval(previous_switch)
            self._cleanup()

    def _start_services(self) -> tuple[str, str]:
        self.echo(f"cdc-relay demo: {self.config.describe()}")
        self.cluster = PostgresCluster()
        self.cluster.start()
        dsn = self.cluster.create_database("demo")
        self.echo(f"  PostgreSQL {self.cluster.version}: {dsn} "
                  f"(data dir {self.cluster.data_dir})")
        self.broker = Broker()
        self.broker.start()
        self.echo(f"  broker (Tansu, in memory) at {self.broker.bootstrap}")
        from cdc_relay.schema import init_database  # the code behind `cdc-relay init`

        wal = self.config.mode == "wal"
        report = init_database(dsn, OutboxConfig(table=TableRef.parse("public.outbox_events")),
                               slot=SLOT if wal else None, plugin=self.config.plugin,
                               notify_trigger=not wal)
        self.echo("  init: " + str(report).replace("\n", "; "))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_ORDERS_DDL)
        return dsn, self.broker.bootstrap

    def _start_relay(self, dsn: str, brokers: str) -> None:
        args = self.config.relay_args(dsn, brokers)
        assert self.tmp is not None
        with open(self.tmp / "relay.log", "wb") as log:
            # Its own session: a terminal's Ctrl-C reaches only the demo, which then
            # stops the relay itself (SIGTERM: flush and confirm).
            self.relay = subprocess.Popen([sys.executable, "-m", "cdc_relay", *args], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        self.echo(f"  relay: cdc-relay {' '.join(args)} (pid {self.relay.pid})")

    def _subscribe(self, brokers: str) -> None:
        admin = AdminClient({"bootstrap.servers": brokers, "log_level": 3})
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)],
                                          operation_timeout=10).values():
            with contextlib.suppress(KafkaException):  # already exists
                future.result()
        self.consumer = Consumer({
            "bootstrap.servers": brokers, "group.id": "cdc-relay-demo",
            "enable.auto.commit": False, "fetch.wait.max.ms": 10, "log_level": 3,
        })
        self.consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        # The first fetches after assign() set up connections and offsets (~200 ms here):
        # done now, or the first events' latency would include them.
        self.consumer.consume(num_messages=1, timeout=0.5)

    def _relay_alive(self) -> None:
        if self.relay is not None and self.relay.poll() is not None and self.tmp is not None:
            tail = (self.tmp / "relay.log").read_text(errors="replace").strip()[-1500:]
            raise DemoError(f"the relay exited with code {self.relay.returncode}:\n{tail}")

    def _wait_relay_ready(self, dsn: str, timeout: float = 60.0) -> None:
        """Until the relay reads: the slot is active (WAL) or its poller is connected."""
        query = ("SELECT count(*) FROM pg_replication_slots WHERE active" if self.config.mode == "wal"
                 else "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cdc-relay poll 0'")
        deadline = time.monotonic() + timeout
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not (conn.execute(query).fetchone() or (0,))[0]:
                self._relay_alive()
                if time.monotonic() > deadline:
                    raise DemoError(f"the relay did not start reading within {timeout:.0f} s")
                time.sleep(0.05)

    # ------------------------------------------------------------ writing and consuming

    def _write(self, dsn: str) -> None:
        """Writer thread: orders and their events, one transaction each, on a schedule."""
        try:
            with psycopg.connect(dsn) as conn:
                started = time.monotonic()
                for n in range(self.config.events):
                    delay = started + n / self.config.rate - time.monotonic()
                    if delay > 0 and self.stop_writing.wait(delay):
                        return
                    if self.stop_writing.is_set():
                        return
                    event_id = self._order_step(conn, n)
                    conn.commit()
                    self.book.committed(str(event_id), time.time())
                    self.written = n + 1
        except BaseException as exc:
            self.writer_error = exc

    @staticmethod
    def _order_step(conn: psycopg.Connection[Any], n: int) -> uuid.UUID:
        """Event ``n``: every order is placed, then paid, then shipped (3 events)."""
        order, seq = f"order-{n // 3 + 1:06d}", n % 3 + 1
        total = round(10 + (n // 3) % 90 * 1.25, 2)
        if seq == 1:
            conn.execute("INSERT INTO orders (id, customer, total, status) VALUES (%s, %s, %s, 'placed')",
                         (order, f"customer-{n % 17}", total))
            return emit(conn, "order", order, "OrderPlaced",
                        {"orderId": order, "seq": seq, "total": total, "currency": "EUR"})
        status = "paid" if seq == 2 else "shipped"
        conn.execute("UPDATE orders SET status = %s, updated_at = now() WHERE id = %s", (status, order))
        return emit(conn, "order", order, "OrderPaid" if seq == 2 else "OrderShipped",
                    {"orderId": order, "seq": seq, "status": status})

    def _consume(self, timeout: float) -> None:
        assert self.consumer is not None
        message = self.consumer.poll(timeout)
        if message is None or message.error() is not None:
            return
        at = time.time()
        headers = dict(message.headers() or [])
        try:
            seq = int(orjson.loads(message.value() or b"{}").get("seq", 0))
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            seq = 0
        self.book.received(_text(headers.get("id")), _text(message.key()), seq, at)

    def _stream(self, dsn: str) -> DemoSummary:
        self.echo(f"  writing orders to PostgreSQL, reading {TOPIC} from the broker")
        self.writer = threading.Thread(target=self._write, args=(dsn,), name="demo-writer",
                                       daemon=True)
        started = time.monotonic()
        self.writer.start()
        next_status, drain_deadline = 0.0, None
        while True:
            self._consume(0.05)
            now = time.monotonic()
            if self.writer_error is not None:
                raise DemoError(f"writing orders failed: {self.writer_error}") from self.writer_error
            if now >= next_status:
                self._relay_alive()
                self.status(self._status_line(now - started))
                next_status = now + 0.5
            if self.writer.is_alive():
                continue
            if self.book.paired >= self.written:
                break
            drain_deadline = drain_deadline or now + self.config.drain_timeout
            if now > drain_deadline:
                break
        self.status(self._status_line(time.monotonic() - started))
        self.status("")
        book = self.book
        latencies = book.latencies_ms[:]
        return DemoSummary(written=self.written, received=len(book.receipts),
                           duplicates=book.duplicates, lost=self.written - book.paired,
                           out_of_order=book.out_of_order,
                           p50_ms=percentile(latencies, 0.50), p99_ms=percentile(latencies, 0.99),
                           seconds=time.monotonic() - started)

    def _status_line(self, elapsed: float) -> str:
        window = self.book.latencies_ms[-5_000:]
        received = len(self.book.receipts)
        latency = (f"p50 {percentile(window, 0.5):.1f} ms  p99 {percentile(window, 0.99):.1f} ms"
                   if window else "p50 -  p99 -")
        return (f"  written {self.written:,}/{self.config.events:,}  received {received:,}  "
                f"{received / max(elapsed, 1e-3):,.0f} events/s  {latency}  {elapsed:.0f} s")

    # ------------------------------------------------------------ cleanup

    def _cleanup(self) -> None:
        """Stop relay, consumer, broker and cluster; a Ctrl-C meanwhile is ignored."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.stop_writing.set()
            if self.writer is not None:
                self.writer.join(10)
            if self.relay is not None and self.relay.poll() is None:
                self.relay.terminate()  # a clean stop: flush, confirm
                try:
                    self.relay.wait(15)
                except subprocess.TimeoutExpired:
                    self.relay.kill()
                    self.relay.wait(15)
            with contextlib.suppress(Exception):
                if self.consumer is not None:
                    self.consumer.close()
            for service in (self.broker, self.cluster):
                if service is not None:
                    with contextlib.suppress(Exception):
                        service.cleanup()
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            self.echo("stopped everything the demo started (relay, broker, PostgreSQL)")
        finally:
            signal.signal(signal.SIGINT, previous)


def run_demo(config: DemoConfig, echo: Callable[[str], None],
             status: Callable[[str], None]) -> DemoSummary:
    """Run the demo; ``echo`` prints a line, ``status`` redraws the live progress line."""
    return Demo(config, echo, status).run()
