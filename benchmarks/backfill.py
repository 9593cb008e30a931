"""Backfill benchmark: ``run --snapshot initial`` on a pending backlog vs streaming the same backlog.

``python -m benchmarks.backfill [--events 200000] [--plugin wal2json] [--broker kafka|tansu]
[--out DIR]``

Three scenarios, each on a fresh database and a fresh broker (``--broker``: Apache Kafka
4.1 by default, or Tansu; benchmarks/brokers.py), ``--events`` rows of ~200 B
(1,000 aggregates, transactions of 1,000), start-up included (relay start → the last
distinct id counted by a consumer in a child process):

* **backfill**: the rows are pending before the slot exists; ``run --snapshot initial``
  creates the slot, publishes them, marks them processed;
* **streaming**: the rows are committed after ``init`` created the slot; ``run`` streams them;
* **crash**: as *backfill*, but the relay is ``kill -9``-ed once its progress record says
  half of the rows are done, and restarted at once with the same command; reported: the total, the extra time
  over *backfill*, and how many rows the restart published again.

Writes ``backfill.json`` in ``--out`` and prints a markdown table. Not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from benchmarks.brokers import BROKERS, DEFAULT_BROKER, new_broker
from benchmarks.kafka_side import PARTITIONS, count_process, create_topics
from benchmarks.machine import load_average
from benchmarks.procs import (
    CTX,
    RelayProcess,
    byte_compile,
    code_under_test,
    finish,
    run_cli,
    spawn,
    wait_event,
)
from benchmarks.workload import AGGREGATES, payload
from cdc_relay.local.postgres import PostgresCluster

TOPIC = "bf.order"
BATCH = 1000


def _fill(dsn: str, events: int) -> None:
    with psycopg.connect(dsn) as conn:
        for first in range(0, events, BATCH):
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)"
                    " VALUES ('order', %s, 'OrderPlaced', %s)",
                    [(f"agg-{n % AGGREGATES}", payload(n)) for n in range(first, first + BATCH)])
            conn.commit()


def _processed(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL"
                           ).fetchone()
    return int(row[0]) if row else 0


def _count_all(bootstrap: str, idle: float = 2.0) -> int:
    """Every message on the topic, duplicates included (reads until ``idle`` s bring nothing)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-count-all",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    total, quiet_since = 0, time.monotonic()
    try:
        while time.monotonic() - quiet_since < idle:
            batch = [m for m in consumer.consume(num_messages=10_000, timeout=0.2)
                     if m.error() is None]
            if batch:
                total += len(batch)
                quiet_since = time.monotonic()
    finally:
        consumer.close()
    return total


def _rows_done(dsn: str) -> int:
    """The backfill's own progress record (cheap: a count over the outbox would slow it)."""
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass('cdc_relay_backfill')").fetchone() == (None,):
            return 0
        row = conn.execute("SELECT rows_done FROM cdc_relay_backfill").fetchone()
    return int(row[0]) if row else 0


def _relay_args(dsn: str, bootstrap: str, plugin: str, snapshot: str) -> list[str]:
    return ["run", "--dsn", dsn, "--brokers", bootstrap, "--plugin", plugin, "--snapshot",
            snapshot, "--topic-pattern", "bf.{aggregate_type}"]


def scenario(cluster: PostgresCluster, name: str, events: int, plugin: str,
             work: Path, broker_kind: str = DEFAULT_BROKER) -> dict[str, Any]:
    """One scenario on a fresh database and broker; see the module docstring."""
    dsn = cluster.create_database(f"bench_{name}")
    log = work / f"{name}.log"
    init = ["init", "--dsn", dsn, "--plugin", plugin, "--no-trigger"]
    run_cli(init if name == "streaming" else [*init, "--no-slot"], log)
    _fill(dsn, events)
    with new_broker(broker_kind) as broker:
        create_topics(broker.bootstrap, [TOPIC])
        received, first_at, done_at = CTX.Value("q", 0), CTX.Value("d", 0.0), CTX.Value("d", 0.0)
        ready, stop = CTX.Event(), CTX.Event()
        consumer = spawn(count_process, broker.bootstrap, TOPIC, events, received, first_at,
                         done_at, ready, stop)
        wait_event(ready, consumer, "the consumer")
        snapshot = "never" if name == "streaming" else "initial"
        args = _relay_args(dsn, broker.bootstrap, plugin, snapshot)
        started = time.time()
        relay = RelayProcess(args, log)
        result: dict[str, Any] = {"scenario": name, "events": events, "plugin": plugin,
                                  "broker": broker_kind}
        if name == "crash":
            while _rows_done(dsn) < events // 2:
                relay.check_alive()
                time.sleep(0.1)
            relay.proc.send_signal(signal.SIGKILL)
            relay.proc.wait(10)
            result["killed_at_s"] = round(time.time() - started, 2)
            result["marked_at_kill"] = _processed(dsn)
            relay = RelayProcess(args, log)
        while not done_at.value:
            relay.check_alive()
            time.sleep(0.05)
        total = done_at.value - started
        relay.stop()
        stop.set()
        finish(consumer)
        result["duplicates"] = _count_all(broker.bootstrap) - events
    cluster.drop_database(f"bench_{name}")
    result.update(seconds=round(total, 2), events_per_s=round(events / total),
                  load_average=load_average())
    if name == "crash":
        redone = re.findall(r"backfill: (\d+) pending rows", log.read_text(errors="replace"))
        result["rows_redone"] = int(redone[-1]) if len(redone) >= 2 else None
    return result


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| scenario (median run) | events | seconds (start-up included) | events/s "
            "| duplicates |", "|---|---|---|---|---|"]
    rows += [f"| {r['scenario']} | {r['events']:,} | {r['seconds']} | {r['events_per_s']:,} "
             f"| {r['duplicates']:,} |" for r in results]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--plugin", default="wal2json", choices=["wal2json", "pgoutput"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--scenarios", default="backfill,streaming,crash")
    parser.add_argument("--repeat", type=int, default=1, help="runs per scenario (medians)")
    parser.add_argument("--broker", default=DEFAULT_BROKER, choices=BROKERS,
                        help="the Kafka broker (benchmarks/brokers.py), a fresh one per scenario")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    byte_compile(*code_under_test())  # relays start as installed ones (benchmarks/procs.py)
    results = []
    with tempfile.TemporaryDirectory() as tmp, \
            PostgresCluster(settings={"full_page_writes": "on"}) as cluster:
        for _ in range(options.repeat):  # interleaved, so load drifts hit every scenario
            for name in options.scenarios.split(","):
                results.append(scenario(cluster, name, options.events, options.plugin, Path(tmp),
                                        options.broker))
                print(json.dumps(results[-1]), flush=True)
    (options.out / "backfill.json").write_text(json.dumps(results, indent=2))
    medians = [_median([r for r in results if r["scenario"] == name])
               for name in options.scenarios.split(",")]
    print(table(medians))
    clean = next((r for r in medians if r["scenario"] == "backfill"), None)
    crash = next((r for r in medians if r["scenario"] == "crash"), None)
    if clean and crash:
        print(f"crash: +{crash['seconds'] - clean['seconds']:.1f} s over a clean backfill "
              f"(medians); killed with ~{crash['marked_at_kill']:,} rows marked, the restart "
              f"redid ~{crash['rows_redone']} rows, ~{crash['duplicates']:,} published twice")


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median time (its other figures come with it)."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    return ordered[len(ordered) // 2]


if __name__ == "__main__":
    main()
