"""The events the benchmark writes: a preloaded backlog and a fixed-rate stream.

Every event is an outbox row of the relay's default table written with the same
INSERT ``cdc_relay.outbox.emit`` uses (``insert_statement``), with a ~200-byte JSON
payload, ``aggregate_type`` naming the topic and 1,000 rotating aggregate ids (keys
spread over the partitions).

``rate_writer`` runs in a child process (spawned), so the consumer that timestamps
receipts never waits for this process's GIL. It records ``time.time()`` right after
each COMMIT returns, per event id: latency is measured from the moment the event
became visible to the relay, on the same clock the consumer reads.

Must not: read from Kafka or start the relay.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import orjson
import psycopg

from cdc_relay.outbox import insert_statement

TABLE = "public.outbox_events"
AGGREGATES = 1_000
_NOTE = "benchmark payload padding to about two hundred bytes"

Row = tuple[uuid.UUID, str, str, str, str]


# The payload's Avro schema, for the wal-pgoutput-avro mode (--value-schema OrderPlaced=…).
ORDER_PLACED_AVRO = {
    "type": "record", "name": "OrderPlaced", "namespace": "bench", "fields": [
        {"name": "orderId", "type": "string"}, {"name": "customerId", "type": "string"},
        {"name": "amount", "type": "double"}, {"name": "currency", "type": "string"},
        {"name": "items", "type": {"type": "array", "items": {
            "type": "record", "name": "Item", "fields": [
                {"name": "sku", "type": "string"}, {"name": "qty", "type": "long"},
                {"name": "price", "type": "double"}]}}},
        {"name": "note", "type": "string"}]}


def payload(n: int) -> str:
    """A ~200-byte order-like JSON document for event number ``n``."""
    return orjson.dumps({
        "orderId": f"o-{n:08d}", "customerId": f"c-{n % 9973:05d}", "amount": round(n % 997 * 1.37, 2),
        "currency": "EUR", "items": [{"sku": f"sku-{n % 313:05d}", "qty": 1 + n % 3, "price": 12.5}],
        "note": _NOTE,
    }).decode()


def rows(first: int, count: int, aggregate_type: str, event_type: str = "OrderPlaced") -> list[Row]:
    """``count`` outbox rows, numbered from ``first``, with fresh ids."""
    return [(uuid.uuid4(), aggregate_type, f"agg-{n % AGGREGATES}", event_type, payload(n))
            for n in range(first, first + count)]


@dataclass(frozen=True)
class Backlog:
    """What ``preload`` wrote: the last transaction's ids and where its commit ended."""

    last_ids: list[str]
    end_lsn: str  # pg_current_wal_insert_lsn() right after the last COMMIT


def preload(dsn: str, events: int, per_txn: int, aggregate_type: str,
            progress: Callable[[int], None] | None = None) -> Backlog:
    """Insert ``events`` rows in transactions of ``per_txn``."""
    query = insert_statement(TABLE)
    last: list[Row] = []
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor()
        for first in range(0, events, per_txn):
            last = rows(first, min(per_txn, events - first), aggregate_type)
            cur.executemany(query, last)
            conn.commit()
            if progress is not None:
                progress(first + len(last))
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        conn.commit()
    assert row is not None
    return Backlog([str(r[0]) for r in last], str(row[0]))


def rate_writer(dsn: str, aggregate_type: str, rate: int, per_txn: int, duration: float,
                warmup: float, out_path: str, written: Synchronized[int]) -> None:
    """Child process: write ``rate`` events/s for ``warmup + duration`` s; pickle commit times.

    Transactions of ``per_txn`` events start on a fixed schedule; a writer that fell
    behind writes back to back until it is on time again and reports how far behind it
    was (``behind_max_s``). Events of the warm-up are written but not recorded.
    """
    query = insert_statement(TABLE)
    interval = per_txn / rate
    commits: dict[str, float] = {}
    behind_max = 0.0
    n = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        start = time.monotonic()
        wall_start = time.time()
        while True:
            due = n * interval
            if due >= warmup + duration:
                break
            now = time.monotonic() - start
            if due > now:
                time.sleep(due - now)
            else:
                behind_max = max(behind_max, now - due)
            batch = rows(n * per_txn, per_txn, aggregate_type)
            if per_txn == 1:
                cur.execute(query, batch[0])  # autocommit: the statement is the transaction
            else:
                with conn.transaction():
                    cur.executemany(query, batch)
            committed = time.time()
            if due >= warmup:
                for row in batch:
                    commits[str(row[0])] = committed
            with written.get_lock():
                written.value += per_txn
            n += 1
        elapsed = time.time() - wall_start
    result: dict[str, Any] = {"commits": commits, "behind_max_s": behind_max,
                              "achieved_eps": n * per_txn / elapsed if elapsed else 0.0}
    Path(out_path).write_bytes(pickle.dumps(result))
