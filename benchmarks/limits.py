"""The machine's limits: what the relay's two ends can do without the relay.

* ``recvlogical_limits``: ``pg_recvlogical`` drains the same kind of backlog (N events,
  100 per transaction) from a fresh slot with exactly the relay's plugin options
  (cdc_relay.decoding.*.plugin_options), writing to /dev/null, with ``--endpos`` at the
  end of the backlog: the walsender's decoding speed with a C client (events/s = N /
  wall time from start to exit). One slot per plugin, both created before the preload.
* ``producer_limit``: a bare confluent-kafka idempotent producer with the relay's
  producer settings sends N relay-like messages (same size, key and headers) to a fresh
  broker: the broker's and librdkafka's speed with a tight Python loop, and the broker's
  own CPU per message (what the broker costs with nothing of the relay's around it).
* ``broker_floor``: bare producer → consumer latency at a fixed rate, on the same kind
  of topic for as long as a mode's latency phase: the floor under every end-to-end
  latency figure of this broker (whose fetches get slower as a partition grows).

Must not: run the relay.
"""

from __future__ import annotations

import pickle
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.brokers import new_broker
from benchmarks.kafka_side import (
    create_topics,
    floor_producer_process,
    producer_limit_process,
)
from benchmarks.latency import measure
from benchmarks.plan import EVENTS_PER_BACKLOG_TXN, Plan
from benchmarks.procs import CTX, finish, run_cli, spawn
from benchmarks.procstat import cpu_seconds, postmaster_pid, tree_cpu_seconds
from benchmarks.progress import Progress
from benchmarks.workload import TABLE, preload
from cdc_relay.config import TableRef
from cdc_relay.decoding.pgoutput import plugin_options as pgoutput_options
from cdc_relay.decoding.wal2json import plugin_options as wal2json_options
from cdc_relay.local.postgres import PostgresCluster

_PUBLICATION = "bench_limits"


def recvlogical_limits(cluster: PostgresCluster, events: int, progress: Progress,
                       logs: Path) -> dict[str, Any]:
    """pg_recvlogical's drain rate of an ``events``-event backlog, per plugin."""
    name = "bench_limits"
    dsn = cluster.create_database(name)
    try:
        run_cli(["init", "--dsn", dsn, "--no-slot", "--no-trigger"], logs / "limits-init.log")
        plugins = {"wal2json": wal2json_options(TableRef.parse(TABLE)),
                   "pgoutput": pgoutput_options(_PUBLICATION)}
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE PUBLICATION {_PUBLICATION} FOR TABLE {TABLE} "
                         "WITH (publish = 'insert')")
            for plugin in plugins:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)",
                             (f"limit_{plugin}", plugin))
        progress.phase("limits", f"preload backlog of {events:,}", events)
        preload(dsn, events, EVENTS_PER_BACKLOG_TXN, "order", progress.update)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {TABLE}")  # as before a mode's backlog run
            conn.execute("CHECKPOINT")
            end = _one(conn, "SELECT pg_current_wal_lsn()::text")
        results: dict[str, Any] = {}
        for plugin, options in plugins.items():
            progress.phase("limits", f"pg_recvlogical {plugin}")
            results[plugin] = _drain(cluster, dsn, f"limit_{plugin}", options, end, events)
            results[plugin]["foreign_cpu_s"] = progress.phase_foreign()
            progress.result(f"limit pg_recvlogical {plugin} ({events:,}): "
                            f"{results[plugin]['eps']:,.0f} events/s "
                            f"({results[plugin]['seconds']:.2f} s)")
        return results
    finally:
        cluster.drop_database(name)


def _one(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def _drain(cluster: PostgresCluster, dsn: str, slot: str, options: list[tuple[str, str]],
           end: str, events: int) -> dict[str, Any]:
    args = [str(cluster.bin_dir / "pg_recvlogical"), "-d", dsn, "--slot", slot, "--start",
            "--endpos", end, "--no-loop", "-f", "/dev/null"]
    for key, value in options:
        args += ["-o", f"{key}={value}"]
    postmaster = postmaster_pid(cluster.data_dir)
    cpu_before = tree_cpu_seconds(postmaster)
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False,
                          stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed (exit {done.returncode}): {done.stderr.strip()}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The walsender's CPU reaches the postmaster's reaped-children total only once it
        # has exited: wait for the slot to be released before reading.
        deadline = time.monotonic() + 10
        while _one(conn, f"SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'") \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        cpu = tree_cpu_seconds(postmaster) - cpu_before
        reached = _one(conn, f"SELECT confirmed_flush_lsn >= '{end}'::pg_lsn "
                             f"FROM pg_replication_slots WHERE slot_name = '{slot}'")
    if not reached:
        raise RuntimeError(f"pg_recvlogical exited before its slot {slot} reached {end}")
    return {"eps": events / seconds, "seconds": seconds, "pg_cpu_s": cpu}


def producer_limit(events: int, progress: Progress, workdir: Path,
                   broker_kind: str) -> dict[str, Any]:
    """A bare idempotent producer's rate for ``events`` relay-like messages, on a fresh
    broker of ``broker_kind`` (benchmarks/brokers.py); the broker's CPU per message too."""
    progress.phase("limits", f"bare producer, {events:,}", events)
    with new_broker(broker_kind) as broker:
        create_topics(broker.bootstrap, ["bench.limit"])
        sent = CTX.Value("q", 0)
        out = workdir / "producer-limit.pkl"
        assert broker.pid is not None  # started
        broker_from = cpu_seconds(broker.pid)
        proc = spawn(producer_limit_process, broker.bootstrap, "bench.limit", events,
                     str(out), sent)
        try:
            while proc.is_alive():
                progress.update(sent.value)
                time.sleep(0.1)
        finally:
            finish(proc)
        # The producer's whole life (connect, warm-up message, N messages): a little more
        # than its timed span, the same for every run.
        broker_cpu = cpu_seconds(broker.pid) - broker_from
        if proc.exitcode != 0:
            raise RuntimeError(f"the bare producer failed (exit {proc.exitcode})")
    result: dict[str, Any] = pickle.loads(out.read_bytes())
    result["broker_cpu_us_per_event"] = round(broker_cpu / events * 1e6, 2)
    if result["acked"] != events:
        raise RuntimeError(f"the bare producer had {result['failed']} failed deliveries")
    result["eps"] = events / result["seconds"]
    result["foreign_cpu_s"] = progress.phase_foreign()
    progress.result(f"limit bare producer: {result['eps']:,.0f} events/s ({result['seconds']:.2f} s), "
                    f"broker CPU {result['broker_cpu_us_per_event']:.1f} µs/event")
    return result


def broker_floor(plan: Plan, progress: Progress, workdir: Path, rate: int,
                 linger_ms: int) -> dict[str, Any]:
    """Bare producer → consumer latency at ``rate`` msg/s on a fresh broker of the plan's kind."""
    progress.phase("broker-floor", f"linger.ms={linger_ms} at {rate}/s",
                   int(rate * (plan.warmup + plan.duration)))
    with new_broker(plan.broker) as broker:
        topic = f"bench.floor{rate}-linger{linger_ms}"
        create_topics(broker.bootstrap, [topic])
        stats = measure(progress, broker.bootstrap, topic, floor_producer_process,
                        (broker.bootstrap, topic, rate, plan.duration, plan.warmup, linger_ms),
                        seconds=plan.warmup + plan.duration, drain_timeout=10, workdir=workdir)
    stats = {"mode": "broker-floor", "rate_eps": rate, "producer_linger_ms": linger_ms, **stats,
             "foreign_cpu_s": progress.phase_foreign()}
    progress.result(f"broker floor (linger.ms={linger_ms}) at {rate}/s: p50 {stats['p50_ms']:.2f} ms, "
                    f"p99 {stats['p99_ms']:.2f} ms")
    return stats
