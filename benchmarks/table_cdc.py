"""The table-CDC workload: a captured table's mixed backlog and the consumer that counts it.

The ``capture-pgoutput`` and ``debezium-capture`` modes (benchmarks/plan.py) stream one
ordinary table as Debezium change events instead of outbox rows: ``public.bench_items``
(a bigint primary key and a few typical columns: text, numeric, timestamptz, jsonb;
``REPLICA IDENTITY DEFAULT``) to the topic ``bench.public.bench_items``.

A backlog of N *changes* is written in transactions of 100, in blocks of 20: 10 INSERTs
of new rows, 7 UPDATEs of live rows (chosen by a seeded random generator), 3 DELETEs of
the oldest live rows - 50 % inserts, 35 % updates, 15 % deletes (``changes``, pure).

Counted at the consumer: **events**, one per change - distinct non-null message values
(every event's value carries its own ``source.lsn``); the tombstone (key, null value)
that follows each delete in both modes is a message but not an event, and is counted
apart (``tombstones``).

Owns: the table's DDL, the change sequence, the preload, the counting consumer.
Must not: start the relay, Debezium or a broker, or measure (runner.py does).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import orjson
import psycopg

from benchmarks.workload import Backlog

TABLE = "public.bench_items"
PREFIX = "bench"  # --capture-prefix / Debezium's topic.prefix
TOPIC = f"{PREFIX}.{TABLE}"
BLOCK = "i" * 10 + "u" * 7 + "d" * 3  # 50 % inserts, 35 % updates, 15 % deletes
DDL = f"""CREATE TABLE {TABLE} (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    amount numeric(12, 2) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    attrs jsonb NOT NULL
)"""
_INSERT = f"INSERT INTO {TABLE} (id, name, amount, attrs) VALUES (%s, %s, %s, %s)"
_UPDATE = f"UPDATE {TABLE} SET amount = %s, updated_at = now(), attrs = %s WHERE id = %s"
_DELETE = f"DELETE FROM {TABLE} WHERE id = %s"

Change = tuple[str, int]  # ("i" | "u" | "d", row id)


def changes(count: int, seed: int = 43) -> list[Change]:
    """The first ``count`` changes of the workload: an update hits a live row, a delete the
    oldest live row, never one already deleted."""
    rng = random.Random(seed)
    live: list[int] = []  # ids in insert order; live[head:] are not deleted
    head = 0
    out: list[Change] = []
    while len(out) < count:
        for op in BLOCK[:count - len(out)]:
            if op == "i":
                live.append(len(live) + 1)
                out.append(("i", live[-1]))
            elif op == "u":
                out.append(("u", live[rng.randrange(head, len(live))]))
            else:
                out.append(("d", live[head]))
                head += 1
    return out


def mix(ops: list[Change]) -> dict[str, float]:
    """The share of each operation (``{"i": 0.5, …}``)."""
    return {op: sum(1 for o, _ in ops if o == op) / len(ops) for op in "iud"} if ops else {}


def _attrs(n: int, version: int) -> str:
    return orjson.dumps({"sku": f"sku-{n % 313:05d}", "tags": ["bench", f"t{n % 7}"],
                         "version": version}).decode()


def _runs(ops: list[Change]) -> Iterator[tuple[str, list[int]]]:
    """Consecutive changes of one kind: (op, ids), in order."""
    current: tuple[str, list[int]] | None = None
    for op, row in ops:
        if current is None or current[0] != op:
            if current is not None:
                yield current
            current = (op, [])
        current[1].append(row)
    if current is not None:
        yield current


def statements(ops: list[Change]) -> Iterator[tuple[str, list[tuple[object, ...]]]]:
    """(SQL, parameter rows) for ``ops``, one ``executemany`` per run of one kind."""
    for op, ids in _runs(ops):
        if op == "i":
            yield _INSERT, [(i, f"item-{i:08d}", Decimal(i % 99_991) / 100, _attrs(i, 0)) for i in ids]
        elif op == "u":
            yield _UPDATE, [(Decimal(i % 9_973) / 10, _attrs(i, 1), i) for i in ids]
        else:
            yield _DELETE, [(i,) for i in ids]


def create_table(dsn: str) -> None:
    """The captured table, before ``cdc-relay init --capture`` adds it to the publication."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)


def preload(dsn: str, count: int, per_txn: int,
            progress: Callable[[int], None] | None = None) -> Backlog:
    """Write ``count`` changes in transactions of ``per_txn``; where the last commit ended."""
    ops = changes(count)
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor()
        for first in range(0, count, per_txn):
            for query, params in statements(ops[first:first + per_txn]):
                cur.executemany(query, params)
            conn.commit()
            if progress is not None:
                progress(min(count, first + per_txn))
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        conn.commit()
    assert row is not None
    return Backlog([], str(row[0]))


def count_changes_process(bootstrap: str, topic: str, expected: int, received: Synchronized[int],
                          first_at: Synchronized[float], done_at: Synchronized[float],
                          ready: Event, stop: Event, tombstones: Synchronized[int]) -> None:
    """Child: count distinct change events on ``topic`` (non-null values) and, apart, the
    tombstones; stamp the first event and the ``expected``-th, as kafka_side.count_process."""
    from benchmarks.kafka_side import _consumer  # the harness's assigned consumer

    consumer, first = _consumer(bootstrap, topic)
    seen: set[bytes] = set()
    ready.set()
    try:
        while not stop.is_set():
            batch, first = first or consumer.consume(num_messages=10_000, timeout=0.01), []
            if not batch:
                continue
            now = time.time()
            values = [m.value() for m in batch if m.error() is None]
            nulls = sum(1 for v in values if v is None)
            if nulls:
                tombstones.value += nulls
            if not seen and len(values) > nulls:
                first_at.value = now
            seen.update(v for v in values if v is not None)
            received.value = len(seen)
            if len(seen) >= expected and not done_at.value:
                done_at.value = now
    finally:
        consumer.close()
