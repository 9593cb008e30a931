"""Shared pieces of the WAL-mode integration tests: workloads, relay processes, checks."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import orjson
import psycopg

from cdc_relay.outbox import emit
from tests.support import CliProcess, KafkaCollector, Msg, init_outbox, wait_for

AGGREGATE_TYPES = ("order", "customer", "invoice")


@dataclass
class Expected:
    """What a workload committed (in commit order) and what it rolled back."""

    events: list[dict[str, object]] = field(default_factory=list)
    rolled_back: set[str] = field(default_factory=set)
    # commit position (pg_current_wal_insert_lsn right after COMMIT) of each event id
    commit_lsn: dict[str, int] = field(default_factory=dict)

    @property
    def ids(self) -> set[str]:
        return {str(e["id"]) for e in self.events}


def init_db(dsn: str, slot: str = "cdc_relay", plugin: str = "wal2json") -> None:
    init_outbox(dsn, "--slot", slot, "--plugin", plugin)


def start_relay(dsn: str, bootstrap: str, prefix: str, *, slot: str = "cdc_relay",
                plugin: str = "wal2json", extra: tuple[str, ...] = (),
                wait: bool = True) -> CliProcess:
    """Start ``cdc-relay run``; with ``wait``, return once it is streaming."""
    relay = CliProcess([
        "run", "--dsn", dsn, "--brokers", bootstrap, "--slot", slot, "--plugin", plugin,
        "--topic-pattern", prefix + ".{aggregate_type}", "--dead-letter-topic", prefix + ".dlq",
        "--status-interval", "200ms", "--message-timeout", "10s", *extra,
    ])
    if wait:
        try:
            wait_for(lambda: "streaming from slot" in relay.stderr or not relay.running(),
                     timeout=60, message="the relay streaming")
        except BaseException:
            relay.kill()
            raise
        assert relay.running(), relay.stderr
    return relay


def lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def write_workload(dsn: str, *, transactions: int, seed: int, expected: Expected | None = None,
                   rollback_every: int = 7, max_events: int = 50) -> Expected:
    """Transactions of 1..max_events events over several aggregates; some roll back,
    some also write an ``orders`` table."""
    rng = random.Random(seed)
    expected = expected or Expected()
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, note text)")
        conn.commit()
        for t in range(transactions):
            batch = []
            for _ in range(rng.randint(1, max_events)):
                agg_type = rng.choice(AGGREGATE_TYPES)
                agg_id = f"{agg_type}-{rng.randint(1, 8)}"
                payload = {"seed": seed, "txn": t, "n": rng.random(), "note": "grüße ✓ 注文",
                           "nested": {"list": [1, 2.5, None, True], "s": 'quote " \\ end'}}
                event_id = emit(conn, agg_type, agg_id, f"{agg_type.capitalize()}Changed", payload)
                batch.append({"id": str(event_id), "aggregate_type": agg_type,
                              "aggregate_id": agg_id, "payload": payload})
            if t % 3 == 0:
                conn.execute("INSERT INTO orders (note) VALUES (%s)", (f"txn {t}",))
            if rollback_every and t % rollback_every == rollback_every - 1:
                conn.rollback()
                expected.rolled_back.update(str(e["id"]) for e in batch)
            else:
                conn.commit()
                row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
                assert row is not None
                for e in batch:
                    expected.commit_lsn[str(e["id"])] = lsn_int(row[0])
                conn.commit()
                expected.events.extend(batch)
    return expected


def confirmed_flush(dsn: str, slot: str = "cdc_relay") -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
                           " WHERE slot_name = %s", (slot,)).fetchone()
    assert row is not None and row[0] is not None
    return lsn_int(row[0])


def current_wal(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return lsn_int(row[0])


def collect_ids(collector: KafkaCollector, prefix: str, ids: set[str], timeout: float = 60.0) -> list[Msg]:
    """Read until every id in ``ids`` has arrived (on the event topics); return all messages."""

    def arrived(messages: list[Msg]) -> bool:
        seen = {m.headers.get("id", b"").decode() for m in messages}
        return ids <= seen

    return collector.collect(until=arrived, timeout=timeout)


def assert_contract(messages: list[Msg], expected: Expected, prefix: str) -> None:
    """Every committed event arrived with the message contract (docs/design.md); no rolled-back one did;
    per-aggregate order holds (first deliveries, in commit order)."""
    by_id = {str(e["id"]): e for e in expected.events}
    received = [m for m in messages if not m.topic.endswith(".dlq")]
    seen_ids = [m.headers["id"].decode() for m in received]
    assert set(seen_ids) >= expected.ids
    assert not (set(seen_ids) & expected.rolled_back), "a rolled-back event reached Kafka"
    for m in received:
        event = by_id[m.headers["id"].decode()]
        assert m.topic == f"{prefix}.{event['aggregate_type']}"
        assert m.key == str(event["aggregate_id"]).encode()
        assert m.value is not None and orjson.loads(m.value) == event["payload"]
        assert m.headers["event_type"] == f"{str(event['aggregate_type']).capitalize()}Changed".encode()
        assert m.headers["aggregate_type"] == str(event["aggregate_type"]).encode()
        assert m.timestamp > 0
    # Per aggregate: the order of first arrival within a partition follows commit order.
    position = {str(e["id"]): i for i, e in enumerate(expected.events)}
    first_seen: dict[tuple[str, int], list[str]] = defaultdict(list)
    seen: set[str] = set()
    for m in sorted(received, key=lambda m: (m.topic, m.partition, m.offset)):
        event_id = m.headers["id"].decode()
        if event_id not in seen:
            seen.add(event_id)
            first_seen[(m.topic, m.partition)].append(event_id)
    for ids in first_seen.values():
        per_aggregate: dict[str, list[int]] = defaultdict(list)
        for event_id in ids:
            per_aggregate[str(by_id[event_id]["aggregate_id"])].append(position[event_id])
        for aggregate, positions in per_aggregate.items():
            assert positions == sorted(positions), f"aggregate {aggregate} out of order"


def assert_a_fresh_relay_delivers(dsn: str, bootstrap: str, prefix: str,
                                  expected: Expected) -> None:
    """Nothing unacked was confirmed: a new relay on the slot delivers every expected event."""
    with start_relay(dsn, bootstrap, prefix) as again, KafkaCollector(bootstrap, prefix) as collector:
        messages = collect_ids(collector, prefix, expected.ids)
        assert again.stop() == 0
    assert_contract(messages, expected, prefix)


def new_id() -> str:
    return str(uuid.uuid4())
