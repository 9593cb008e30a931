"""Fault injection with a captured table (run --capture): kill -9 mid-stream, a broker
that crashes and comes back. Every committed change of the table arrives at least once,
first arrivals in commit order per key, no rolled-back change arrives; the outbox beside
it keeps its contract (tests/integration/wal_support.py)."""

from __future__ import annotations

import json
import random
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.broker import Broker
from cdc_relay.outbox import emit
from tests.integration.wal_support import (
    Expected,
    assert_contract,
    lsn_int,
    start_relay,
)
from tests.support import CliProcess, KafkaCollector, Msg, init_outbox

pytestmark = pytest.mark.faults

ROLLED_BACK = "rolled back"


@dataclass
class Committed:
    """The captured table's committed history: each key's ``seq`` values in commit order."""

    seqs: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))


def write(dsn: str, *, transactions: int, seed: int, outbox: Expected, items: Committed) -> None:
    """Transactions that upsert 1-5 keys of ``items`` (``seq`` counts each key's changes)
    and emit 1-3 outbox events; every 7th rolls back (its rows say so)."""
    rng = random.Random(seed)
    with psycopg.connect(dsn) as conn:
        for t in range(transactions):
            rollback = t % 7 == 6
            note = ROLLED_BACK if rollback else f"seed {seed} txn {t}"
            changed: list[tuple[int, int]] = []
            for key in rng.sample(range(1, 21), rng.randint(1, 5)):
                row = conn.execute(
                    "INSERT INTO items VALUES (%s, 0, %s) ON CONFLICT (id) DO UPDATE"
                    " SET seq = items.seq + 1, note = excluded.note RETURNING seq",
                    (key, note)).fetchone()
                assert row is not None
                changed.append((key, row[0]))
            batch: list[dict[str, Any]] = [{"id": str(emit(conn, "item", str(k), "ItemChanged", {"seq": s})),
                      "aggregate_type": "item", "aggregate_id": str(k), "payload": {"seq": s}}
                     for k, s in changed[: rng.randint(1, 3)]]
            if rollback:
                conn.rollback()
                outbox.rolled_back.update(e["id"] for e in batch)
                continue
            conn.commit()
            lsn = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert lsn is not None
            conn.commit()
            outbox.events.extend(batch)
            outbox.commit_lsn.update({e["id"]: lsn_int(lsn[0]) for e in batch})
            for key, seq in changed:
                items.seqs[key].append(seq)


def _setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, seq int NOT NULL, note text)")
    # in the publication before the first write: changes made before are not published
    init_outbox(dsn, "--slot", "cdc_relay", "--plugin", "pgoutput", "--capture", "public.items")


def _relay(dsn: str, bootstrap: str, prefix: str, *extra: str, wait: bool = True) -> CliProcess:
    return start_relay(dsn, bootstrap, prefix, plugin="pgoutput", wait=wait,
                       extra=("--capture", "public.items", "--capture-prefix", prefix, *extra))


def _captured(messages: list[Msg], prefix: str) -> list[Msg]:
    return sorted((m for m in messages if m.topic == f"{prefix}.public.items"),
                  key=lambda m: (m.partition, m.offset))


def _first_arrivals(messages: list[Msg], prefix: str) -> dict[int, list[int]]:
    """Each key's ``seq`` values in order of first arrival (one key is one partition)."""
    seen: dict[int, list[int]] = defaultdict(list)
    for m in _captured(messages, prefix):
        assert m.value is not None  # no deletes in this workload
        after = json.loads(m.value)["after"]
        if after["seq"] not in seen[after["id"]]:
            seen[after["id"]].append(after["seq"])
    return seen


def _all_arrived(prefix: str, outbox: Expected,
                 items: Committed) -> Callable[[list[Msg]], bool]:
    def arrived(messages: list[Msg]) -> bool:
        ids = {m.headers.get("id", b"").decode() for m in messages}
        first = _first_arrivals(messages, prefix)
        return outbox.ids <= ids and all(
            seqs[-1] in first.get(key, []) for key, seqs in items.seqs.items())
    return arrived


def _more_than(count: int, prefix: str) -> Callable[[list[Msg]], bool]:
    return lambda messages: len(_captured(messages, prefix)) > count


def _assert_nothing_lost(messages: list[Msg], prefix: str, outbox: Expected,
                         items: Committed) -> None:
    captured = _captured(messages, prefix)
    assert not [m for m in captured if m.value and json.loads(m.value)["after"]["note"]
                == ROLLED_BACK], "a rolled-back change reached Kafka"
    assert _first_arrivals(messages, prefix) == dict(items.seqs)
    for m in captured:
        assert m.value is not None
        event = json.loads(m.value)
        assert event["op"] == ("c" if event["after"]["seq"] == 0 else "u")
        assert m.key == json.dumps({"id": event["after"]["id"]}, separators=(",", ":")).encode()
    assert_contract([m for m in messages if "id" in m.headers], outbox, prefix)


def test_a_captured_table_survives_repeated_kill_9_under_continuous_writes(
        db: str, broker: Broker, topic_prefix: str) -> None:
    _setup(db)
    outbox, items = Expected(), Committed()
    done = threading.Event()

    def writer() -> None:
        seed = 300
        while not done.is_set():
            write(db, transactions=5, seed=seed, outbox=outbox, items=items)
            seed += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            for _ in range(5):
                relay = _relay(db, broker.bootstrap, topic_prefix)
                # mid-stream: killed once it has delivered more of the table than before
                collector.collect(until=_more_than(len(_captured(collector.messages,
                                                                 topic_prefix)) + 20, topic_prefix),
                                  timeout=60)
                assert relay.kill() == -9
            done.set()
            thread.join()
            with _relay(db, broker.bootstrap, topic_prefix) as last:
                messages = collector.collect(until=_all_arrived(topic_prefix, outbox, items),
                                             timeout=120)
                assert last.stop() == 0, last.stderr
    finally:
        done.set()
        thread.join()
    assert sum(len(s) for s in items.seqs.values()) > 100
    _assert_nothing_lost(messages, topic_prefix, outbox, items)


def test_a_captured_table_survives_a_broker_killed_and_started_again(
        db: str, private_broker: ApacheKafka, topic_prefix: str) -> None:
    _setup(db)
    outbox, items = Expected(), Committed()
    bootstrap = private_broker.bootstrap
    with _relay(db, bootstrap, topic_prefix, "--message-timeout", "5s") as relay:
        write(db, transactions=10, seed=41, outbox=outbox, items=items)
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            collector.collect(until=_all_arrived(topic_prefix, outbox, items), timeout=60)
        private_broker.kill()
        write(db, transactions=20, seed=42, outbox=outbox, items=items)  # while it is down
        private_broker.start()
        write(db, transactions=10, seed=43, outbox=outbox, items=items)
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            messages = collector.collect(until=_all_arrived(topic_prefix, outbox, items),
                                         timeout=120)
        assert relay.running(), relay.stderr
        assert relay.stop() == 0
    _assert_nothing_lost(messages, topic_prefix, outbox, items)


def test_a_table_snapshot_killed_mid_way_is_redone_and_the_stream_follows(
        db: str, broker: Broker, topic_prefix: str) -> None:
    """kill -9 during ``--snapshot initial``: the next start redoes the snapshot (a fresh
    one) and then streams; every row arrives as an ``r`` at least once, every change made
    meanwhile arrives, and each key's last arrival is the row as it is."""
    rows = 40_000
    init_outbox(db, "--no-slot")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, seq int NOT NULL, note text)")
        conn.execute("INSERT INTO items SELECT g, 0, 'initial' FROM generate_series(1, %s) g",
                     (rows,))
    extra = ("--snapshot", "initial", "--max-inflight", "100")
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        relay = _relay(db, broker.bootstrap, topic_prefix, *extra, wait=False)
        collector.collect(until=_more_than(500, topic_prefix), timeout=60)
        assert relay.kill() == -9
        with psycopg.connect(db, autocommit=True) as conn:
            state = conn.execute("SELECT state FROM public.cdc_relay_backfill").fetchone()
            assert state == ("running",), "the snapshot finished before the kill"
            conn.execute("UPDATE items SET seq = 1, note = 'changed' WHERE id % 100 = 0")
        with _relay(db, broker.bootstrap, topic_prefix, *extra, wait=False) as again:
            def done(messages: list[Msg]) -> bool:
                last = _last_arrivals(messages, topic_prefix)
                return len(last) == rows and all(last[k]["seq"] == 1
                                                 for k in range(100, rows + 1, 100))
            messages = collector.collect(until=done, timeout=180)
            assert again.stop() == 0, again.stderr
    reads = {json.loads(m.value)["after"]["id"] for m in _captured(messages, topic_prefix)
             if m.value and json.loads(m.value)["op"] == "r"}
    assert reads == set(range(1, rows + 1))
    last = _last_arrivals(messages, topic_prefix)
    assert all(v["note"] == ("changed" if k % 100 == 0 else "initial") for k, v in last.items())


def _last_arrivals(messages: list[Msg], prefix: str) -> dict[int, dict[str, Any]]:
    last: dict[int, dict[str, Any]] = {}
    for m in _captured(messages, prefix):
        assert m.value is not None
        after = json.loads(m.value)["after"]
        last[after["id"]] = after
    return last
