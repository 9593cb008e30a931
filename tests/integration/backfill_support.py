"""Shared pieces of the backfill and migration tests: pending rows, writers, checks."""

from __future__ import annotations

import threading
from collections import defaultdict

import orjson
import psycopg

from tests.support import CliProcess, Msg, init_outbox, wait_for

AGGREGATES = 20


def init_no_slot(dsn: str, *extra: str) -> None:
    init_outbox(dsn, "--no-slot", *extra)


def insert_rows(dsn: str, start: int, count: int, *, per_txn: int = 1000,
                table: str = "outbox_events", cols: tuple[str, ...] = (
                    "aggregate_type", "aggregate_id", "event_type", "payload")) -> list[str]:
    """``count`` rows with payload {"seq": n}, n from ``start``, in transactions of ``per_txn``."""
    ids: list[str] = []
    insert = (f"INSERT INTO {table} ({', '.join(cols)}) SELECT 'order', 'o-' || (g %% {AGGREGATES}),"
              " 'Placed', jsonb_build_object('seq', g) FROM generate_series(%s::int, %s::int) AS g"
              " ORDER BY g RETURNING id::text")
    with psycopg.connect(dsn) as conn:
        for first in range(start, start + count, per_txn):
            last = min(first + per_txn, start + count) - 1
            ids += [row[0] for row in conn.execute(insert, (first, last))]
            conn.commit()
    return ids


class SteadyWriter(threading.Thread):
    """Commits a few rows at a time, at a steady pace, until ``stop``; records the ids."""

    def __init__(self, dsn: str, start: int, *, per_txn: int = 5, pause: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.dsn, self.next_seq, self.per_txn, self.pause = dsn, start, per_txn, pause
        self.ids: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.ids += insert_rows(self.dsn, self.next_seq, self.per_txn, per_txn=self.per_txn)
            self.next_seq += self.per_txn
            self.halt.wait(self.pause)  # pacing, not synchronisation

    def finish(self) -> list[str]:
        self.halt.set()
        self.join(30)
        return self.ids


def start_backfilling_relay(dsn: str, bootstrap: str, prefix: str, *, plugin: str = "wal2json",
                            slot: str = "cdc_relay", extra: tuple[str, ...] = ()) -> CliProcess:
    return CliProcess([
        "run", "--dsn", dsn, "--brokers", bootstrap, "--slot", slot, "--plugin", plugin,
        "--snapshot", "initial", "--topic-pattern", prefix + ".{aggregate_type}",
        "--dead-letter-topic", prefix + ".dlq", "--status-interval", "200ms",
        "--message-timeout", "10s", *extra])


def wait_streaming(relay: CliProcess, timeout: float = 90) -> None:
    wait_for(lambda: "streaming from slot" in relay.stderr or not relay.running(),
             timeout=timeout, message="the relay streaming")
    assert relay.running(), relay.stderr


def ids_of(messages: list[Msg]) -> list[str]:
    return [m.headers["id"].decode() for m in messages]


def assert_aggregate_order(messages: list[Msg]) -> None:
    """Per partition, each aggregate's first deliveries carry increasing ``seq`` values."""
    seen: set[str] = set()
    last: dict[tuple[str, int, bytes | None], int] = defaultdict(lambda: -1)
    for m in sorted(messages, key=lambda m: (m.topic, m.partition, m.offset)):
        event_id = m.headers["id"].decode()
        if event_id in seen:
            continue
        seen.add(event_id)
        assert m.value is not None
        seq = int(orjson.loads(m.value)["seq"])
        key = (m.topic, m.partition, m.key)
        assert seq > last[key], f"aggregate {m.key!r} out of order: {seq} after {last[key]}"
        last[key] = seq


def assert_messages_match_rows(dsn: str, messages: list[Msg], prefix: str,
                               table: str = "outbox_events", agg_id: str = "aggregate_id",
                               event_type: str = "event_type") -> None:
    """Every message is exactly what the contract makes of its row (key, value, headers, time)."""
    with psycopg.connect(dsn) as conn:
        rows = {r[0]: r[1:] for r in conn.execute(
            f"SELECT id::text, {agg_id}, payload::text, {event_type},"
            f" floor(extract(epoch FROM created_at) * 1000)::bigint FROM {table}")}
    for m in messages:
        aggregate_id, payload, etype, created_ms = rows[m.headers["id"].decode()]
        assert m.topic == f"{prefix}.order"
        assert m.key == aggregate_id.encode()
        assert m.value == payload.encode()
        assert m.headers["event_type"] == etype.encode()
        assert m.headers["aggregate_type"] == b"order"
        assert m.timestamp == created_ms


def count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def backfill_state(dsn: str, slot: str = "cdc_relay") -> str | None:
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass('public.cdc_relay_backfill')").fetchone() == (None,):
            return None
        row = conn.execute("SELECT state FROM cdc_relay_backfill WHERE slot_name = %s",
                           (slot,)).fetchone()
    return None if row is None else str(row[0])
