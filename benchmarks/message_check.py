"""Are Debezium's messages cdc-relay's? The same sample relayed by both, compared byte for byte.

Once per run with a debezium-embedded mode: a fresh database initialised as for
wal-pgoutput, a second pgoutput slot for Debezium, ``SAMPLE`` outbox events (the
benchmark's own plus payloads and keys with quotes, control characters and non-ASCII
text), then cdc-relay (``run --plugin pgoutput``, its defaults: the raw format) and
Debezium embedded (benchmarks/debezium.py) each relay them to a fresh broker of the run's
kind (benchmarks/brokers.py). Every
event's key, value, headers and partition (4 per topic: the Java client's murmur2
against the relay's) must be equal; the result (``results.json``:
``message_check``) says how many were and shows the first difference.

Must not: measure anything (nothing here is timed).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.brokers import new_broker
from benchmarks.kafka_side import collect, create_topics
from benchmarks.procs import RelayProcess
from benchmarks.procs import run_cli as run_relay_cli
from benchmarks.workload import TABLE, rows
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import insert_statement

SAMPLE = 20
TOPIC = "bench.check"
_SLOT = "bench_debezium"
# (aggregate id, payload JSON text): what a serializer could get wrong
_TRICKY = [("agg-ü", '{"note": "quote \\" backslash \\\\ tab \\t newline \\n", "euro": "€"}'),
           ("agg \"q\"", '{"nested": {"list": [1, 2.50, true, null]}, "empty": ""}')]

Found = dict[bytes, tuple[Any, ...]]  # id header → (key, value, headers, partition)


def _events() -> list[tuple[Any, ...]]:
    sample = rows(0, SAMPLE - len(_TRICKY), "check")
    return sample + [(uuid.uuid4(), "check", key, "OrderPlaced", text) for key, text in _TRICKY]


def compare(relay: Found, debezium: Found) -> dict[str, Any]:
    """How many events are equal in both, and the first difference (None if none)."""
    equal, first = 0, None
    for event_id, mine in sorted(relay.items()):
        theirs = debezium.get(event_id)
        if theirs == mine:
            equal += 1
        elif first is None:
            first = f"event {event_id.decode()}: cdc-relay {mine!r}, Debezium {theirs!r}"
    return {"sample": len(relay), "equal": equal, "first_difference": first}


def _relayed(args: list[str], log: Path, module: str, expected: int, broker_kind: str) -> Found:
    """Run one relay on a fresh broker until ``expected`` events are in; what arrived."""
    with new_broker(broker_kind) as broker:
        create_topics(broker.bootstrap, [TOPIC])
        proc = RelayProcess([*args, "--brokers", broker.bootstrap,
                             "--topic-pattern", "bench.{aggregate_type}"], log, module=module)
        try:
            return collect(broker.bootstrap, TOPIC, expected, check=proc.check_alive)
        finally:
            proc.stop()


def run(cluster: PostgresCluster, workdir: Path, broker_kind: str) -> dict[str, Any]:
    """The check's result for results.json (``error`` instead when it could not run)."""
    name = "bench_message_check"
    dsn = cluster.create_database(name)
    try:
        run_relay_cli(["init", "--dsn", dsn, "--plugin", "pgoutput", "--no-trigger"],
                      workdir / "message-check-init.log")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (_SLOT,))
            with conn.transaction():
                conn.cursor().executemany(insert_statement(TABLE), _events())
        relay = _relayed(["run", "--dsn", dsn, "--plugin", "pgoutput", "--log-level", "warning"],
                         workdir / "message-check-relay.log", "cdc_relay", SAMPLE, broker_kind)
        debezium = _relayed(["--dsn", dsn, "--slot", _SLOT], workdir / "message-check-debezium.log",
                            "benchmarks.debezium", SAMPLE, broker_kind)
        return compare(relay, debezium)
    except (RuntimeError, psycopg.Error) as exc:
        print(f"message check failed: {exc}", file=sys.stderr)
        return {"error": str(exc)[:500]}
    finally:
        cluster.drop_database(name)
