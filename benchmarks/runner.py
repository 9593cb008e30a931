"""One mode of the benchmark: backlog throughput, then latency at each insert rate.

For a mode: a fresh broker of the plan's kind (benchmarks/brokers.py: Apache Kafka, or
Tansu, which never frees memory) and a fresh database in
the shared cluster; ``cdc-relay init`` with the mode's options; topics created up front
so consumers are assigned before the first message, and one idempotent message through the
broker (``warm_up``: a fresh Apache Kafka's first producer id waits for its coordinator,
which no running broker does).

**Backlog throughput.** Preload N events (100 per transaction), ``VACUUM ANALYZE`` and
``CHECKPOINT`` (so autovacuum does not wake up mid-run and polling's first update of each
page pays its full-page image, as it would in production), then start the relay and a
consumer that counts distinct events. ``seconds`` runs from spawning the relay to the
consumer holding all N: start-up, producer warm-up and Kafka delivery included - the
end-to-end definition every mode shares. ``steady_eps`` excludes start-up (first to last
receipt); ``acked_s`` is when PostgreSQL knew it (WAL: the slot's confirmed_flush_lsn
reached the end of the last outbox transaction's commit, read before VACUUM and
CHECKPOINT; polling: no row left pending).
PostgreSQL CPU (the cluster's process tree), WAL bytes (``pg_current_wal_lsn`` delta)
and the relay's CPU and peak RSS are read at ``acked_s``, before the relay is stopped;
rows written (``pg_stat_user_tables``) after it stopped, when its backend has flushed
its statistics. The broker's CPU (Kafka modes: the fresh broker is ours) and the counting
consumer's, from its ready signal, are read when the consumer holds every event: they
share the two cores with the relay and PostgreSQL, so they show where the machine's CPU
went (benchmarks/history/2026-12.md, "Who uses the two cores").

**Latency.** A second, fresh relay; once a probe event has come through, for each rate a
writer commits events on a fixed schedule and a consumer stamps their receipt
(latency.py).

The debezium-embedded modes run Debezium (benchmarks/debezium.py) where the relay
would run, measured the same way.

The table-CDC modes (``workload="table"``: capture-pgoutput, debezium-capture) create the
captured table before ``init --capture``, preload a mixed backlog of N changes into it
instead of outbox rows (benchmarks/table_cdc.py) and count change events - not the
tombstones, which are recorded apart (``tombstones_per_event``) - on its topic; otherwise
measured as above. Backlog throughput only: the latency harness matches outbox event ids.

Modes with another sink (wal-rabbitmq, wal-nats, wal-sqs, wal-redis, wal-http, wal-kinesis)
use a RabbitMQ, NATS, Redis, HTTP receiver or moto server of their own with names of the
run's own (other_sinks.py, batching_sinks.py) instead of a
fresh broker, and measure backlog throughput only: the latency harness reads Kafka.

Must not: start the cluster (the caller shares one across modes) or write output files.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg

from benchmarks import table_cdc
from benchmarks.brokers import new_broker
from benchmarks.kafka_side import count_process, create_topics, warm_up
from benchmarks.latency import measure
from benchmarks.other_sinks import machine_sink
from benchmarks.plan import EVENTS_PER_BACKLOG_TXN, Mode, Plan
from benchmarks.procs import CTX, RelayProcess, finish, run_cli, spawn, wait_event
from benchmarks.procstat import cpu_seconds, postmaster_pid, tree_cpu_seconds
from benchmarks.progress import Progress
from benchmarks.workload import ORDER_PLACED_AVRO, TABLE, Backlog, preload, rate_writer, rows
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import insert_statement

TOPIC_PATTERN = "bench.{aggregate_type}"
BACKLOG = "backlog"  # aggregate_type (and topic suffix) of the backlog events
_TABLE_NAME = TABLE.split(".")[1]


def scalar(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    """The first column of the first row (None for a statement that returns none)."""
    cur = conn.execute(query, args)
    row = cur.fetchone() if cur.description is not None else None
    return None if row is None else row[0]


def _rows_written(conn: psycopg.Connection[Any]) -> int:
    return int(scalar(conn, "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables "
                          "WHERE relname = %s", _TABLE_NAME))


class ModeRun:
    """Runs one mode against a shared PostgreSQL cluster."""

    def __init__(self, plan: Plan, mode: Mode, cluster: PostgresCluster, progress: Progress,
                 workdir: Path) -> None:
        self.plan, self.mode, self.cluster, self.progress = plan, mode, cluster, progress
        self.workdir = workdir
        self.errors: list[str] = []  # a latency rate that failed (the figures before it stay)
        self.db = "bench_" + mode.name.replace("-", "_")
        self.table_cdc = mode.workload == "table"
        self.dsn = ""
        self.bootstrap = ""
        self.broker_pid: int | None = None  # the fresh Kafka broker (machine brokers are not ours)
        self.sink_args: tuple[str, ...] = ()
        self.registry_args: tuple[str, ...] = ()  # --schema-registry … for a registry mode
        self.counter: Any = count_process
        self.counter_args: Any = lambda topic: (self.bootstrap, topic)
        # One connection for every check while the relay runs: a new connection per check
        # would fork a backend each time and show up as PostgreSQL CPU.
        self.monitor: psycopg.Connection[Any] | None = None

    def run(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(a throughput entry per backlog size, latency entries) for this mode.

        Every measurement gets a fresh database and a fresh broker.
        """
        throughput = []
        for n in self.plan.sizes:
            with self._fresh():
                throughput.append(self.throughput(n))
        # the latency harness reads JSON outbox events
        if self.mode.sink != "kafka" or self.table_cdc or self.mode.registry:
            return throughput, []
        with self._fresh():
            latency = self.latency()
        return throughput, latency

    @contextlib.contextmanager
    def _fresh(self) -> Iterator[None]:
        """A new database (initialised for the mode) and a new broker with the topics."""
        self.dsn = self.cluster.create_database(self.db)
        try:
            with self._broker() as bootstrap, psycopg.connect(self.dsn, autocommit=True) as monitor:
                self.monitor = monitor
                self.bootstrap = bootstrap
                if self.table_cdc:  # before init --capture adds it to the publication
                    table_cdc.create_table(self.dsn)
                run_cli(["init", "--dsn", self.dsn, *self.mode.init_args], self._log("init"))
                with self._registry():
                    yield
        finally:
            self.monitor = None
            self.cluster.drop_database(self.db)

    @contextlib.contextmanager
    def _registry(self) -> Iterator[None]:
        """A fresh Apicurio Registry for a registry mode (its schema ids cached by the relay
        after the first event), and the relay's options for it."""
        if not self.mode.registry:
            yield
            return
        from cdc_relay.local.apicurio import ApicurioRegistry

        schema = self.workdir / "OrderPlaced.avsc"
        schema.write_text(orjson.dumps(ORDER_PLACED_AVRO).decode())
        registry = ApicurioRegistry()
        try:
            registry.start()
            self.registry_args = ("--schema-registry", registry.ccompat_url,
                                  "--value-schema", f"OrderPlaced={schema}")
            yield
        finally:
            self.registry_args = ()
            registry.cleanup()

    @contextlib.contextmanager
    def _broker(self) -> Iterator[str]:
        """A fresh Kafka broker (the plan's kind) with the run's topics, or the machine's
        RabbitMQ / NATS."""
        if self.mode.sink == "kafka":
            with new_broker(self.plan.broker) as broker:
                create_topics(broker.bootstrap, [f"bench.{BACKLOG}", "bench.probe",
                                                 *(f"bench.lat{r}" for r in self.plan.rates),
                                                 *([table_cdc.TOPIC] if self.table_cdc else [])])
                warm_up(broker.bootstrap, self.plan.broker_warmup)
                self.broker_pid = broker.pid
                try:
                    yield broker.bootstrap
                finally:
                    self.broker_pid = None
            return
        with machine_sink(self.mode.sink, [f"bench.{BACKLOG}"]) as side:
            self.sink_args, self.counter, self.counter_args = (side.relay_args, side.counter,
                                                               side.counter_args)
            yield side.brokers

    def _one(self, query: str, *args: Any) -> Any:
        assert self.monitor is not None
        return scalar(self.monitor, query, *args)

    def _log(self, what: str) -> Path:
        return self.workdir / f"{self.mode.name}-{what}.log"

    def _relay(self, what: str) -> RelayProcess:
        common = ["--dsn", self.dsn, "--brokers", self.bootstrap, "--topic-pattern", TOPIC_PATTERN]
        if not self.mode.is_relay:  # the classic baseline and Debezium take only the common options
            return RelayProcess([*self.mode.relay_args, *common], self._log(what),
                                module=self.mode.module)
        extra = self.plan.relay_extra if self.mode.sink == "kafka" else ()
        return RelayProcess([*self.mode.relay_args, *common, "--dead-letter-topic", "bench.dlq",
                             "--log-level", "warning", *self.sink_args, *self.registry_args, *extra],
                            self._log(what))

    # ------------------------------------------------------------ backlog throughput

    def throughput(self, n: int) -> dict[str, Any]:
        progress, name = self.progress, self.mode.name
        progress.phase(name, "preload backlog", n)
        started = time.perf_counter()
        if self.table_cdc:
            backlog = table_cdc.preload(self.dsn, n, EVENTS_PER_BACKLOG_TXN, progress.update)
        else:
            backlog = preload(self.dsn, n, EVENTS_PER_BACKLOG_TXN, BACKLOG, progress.update)
        preload_s = time.perf_counter() - started
        self._one(f"VACUUM ANALYZE {table_cdc.TABLE if self.table_cdc else TABLE}")
        self._one("CHECKPOINT")
        wal_before = str(self._one("SELECT pg_current_wal_lsn()::text"))
        rows_before = self._rows_written()
        postmaster = postmaster_pid(self.cluster.data_dir)

        received, first_at, done_at = CTX.Value("q", 0), CTX.Value("d", 0.0), CTX.Value("d", 0.0)
        ready, stop = CTX.Event(), CTX.Event()
        tombstones = CTX.Value("q", 0)
        if self.table_cdc:
            counter = spawn(table_cdc.count_changes_process, self.bootstrap, table_cdc.TOPIC, n,
                            received, first_at, done_at, ready, stop, tombstones)
        else:
            counter = spawn(self.counter, *self.counter_args(f"bench.{BACKLOG}"), n, received,
                            first_at, done_at, ready, stop)
        relay: RelayProcess | None = None
        try:
            wait_event(ready, counter, "the counting consumer")
            progress.phase(name, "backlog throughput", n)
            pg_cpu_before = tree_cpu_seconds(postmaster)
            assert counter.pid is not None  # started: wait_event saw it ready
            consumer_from = cpu_seconds(counter.pid)
            broker_from = cpu_seconds(self.broker_pid) if self.broker_pid else None
            relay = self._relay("throughput")
            spawned = relay.started
            deadline = time.monotonic() + max(300.0, n / 500)
            while not done_at.value:
                relay.check_alive()
                progress.update(received.value, received.value)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: only {received.value} of {n} events arrived")
                time.sleep(0.02)
            seconds = done_at.value - spawned
            consumer_cpu = cpu_seconds(counter.pid) - consumer_from  # it stays until told to stop
            broker_cpu = (float("nan") if self.broker_pid is None or broker_from is None
                          else cpu_seconds(self.broker_pid) - broker_from)
            acked_s = self._acked_after(backlog, spawned)
            pg_cpu = tree_cpu_seconds(postmaster) - pg_cpu_before
            wal_bytes = int(self._one("SELECT pg_current_wal_lsn() - %s::pg_lsn", wal_before))
            relay_cpu, relay_rss = relay.usage()
            foreign = progress.phase_foreign()
            exit_code = relay.stop()
            relay = None
        finally:
            stop.set()
            finish(counter)
            if relay is not None:
                relay.stop()
        rows_written = self._rows_after_stop(rows_before)
        steady = (n - 1) / (done_at.value - first_at.value) if done_at.value > first_at.value else 0.0
        entry = {"mode": name, "events": n, "seconds": round(seconds, 3), "eps": round(n / seconds, 1),
                 "pg_cpu_s": round(pg_cpu, 2), "relay_cpu_s": round(relay_cpu, 2),
                 "relay_peak_rss_mb": round(relay_rss, 1), "steady_eps": round(steady, 1),
                 "first_event_s": round(first_at.value - spawned, 3),
                 "acked_s": round(acked_s, 3), "wal_bytes_per_event": round(wal_bytes / n, 1),
                 "rows_written_per_event": round(rows_written / n, 3),
                 "pg_cpu_us_per_event": round(pg_cpu / n * 1e6, 2),
                 "relay_cpu_us_per_event": round(relay_cpu / n * 1e6, 2),
                 "broker_cpu_us_per_event": round(broker_cpu / n * 1e6, 2),
                 "consumer_cpu_us_per_event": round(consumer_cpu / n * 1e6, 2),
                 "preload_s": round(preload_s, 2), "relay_exit_code": exit_code,
                 "foreign_cpu_s": foreign}
        if self.table_cdc:  # tombstones the consumer saw before it stopped
            entry.update(workload="table", tombstones_per_event=round(tombstones.value / n, 3))
        steady_text = f"{steady:,.0f}/s" if steady else "n/a"
        progress.result(f"{name} backlog: {n:,} in {seconds:.2f} s = {entry['eps']:,.0f}/s "
                        f"(steady {steady_text}), PG CPU {pg_cpu:.1f} s, relay CPU "
                        f"{relay_cpu:.1f} s, RSS {relay_rss:.0f} MB")
        return entry

    def _acked_after(self, backlog: Backlog, spawned: float) -> float:
        """Seconds from spawn until PostgreSQL recorded the backlog (NaN: Debezium never did).

        Debezium confirms the last event's position, which may stay short of the last
        commit's end until more WAL comes: not waited for longer than 10 s.
        """
        if not self.mode.is_debezium:
            self._wait_acked(backlog)
            return time.time() - spawned
        try:
            self._wait_acked(backlog, timeout=10.0)
        except RuntimeError:
            return float("nan")
        return time.time() - spawned

    def _wait_acked(self, backlog: Backlog, timeout: float = 60.0) -> None:
        """Until PostgreSQL records the backlog as done (slot confirmed / rows processed).

        WAL: the slot past the last outbox transaction's commit, not past the VACUUM and
        CHECKPOINT after it (the relay can confirm WAL without events only when a
        keepalive shows it, benchmarks/README.md). Polled every 5 ms: the poll interval
        adds to ``acked_s``.
        """
        if self.mode.kind == "wal":
            query = ("SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                     "WHERE slot_name = 'cdc_relay'")
            args: tuple[Any, ...] = (backlog.end_lsn,)
        else:  # the last transaction's rows, then (below) the whole table
            query = f"SELECT count(*) = 0 FROM {TABLE} WHERE id = ANY(%s::uuid[]) AND processed_at IS NULL"
            args = (backlog.last_ids,)
        deadline = time.monotonic() + timeout
        while not self._one(query, *args) or (
                self.mode.kind == "poll" and self._one(
                    f"SELECT count(*) FROM {TABLE} WHERE processed_at IS NULL")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.mode.name}: PostgreSQL did not record the backlog as "
                                   f"relayed within {timeout:.0f} s")
            time.sleep(0.005)

    def _rows_after_stop(self, before: int, timeout: float = 10.0) -> int:
        """Rows the relay wrote: read once its backends are gone (their stats are flushed)."""
        deadline = time.monotonic() + timeout
        while self._one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'") \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        self._one("SELECT pg_stat_clear_snapshot()")
        return self._rows_written() - before

    def _rows_written(self) -> int:
        assert self.monitor is not None
        return _rows_written(self.monitor)

    # ------------------------------------------------------------ latency

    def latency(self) -> list[dict[str, Any]]:
        progress, name = self.progress, self.mode.name
        progress.phase(name, "latency: starting a fresh relay")
        relay = self._relay("latency")
        entries = []
        try:
            self._probe(relay)
            for rate in self.plan.rates:
                per_txn = self.plan.events_per_txn(rate)
                progress.phase(name, f"latency at {rate:,}/s ({per_txn}/txn)",
                               int(rate * (self.plan.warmup + self.plan.duration)))
                try:
                    stats = measure(progress, self.bootstrap, f"bench.lat{rate}", rate_writer,
                                    (self.dsn, f"lat{rate}", rate, per_txn, self.plan.duration,
                                     self.plan.warmup),
                                    seconds=self.plan.warmup + self.plan.duration,
                                    drain_timeout=30, workdir=self.workdir,
                                    check=relay.check_alive)
                except RuntimeError as exc:  # e.g. a rate the relay cannot keep up with
                    self.errors.append(f"latency at {rate:,}/s: {exc}")
                    progress.result(f"{name} latency at {rate:,}/s FAILED: {exc}")
                    break  # higher rates would fail the same way
                entry = {"mode": name, "rate_eps": rate, "events_per_txn": per_txn, **stats,
                         "foreign_cpu_s": progress.phase_foreign()}
                entries.append(entry)
                progress.result(f"{name} latency at {rate:,}/s: p50 {stats['p50_ms']:.1f} ms, "
                                f"p99 {stats['p99_ms']:.1f} ms, max {stats['max_ms']:.1f} ms"
                                + (f", {stats['missing']} missing" if stats["missing"] else ""))
        finally:
            relay.stop()
        return entries

    def _probe(self, relay: RelayProcess, timeout: float = 60.0) -> None:
        """Write probe events until one arrives: the relay is streaming."""
        received, first_at, done_at = CTX.Value("q", 0), CTX.Value("d", 0.0), CTX.Value("d", 0.0)
        ready, stop = CTX.Event(), CTX.Event()
        counter = spawn(count_process, self.bootstrap, "bench.probe", 1, received, first_at,
                        done_at, ready, stop)
        try:
            wait_event(ready, counter, "the probe consumer")
            deadline = time.monotonic() + timeout
            while not done_at.value:
                relay.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.mode.name}: the relay relayed nothing in {timeout} s")
                assert self.monitor is not None
                self.monitor.execute(insert_statement(TABLE), rows(0, 1, "probe")[0])
                time.sleep(0.2)
        finally:
            stop.set()
            finish(counter)
