"""``run --capture --exactly-once`` on Apache Kafka: a captured table's change events (and
their tombstones) go into the Kafka transaction of their PostgreSQL transaction, beside
its outbox events. Relays killed with ``kill -9`` at chosen points under writes; a
``read_committed`` consumer then sees every committed change exactly once and nothing of
a rolled-back transaction (docs/exactly-once.md)."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.helpers import free_port
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.eos_support import READ_COMMITTED, checkpoints, start_eos_relay
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.test_exactly_once_faults import (
    caught_up_reader,
    kill_at,
    read_when_settled,
    repeatedly,
)
from tests.integration.wal_support import Expected, current_wal
from tests.support import CliProcess, KafkaCollector, Msg, init_outbox, scrape, wait_for


@dataclass
class Changes:
    """The captured table's changes by the ``change`` value of the row version each wrote
    (``w``: an insert, an update, the new key of a key change) or deleted (``d``: a delete,
    the old key of a key change)."""

    committed: set[tuple[str, int]] = field(default_factory=set)
    rolled_back: set[tuple[str, int]] = field(default_factory=set)


def _one(conn: psycopg.Connection[Any], sql: str, params: tuple[object, ...]) -> tuple[Any, ...] | None:
    return conn.execute(sql, params).fetchone()


def _transaction(conn: psycopg.Connection[Any], rng: random.Random, note: str) -> list[tuple[str, int]]:
    """Upserts of 1-4 keys, maybe a delete, maybe a primary-key change: what they did."""
    done: list[tuple[str, int]] = []
    for key in rng.sample(range(1, 31), rng.randint(1, 4)):
        row = _one(conn, "INSERT INTO items VALUES (%s, nextval('item_changes'), %s) ON CONFLICT"
                   " (id) DO UPDATE SET change = excluded.change, note = excluded.note"
                   " RETURNING change", (key, note))
        assert row is not None
        done.append(("w", row[0]))
    if rng.random() < 0.3:
        row = _one(conn, "DELETE FROM items WHERE id = %s RETURNING change", (rng.randint(1, 30),))
        if row is not None:
            done.append(("d", row[0]))
    if rng.random() < 0.2:  # d (old key), tombstone, c (new key)
        key = rng.randint(1, 30)
        old = _one(conn, "SELECT change FROM items WHERE id = %s FOR UPDATE", (key,))
        if old is not None:
            new = _one(conn, "UPDATE items SET id = 1000 + nextval('item_changes'), change ="
                       " nextval('item_changes') WHERE id = %s RETURNING change", (key,))
            assert new is not None
            done += [("d", old[0]), ("w", new[0])]
    return done


def write(dsn: str, *, transactions: int, seed: int, outbox: Expected, changes: Changes) -> None:
    """``transactions`` transactions of table changes and 1-2 outbox events; every 4th
    rolls back."""
    rng = random.Random(seed)
    with psycopg.connect(dsn) as conn:
        for t in range(transactions):
            done = _transaction(conn, rng, f"seed {seed} txn {t}")
            events = [str(emit(conn, "item", str(seed), "ItemsChanged", {"t": t}))
                      for _ in range(rng.randint(1, 2))]
            if t % 4 == 3:
                conn.rollback()
                outbox.rolled_back.update(events)
                changes.rolled_back.update(done)
                continue
            conn.commit()
            outbox.events.extend({"id": e} for e in events)
            changes.committed.update(done)


def _relay(dsn: str, bootstrap: str, prefix: str, *extra: str) -> CliProcess:
    return start_eos_relay(dsn, bootstrap, prefix, plugin="pgoutput", extra=(
        "--capture", "public.items", "--capture-prefix", prefix, *extra))


def _identities(messages: list[Msg], prefix: str) -> tuple[Counter[tuple[str, int]], int]:
    """Each captured event's identity (see Changes), counted; checks that every ``d`` is
    followed by its tombstone in its partition. Returns the count of tombstones too."""
    found: Counter[tuple[str, int]] = Counter()
    tombstones = 0
    captured = sorted((m for m in messages if m.topic == f"{prefix}.public.items"),
                      key=lambda m: (m.partition, m.offset))
    for i, m in enumerate(captured):
        if m.value is None:
            tombstones += 1
            continue
        identity = _identity(m.value)
        found[identity] += 1
        if identity[0] == "d":
            follower = captured[i + 1] if i + 1 < len(captured) else None
            assert follower is not None and follower.value is None and follower.key == m.key, \
                "a delete without its tombstone right after it"
    return found, tombstones


def _outbox_ids(messages: list[Msg]) -> Counter[str]:
    return Counter(m.headers["id"].decode() for m in messages
                   if "id" in m.headers and not m.topic.endswith((".dlq", ".checkpoints")))


def _assert_exactly_once(messages: list[Msg], prefix: str, outbox: Expected,
                         changes: Changes) -> None:
    found, tombstones = _identities(messages, prefix)
    assert not {k: n for k, n in found.items() if n > 1}, "a change arrived more than once"
    # a delete rolled back may be done again, committed: that one is expected
    assert not set(found) & (changes.rolled_back - changes.committed), \
        "a rolled-back change reached Kafka"
    assert set(found) == changes.committed
    assert tombstones == sum(1 for kind, _ in found if kind == "d")
    ids = _outbox_ids(messages)
    assert max(ids.values()) == 1 and set(ids) == outbox.ids
    assert not set(ids) & outbox.rolled_back


def _arrived(prefix: str, outbox: Expected, changes: Changes) -> Any:
    def arrived(messages: list[Msg]) -> bool:
        found = {_identity(m.value) for m in messages
                 if m.topic == f"{prefix}.public.items" and m.value is not None}
        return changes.committed <= found and outbox.ids <= set(_outbox_ids(messages))
    return arrived


def _identity(value: bytes) -> tuple[str, int]:
    """A change event's identity (see Changes)."""
    event = json.loads(value)
    return ("d", event["before"]["change"]) if event["op"] == "d" else ("w", event["after"]["change"])


def _setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, change bigint NOT NULL, note text)")
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # before.change of a delete
        conn.execute("CREATE SEQUENCE item_changes")
    init_outbox(dsn, "--slot", "cdc_relay", "--plugin", "pgoutput", "--capture", "public.items")


def test_a_captured_table_killed_at_chosen_points_arrives_exactly_once(
        db: str, broker: ApacheKafka, topic_prefix: str, pg_cluster: PostgresCluster) -> None:
    """Four relays killed (-9) with a Kafka transaction open, between a Kafka commit and the
    slot's update, at a random moment; then a last relay and more writes."""
    _setup(db)
    outbox, changes = Expected(), Changes()
    rng = random.Random(7)
    ahead: list[str] = []
    proxy = TcpProxy(pg_cluster.port)  # the killed relays reach PostgreSQL through it
    capture = ("--capture", "public.items", "--capture-prefix", topic_prefix)
    with caught_up_reader(broker.bootstrap, topic_prefix) as live:
        try:
            with repeatedly(lambda seed: write(db, transactions=5, seed=seed, outbox=outbox,
                                               changes=changes), seed=500, pause=0.1):
                for kind in ["mid-transaction", "after-commit", "random", "after-commit"]:
                    _, left_ahead = kill_at(kind, db, broker, topic_prefix, proxy, rng,
                                            plugin="pgoutput", extra=capture)
                    if left_ahead:
                        ahead.append(kind)
        finally:
            proxy.close()
        with _relay(db, broker.bootstrap, topic_prefix) as last:
            write(db, transactions=20, seed=999, outbox=outbox, changes=changes)
            read_when_settled(db, current_wal(db))
            assert last.stop() == 0, last.stderr
        arrived = _arrived(topic_prefix, outbox, changes)
        wait_for(lambda: arrived(list(live.messages)),
                 timeout=60, message="every committed change at the caught-up reader")
        with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            collector.collect(until=_arrived(topic_prefix, outbox, changes), timeout=60)
            messages = collector.collect(timeout=1.0)  # late duplicates would show up here
    _assert_exactly_once(messages, topic_prefix, outbox, changes)
    _assert_exactly_once(list(live.messages), topic_prefix, outbox, changes)
    kinds = Counter(kind for kind, _ in changes.committed)
    print(f"{len(changes.committed)} changes ({kinds['d']} deletes), {len(outbox.events)} outbox "
          f"events committed, {len(changes.rolled_back)} changes rolled back; checkpoint ahead of "
          f"the slot after: {ahead}")
    assert kinds["d"] > 5 and len(changes.rolled_back) > 20 and len(changes.committed) > 100
    assert ahead, "no kill landed between a Kafka commit and the slot update"


def test_captured_changes_of_one_postgres_transaction_commit_with_its_outbox_events(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    """A PostgreSQL transaction (inserts, a key change, a delete, an outbox event) is one
    Kafka transaction, never split, even with ``--txn-max-events 1``: one checkpoint each."""
    _setup(db)
    with psycopg.connect(db) as conn:
        conn.execute("INSERT INTO items VALUES (1, 1, 'a'), (2, 2, 'b')")
        conn.execute("UPDATE items SET id = 3, change = 3 WHERE id = 1")
        conn.execute("DELETE FROM items WHERE id = 2")
        emit(conn, "item", "1", "ItemsChanged", {})
        conn.commit()
        conn.execute("INSERT INTO items VALUES (4, 4, 'c')")
        conn.commit()
    end = current_wal(db)
    with _relay(db, broker.bootstrap, topic_prefix, "--txn-max-events", "1") as relay:
        read_when_settled(db, end)
        assert relay.stop() == 0, relay.stderr
    with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        messages = collector.collect(until=lambda ms: len(ms) >= 11, timeout=30)
        messages = collector.collect(timeout=0.5)
    ops = [json.loads(m.value)["op"] if m.value else "tombstone" for m in messages
           if m.topic.endswith(".public.items")]
    assert sorted(ops) == sorted(["c", "c", "d", "tombstone", "c", "d", "tombstone", "c"])
    assert len(checkpoints(messages)) == 2 and len(_outbox_ids(messages)) == 1


def test_a_split_transaction_of_key_changes_killed_mid_way_resumes_after_the_messages_in_kafka(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    """``--txn-split-events`` inside one PostgreSQL transaction of key changes (three
    messages each: the splits fall inside rows too); killed after two partial commits, the
    next relay skips exactly the messages in Kafka."""
    rows, split = 5000, 1000
    with psycopg.connect(db, autocommit=True) as conn:  # before the slot: not streamed
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, change bigint NOT NULL, note text)")
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO items SELECT g, g, 'x' FROM generate_series(1, %s) g", (rows,))
    init_outbox(db, "--slot", "cdc_relay", "--plugin", "pgoutput", "--capture", "public.items")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE items SET id = id + 100000, change = change + 100000")
    end = current_wal(db)
    port = free_port()
    extra = ("--txn-split-events", str(split))
    relay = _relay(db, broker.bootstrap, topic_prefix, *extra, "--metrics-port", str(port))
    try:
        wait_for(lambda: scrape(port).get("cdc_relay_transactions_committed_total", 0) >= 2,
                 timeout=60, interval=0.005, message="two split commits")
    finally:
        relay.kill()
    with _relay(db, broker.bootstrap, topic_prefix, *extra) as second:
        read_when_settled(db, end)
        assert "events of the split transaction" in second.stderr
        assert second.stop() == 0, second.stderr
    with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        messages = collector.collect(until=lambda ms: len(ms) >= 3 * rows, timeout=60)
        messages = collector.collect(timeout=1.0)
    found, tombstones = _identities(messages, topic_prefix)
    expected = {("d", g) for g in range(1, rows + 1)} | {("w", g + 100000) for g in range(1, rows + 1)}
    assert set(found) == expected and max(found.values()) == 1 and tombstones == rows
