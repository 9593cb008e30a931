"""Adding and removing a captured table later (docs/table-cdc.md, changing the tables).

On the real stack: the relay stopped, the table added to the publication with
``init --capture``, the relay restarted with the longer ``--capture`` list - the new
table's changes committed after it joined arrive, the old tables' changes made meanwhile
arrive once, the new table's existing rows come from a one-off snapshot relay on a slot of
its own; a table left out of ``--capture`` has its changes decoded and skipped.
"""

from __future__ import annotations

import json

import psycopg
from confluent_kafka import Consumer, TopicPartition

from tests.integration.wal_support import confirmed_flush, current_wal, init_db, start_relay
from tests.support import KafkaCollector, Msg, run_cli, wait_for


def _events(messages: list[Msg], topic: str) -> list[tuple[str, int]]:
    """(op, id) of each change event on ``topic``, in arrival order, first arrivals only
    (at least once: a repeat after a restart is allowed)."""
    seen: dict[tuple[str, int, str], None] = {}
    for m in messages:
        if m.topic != topic or m.value is None:
            continue
        payload = json.loads(m.value)
        row = payload["after"] or payload["before"]
        seen.setdefault((payload["op"], row["id"], payload["source"]["lsn"]), None)
    return [(op, ident) for op, ident, _ in seen]


def _capture(prefix: str, tables: str) -> tuple[str, ...]:
    return ("--capture", tables, "--capture-prefix", prefix)


def _messages_in(bootstrap: str, topic: str) -> int:
    """How many messages ``topic`` holds (its partitions' high watermarks), 0 if absent."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "count"})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            return 0
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in metadata.partitions)
    finally:
        consumer.close()


def test_a_table_added_while_the_relay_is_stopped_streams_from_when_it_joined_and_loses_nothing(
        db: str, broker: object, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE old_t (id int PRIMARY KEY, v text);"
                     "CREATE TABLE new_t (id int PRIMARY KEY, v text)")
    assert run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
                   "--capture", "public.old_t").returncode == 0
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    old, new = f"{topic_prefix}.public.old_t", f"{topic_prefix}.public.new_t"
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "public.old_t"))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO old_t VALUES (1, 'a')")
        conn.execute("INSERT INTO new_t VALUES (1, 'before it joined')")
    with KafkaCollector(bootstrap, topic_prefix) as collector:
        collector.collect(until=lambda ms: bool(_events(ms, old)), timeout=60)
    assert relay.stop() == 0, relay.stderr

    # the relay is stopped: the old table's changes wait in the slot
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO old_t VALUES (2, 'b')")
        conn.execute("INSERT INTO new_t VALUES (2, 'before it joined')")
    added = run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
                    "--capture", "public.new_t")
    assert added.returncode == 0, added.stderr
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO new_t VALUES (3, 'after it joined')")
        conn.execute("UPDATE new_t SET v = 'updated after it joined' WHERE id = 1")
        conn.execute("INSERT INTO old_t VALUES (3, 'c')")
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "public.old_t,public.new_t"))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO new_t VALUES (4, 'd')")
            conn.execute("INSERT INTO old_t VALUES (4, 'd')")
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len(_events(ms, old)) >= 4
                                    and len(_events(ms, new)) >= 3, timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr
    assert _events(got, old) == [("c", 1), ("c", 2), ("c", 3), ("c", 4)]
    # the inserts of rows 1 and 2 were written before new_t joined the publication
    assert _events(got, new) == [("c", 3), ("u", 1), ("c", 4)]

    # the documented one-off: new_t's existing rows from a snapshot relay of its own
    snap = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", slot="cdc_relay_snap",
                       extra=(*_capture(topic_prefix, "public.new_t"), "--no-outbox",
                              "--snapshot", "initial", "--publication", "cdc_relay_snap"))
    try:
        wait_for(lambda: "backfill finished" in snap.stderr, timeout=60,
                 message="the snapshot relay's snapshot finished")
    finally:
        assert snap.stop() == 0, snap.stderr
    dropped = run_cli("slot", "drop", "--dsn", db, "--slot", "cdc_relay_snap", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    with KafkaCollector(bootstrap, topic_prefix) as collector:
        got = collector.collect(until=lambda ms: len([e for e in _events(ms, new)
                                                      if e[0] == "r"]) >= 4, timeout=60)
    assert sorted(e for e in _events(got, new) if e[0] == "r") == [("r", i) for i in (1, 2, 3, 4)]


def test_a_table_removed_from_capture_is_decoded_and_skipped_and_the_slot_moves_past_it(
        db: str, broker: object, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE keep_t (id int PRIMARY KEY);"
                     "CREATE TABLE gone_t (id int PRIMARY KEY)")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    keep, gone = f"{topic_prefix}.public.keep_t", f"{topic_prefix}.public.gone_t"
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "public.keep_t,public.gone_t"))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO gone_t VALUES (1)")
        conn.execute("INSERT INTO keep_t VALUES (1)")
    with KafkaCollector(bootstrap, topic_prefix) as collector:
        collector.collect(until=lambda ms: bool(_events(ms, keep)) and bool(_events(ms, gone)),
                          timeout=60)
    assert relay.stop() == 0, relay.stderr
    assert _messages_in(bootstrap, gone) == 1

    with psycopg.connect(db, autocommit=True) as conn:  # in the slot, written while captured
        conn.execute("INSERT INTO gone_t VALUES (2)")
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "public.keep_t"))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO gone_t VALUES (3)")
            conn.execute("INSERT INTO keep_t VALUES (2)")
        end = current_wal(db)
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len(_events(ms, keep)) >= 2, timeout=60)
        wait_for(lambda: confirmed_flush(db) >= end, timeout=30, message="the slot confirmed")
    finally:
        assert relay.stop() == 0, relay.stderr
    assert _events(got, keep) == [("c", 1), ("c", 2)]
    assert _messages_in(bootstrap, gone) == 1  # rows 2 and 3: decoded, skipped, confirmed
    with psycopg.connect(db) as conn:  # the relay never removes a table from the publication
        published = conn.execute("SELECT tablename FROM pg_publication_tables WHERE pubname ="
                                 " 'cdc_relay_outbox' ORDER BY 1").fetchall()
    assert [r[0] for r in published] == ["cdc_relay_signal", "gone_t", "keep_t", "outbox_events"]
