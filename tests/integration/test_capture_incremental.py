"""Incremental snapshots of captured tables while streaming goes on (docs/table-cdc.md).

On the real stack (PostgreSQL, Apache Kafka, the relay as a process): a signal row (the
``cdc-relay snapshot`` command) makes the running relay read a table in primary-key
chunks between watermarks; a writer updates, deletes and inserts random keys meanwhile.
Replaying the topic by key (last value wins, tombstones delete) gives the table, and no
``r`` event of a key follows a streamed change newer than it (every write stamps the row
with the next value of a sequence, ``ver``). A ``kill -9`` mid-snapshot resumes from the
last acknowledged chunk; signals for tables that cannot be snapshotted are one line each.
"""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import psycopg
import pytest

from tests.integration.wal_support import init_db, start_relay
from tests.support import CliProcess, KafkaCollector, Msg, run_cli, wait_for

pytestmark = pytest.mark.integration


def _capture(prefix: str, tables: str, *extra: str) -> tuple[str, ...]:
    return ("--capture", tables, "--capture-prefix", prefix, *extra)


def _table(dsn: str, name: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE IF NOT EXISTS ver_seq")
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, ver bigint NOT NULL, v text)")
        conn.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        conn.execute(f"INSERT INTO {name} SELECT g, nextval('ver_seq'), 'initial ' || g"
                     f" FROM generate_series(1, {rows}) g")


def _rows(dsn: str, name: str) -> dict[int, tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: (r[1], r[2]) for r in conn.execute(f"SELECT id, ver, v FROM {name}")}


def _snapshot(dsn: str, *tables: str) -> None:
    done = run_cli("snapshot", "--dsn", dsn, *tables)
    assert done.returncode == 0, done.stderr
    assert "execute-snapshot" in done.stdout


class Writer(threading.Thread):
    """Random single-row updates, deletes and inserts of ``table``'s keys until stopped."""

    def __init__(self, dsn: str, table: str, keys: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.keys = dsn, table, keys
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.writes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    key = self.rng.randint(1, self.keys)
                    op = self.rng.random()
                    if op < 0.6:
                        conn.execute(f"UPDATE {self.table} SET ver = nextval('ver_seq'),"
                                     " v = 'updated' WHERE id = %s", (key,))
                    elif op < 0.8:
                        conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
                    else:
                        conn.execute(f"INSERT INTO {self.table} VALUES (%s, nextval('ver_seq'),"
                                     " 'inserted') ON CONFLICT (id) DO UPDATE SET"
                                     " ver = excluded.ver, v = excluded.v", (key,))
                    self.writes += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def _replay(messages: list[Msg], topic: str) -> tuple[dict[int, tuple[int, str]], list[str]]:
    """The topic replayed by key (last value wins, a tombstone deletes) and the ordering
    violations: an ``r`` event whose ``ver`` is older than a streamed change of its key
    that arrived before it (a delete counts as newer than the version it deleted)."""
    state: dict[int, tuple[int, str]] = {}
    newest: dict[int, float] = {}
    violations = []
    for m in messages:
        if m.topic != topic or m.key is None:
            continue
        key = json.loads(m.key)["id"]
        if m.value is None:
            state.pop(key, None)
            continue
        event = json.loads(m.value)
        op = event["op"]
        if op == "d":
            newest[key] = max(newest.get(key, 0), event["before"]["ver"] + 0.5)
            state.pop(key, None)
            continue
        after = event["after"]
        if op == "r" and after["ver"] < newest.get(key, 0):
            violations.append(f"key {key}: r of ver {after['ver']} after a change of "
                              f"ver {newest[key]}")
        if op != "r":
            newest[key] = max(newest.get(key, 0), after["ver"])
        state[key] = (after["ver"], after["v"])
    return state, violations


def _capturing(db: str, bootstrap: str, prefix: str, table: str, rows: int, chunk: int
               ) -> tuple[CliProcess, str, tuple[str, ...]]:
    """A fresh table of ``rows`` rows and a relay capturing it alone: (relay, topic, args)."""
    init_db(db, plugin="pgoutput")
    _table(db, table, rows)
    extra = _capture(prefix, f"public.{table}", "--no-outbox", "--snapshot-chunk-size", str(chunk))
    relay = start_relay(db, bootstrap, prefix, plugin="pgoutput", extra=extra)
    return relay, f"{prefix}.public.{table}", extra


def _r_events(messages: list[Msg], topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.value) for m in messages
            if m.topic == topic and m.value is not None and json.loads(m.value)["op"] == "r"]


@pytest.mark.slow
def test_a_snapshot_under_concurrent_writes_ends_equal_to_the_table_and_never_reorders_a_key(
        db: str, broker: object, topic_prefix: str) -> None:
    relay, topic, _ = _capturing(db, broker.bootstrap, topic_prefix, "items", 6000, 400)  # type: ignore[attr-defined]
    writer = Writer(db, "items", 6500, seed=43)
    try:
        writer.start()
        wait_for(lambda: writer.writes > 50, timeout=30, message="the writer writing")
        _snapshot(db, "public.items")
        wait_for(lambda: "incremental snapshot of public.items finished" in relay.stderr
                 or not relay.running(), timeout=180, message="the snapshot finished")
        during = writer.writes
        writer.stop.set()
        writer.join(30)
        assert writer.error is None, writer.error
        table = _rows(db, "items")
        with KafkaCollector(broker.bootstrap, topic) as collector:  # type: ignore[attr-defined]
            got = collector.collect(until=lambda ms: (lambda r: r[0] == table or bool(r[1]))(
                _replay(ms, topic)), timeout=90)
    finally:
        writer.stop.set()
        assert relay.stop() == 0, relay.stderr
    state, violations = _replay(got, topic)
    assert violations == []
    assert state == table
    snapshot_rows = _r_events(got, topic)
    assert during > 200  # the writer wrote while the snapshot ran
    assert 0 < len(snapshot_rows) <= 6500
    assert {e["source"]["snapshot"] for e in snapshot_rows} == {"incremental"}
    assert all(e["before"] is None for e in snapshot_rows)


@pytest.mark.slow
def test_a_snapshot_killed_mid_way_resumes_from_the_last_acknowledged_chunk(
        db: str, broker: object, topic_prefix: str) -> None:
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay, topic, extra = _capturing(db, bootstrap, topic_prefix, "big", 8000, 100)
    _snapshot(db, "public.big")

    def acked() -> tuple[Any, ...] | None:
        with psycopg.connect(db) as conn:
            return conn.execute("SELECT last_key, rows_done, state FROM cdc_relay_incremental"
                                " WHERE table_name = 'big'").fetchone()

    wait_for(lambda: (acked() or (None, 0))[1] >= 1000, timeout=60,
             message="a few chunks acknowledged")
    relay.kill()
    last_key, rows_done, state = acked()  # type: ignore[misc]
    assert state == "running" and rows_done < 8000, "killed after the snapshot ended"
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=extra)
    try:
        wait_for(lambda: "incremental snapshot of public.big finished" in relay.stderr,
                 timeout=120, message="the resumed snapshot finished")
        with KafkaCollector(bootstrap, topic) as collector:
            got = collector.collect(until=lambda ms: {e["after"]["id"] for e in _r_events(ms, topic)}
                                    == set(range(1, 8001)), timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr
    counts: dict[int, int] = {}
    for event in _r_events(got, topic):
        counts[event["after"]["id"]] = counts.get(event["after"]["id"], 0) + 1
    assert set(counts) == set(range(1, 8001))  # nothing missing
    acked_keys = range(1, int(last_key[0]) + 1)
    assert all(counts[k] == 1 for k in acked_keys)  # acknowledged chunks are not read again
    assert acked()[2] == "done"  # type: ignore[index]


def test_signals_for_tables_that_cannot_be_snapshotted_are_one_line_each(
        db: str, broker: object, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    _table(db, "kept", 30)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE other (id int PRIMARY KEY); CREATE TABLE nokey (v int)")
        conn.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    relay = start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",  # type: ignore[attr-defined]
                        extra=_capture(topic_prefix, "public.kept,public.nokey"))
    try:
        _snapshot(db, "public.other", "public.nokey")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO cdc_relay_signal VALUES ('bad', 'execute-snapshot', 'x{')")
        wait_for(lambda: "signal 'bad': data is not JSON" in relay.stderr, timeout=30,
                 message="the refusals logged")
        _snapshot(db, "public.kept")
        wait_for(lambda: "incremental snapshot of public.kept finished" in relay.stderr,
                 timeout=60, message="a valid signal still served")
        assert relay.running()
    finally:
        assert relay.stop() == 0, relay.stderr
    lines = relay.stderr.splitlines()
    assert sum("public.other is not captured" in line for line in lines) == 1
    assert sum("public.nokey: the table has no primary key" in line for line in lines) == 1
    assert "Traceback" not in relay.stderr


def test_a_table_added_to_capture_later_is_snapshotted_by_signal_while_the_outbox_flows(
        db: str, broker: object, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    _table(db, "first_t", 5)
    _table(db, "later_t", 700)
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "public.first_t"))
    assert relay.stop() == 0, relay.stderr
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "public.first_t,public.later_t",
                                       "--snapshot-chunk-size", "64"))
    stop, emitted = threading.Event(), [0]

    def outbox() -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            while not stop.is_set() and emitted[0] < 2000:
                conn.execute("INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type,"
                             " payload) VALUES ('orders', %s, 'placed', '{}')", (str(emitted[0]),))
                emitted[0] += 1

    thread = threading.Thread(target=outbox, daemon=True)
    later = f"{topic_prefix}.public.later_t"
    try:
        thread.start()
        _snapshot(db, "public.later_t")
        wait_for(lambda: "incremental snapshot of public.later_t finished" in relay.stderr,
                 timeout=60, message="the added table's snapshot finished")
        stop.set()
        thread.join(30)
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len(_r_events(ms, later)) >= 700 and len(
                [m for m in ms if m.topic == f"{topic_prefix}.orders"]) >= emitted[0], timeout=60)
    finally:
        stop.set()
        assert relay.stop() == 0, relay.stderr
    assert sorted(e["after"]["id"] for e in _r_events(got, later)) == list(range(1, 701))
    orders = {m.key for m in got if m.topic == f"{topic_prefix}.orders"}
    assert orders == {str(i).encode() for i in range(emitted[0])}
    assert emitted[0] > 0


def test_snapshot_rows_are_written_in_the_relays_type_modes(
        db: str, broker: object, topic_prefix: str) -> None:
    """An ``r`` row of an incremental snapshot is written as the relay's streamed rows are,
    under ``--capture-decimal-handling string`` too (not Debezium's default modes)."""
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE prices (id int PRIMARY KEY, amount numeric(10,2))")
        conn.execute("INSERT INTO prices VALUES (1, 12.50)")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=_capture(
        topic_prefix, "public.prices", "--message-format", "debezium-json-schemaless",
        "--capture-decimal-handling", "string"))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO prices VALUES (2, 3.25)")
        _snapshot(db, "public.prices")
        with KafkaCollector(bootstrap, f"{topic_prefix}.public.prices") as collector:
            messages = collector.collect(count=2, timeout=60)
    finally:
        assert relay.stop() == 0, relay.stderr
    values = {(v["op"], v["after"]["id"]): v["after"]["amount"]
              for v in (json.loads(m.value) for m in messages if m.value)}
    assert values[("c", 2)] == "3.25"
    assert values[("r", 1)] == "12.50"


def test_a_snapshot_signal_under_exactly_once_is_refused_in_one_line(
        db: str, broker: object, topic_prefix: str) -> None:
    """A chunk is read outside the WAL, so an exactly-once replay could not count it:
    the relay says so at start and for each signal, and streams on."""
    init_db(db, plugin="pgoutput")
    _table(db, "kept", 3)
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=_capture(
        topic_prefix, "public.kept", "--exactly-once", "--checkpoint-topic",
        f"{topic_prefix}.checkpoints"))
    try:
        _snapshot(db, "public.kept")
        wait_for(lambda: "snapshot signal" in relay.stderr and "ignored" in relay.stderr,
                 timeout=30, message="the signal's line")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE kept SET v = 'streamed' WHERE id = 1")
        with KafkaCollector(bootstrap, f"{topic_prefix}.public.kept",
                            config={"isolation.level": "read_committed"}) as collector:
            messages = collector.collect(count=1, timeout=60)
            messages = collector.collect(timeout=1.0)
        assert relay.running()
    finally:
        assert relay.stop() == 0, relay.stderr
    assert [json.loads(m.value)["op"] for m in messages if m.value] == ["u"]
    assert "incremental snapshots are off with --exactly-once" in relay.stderr
    assert "Traceback" not in relay.stderr
