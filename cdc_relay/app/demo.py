"""``cdc-relay demo``: the whole pipeline on throwaway local services, with live latency.

Owns the demo's run: check the prerequisites, start a private PostgreSQL cluster and a
memory-only broker (cdc_relay.local.postgres, cdc_relay.local.broker), initialise the outbox (the
code behind ``cdc-relay init``), start the **real relay as a subprocess** (``cdc-relay
run`` or ``poll``, as a user would: the demo shows the shipped command, not an
in-process shortcut), stream the sample traffic through it (cdc_relay.demo.traffic:
orders written at a steady rate, consumed back from Kafka) while redrawing the live line
(cdc_relay.demo.report), then print the summary. Latency is commit → receipt (the
writer thread stamps after COMMIT, the consumer on receipt). The run ends by itself; an
event that never arrived is *lost*.

Everything it started is stopped in one ``finally``, also on Ctrl-C or SIGTERM (a second
Ctrl-C during that cleanup is ignored, so no server is left behind). Must not generate
the traffic or compute the figures itself. Like ``cdc_relay.outbox``, this is
application-side code importing psycopg and confluent-kafka itself.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psycopg
from confluent_kafka import Consumer

from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.demo.report import DemoSummary, status_line, summarize
from cdc_relay.demo.traffic import ORDERS_DDL, TOPIC, Book, OrderWriter, consume_one, subscribe
from cdc_relay.errors import DemoError, LocalServiceError
from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import find_pg_bin_dir, tansu_binary
from cdc_relay.local.postgres import PostgresCluster

SLOT = "cdc_relay"


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What ``cdc-relay demo`` was asked to do."""

    events: int = 1_000
    rate: float = 50.0
    mode: str = "wal"  # "wal" or "poll"
    plugin: str = "pgoutput"
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
        self.writer: OrderWriter | None = None

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
        from cdc_relay.app.init import init_database  # the code behind `cdc-relay init`

        wal = self.config.mode == "wal"
        report = init_database(dsn, OutboxConfig(table=TableRef.parse("public.outbox_events")),
                               slot=SLOT if wal else None, plugin=self.config.plugin,
                               notify_trigger=not wal)
        self.echo("  init: " + str(report).replace("\n", "; "))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(ORDERS_DDL)
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
        self.consumer = subscribe(brokers)

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

    # ------------------------------------------------------------ streaming

    def _stream(self, dsn: str) -> DemoSummary:
        self.echo(f"  writing orders to PostgreSQL, reading {TOPIC} from the broker")
        writer = self.writer = OrderWriter(dsn, self.config.events, self.config.rate, self.book)
        started = time.monotonic()
        writer.start()
        next_status, drain_deadline = 0.0, None
        consumer = self.consumer
        assert consumer is not None
        while True:
            consume_one(consumer, self.book, 0.05)
            now = time.monotonic()
            if writer.error is not None:
                raise DemoError(f"writing orders failed: {writer.error}") from writer.error
            if now >= next_status:
                self._relay_alive()
                self._show_status(now - started)
                next_status = now + 0.5
            if writer.is_alive():
                continue
            if self.book.paired >= writer.written:
                break
            drain_deadline = drain_deadline or now + self.config.drain_timeout
            if now > drain_deadline:
                break
        self._show_status(time.monotonic() - started)
        self.status("")
        return summarize(self.book, writer.written, time.monotonic() - started)

    def _show_status(self, elapsed: float) -> None:
        written = self.writer.written if self.writer is not None else 0
        self.status(status_line(self.book, written, self.config.events, elapsed))

    # ------------------------------------------------------------ cleanup

    def _cleanup(self) -> None:
        """Stop relay, consumer, broker and cluster; a Ctrl-C meanwhile is ignored."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.writer is not None:
                self.writer.stop(10)
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
