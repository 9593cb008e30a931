"""Table CDC (run --capture) on the real stack: Debezium's change events from the outbox's slot."""

from __future__ import annotations

import json

import psycopg

from cdc_relay.outbox import emit
from tests.integration.wal_support import confirmed_flush, current_wal, init_db, start_relay
from tests.support import KafkaCollector, Msg, init_outbox, run_cli, wait_for

TABLES = """
CREATE TABLE customers (id int PRIMARY KEY, name text, note text);
CREATE TABLE audit (id int PRIMARY KEY, what text);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE hosts (id int PRIMARY KEY, addr box);
"""


def _setup(dsn: str) -> None:
    init_db(dsn, plugin="pgoutput")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)


def _capture(prefix: str, *extra: str) -> tuple[str, ...]:
    return ("--capture", "public.customers,public.audit,public.docs,public.hosts",
            "--capture-prefix", prefix, *extra)


def _payloads(messages: list[Msg], topic: str) -> list[dict[str, object] | None]:
    return [None if m.value is None else json.loads(m.value) for m in messages if m.topic == topic]


def test_insert_update_delete_arrive_as_debezium_events_and_the_slot_waits_for_all(
        db: str, broker: object, topic_prefix: str) -> None:
    _setup(db)
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix))
    try:
        with psycopg.connect(db) as conn:
            conn.execute("INSERT INTO customers VALUES (1, 'ada', 'x')")
            emit(conn, "customer", "1", "CustomerCreated", {"id": 1})  # same transaction
            conn.commit()
            conn.execute("UPDATE customers SET name = 'ada l' WHERE id = 1")
            conn.execute("INSERT INTO audit VALUES (1, 'a')")
            conn.commit()
            conn.execute("UPDATE audit SET what = 'b' WHERE id = 1")
            conn.execute("DELETE FROM customers WHERE id = 1")
            conn.commit()
        end = current_wal(db)
        topic = f"{topic_prefix}.public.customers"
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 4
                                    and any(m.topic.endswith(".customer") for m in ms)
                                    and len([m for m in ms if m.topic.endswith("audit")]) >= 2,
                                    timeout=60)
        customers = _payloads(got, topic)
        ops = [None if p is None else p["op"] for p in customers]
        assert ops == ["c", "u", "d", None]  # a tombstone after the delete
        create = customers[0]
        assert create is not None
        assert create["after"] == {"id": 1, "name": "ada", "note": "x"}
        assert create["before"] is None
        source = create["source"]
        assert isinstance(source, dict)
        assert (source["connector"], source["name"], source["schema"], source["table"],
                source["snapshot"]) == ("postgresql", topic_prefix, "public", "customers", "false")
        delete = customers[2]
        assert delete is not None
        assert delete["before"] == {"id": 1, "name": None, "note": None}  # DEFAULT: the key only
        keys = [m.key for m in got if m.topic == topic]
        assert keys == [b'{"id":1}'] * 4
        audit = _payloads(got, f"{topic_prefix}.public.audit")
        assert audit[1] is not None and audit[1]["before"] == {"id": 1, "what": "a"}  # FULL
        wait_for(lambda: confirmed_flush(db) >= end, timeout=30, message="the slot confirmed")
    finally:
        relay.stop()


def test_tombstones_off_and_unchanged_toast_placeholder(db: str, broker: object,
                                                         topic_prefix: str) -> None:
    _setup(db)
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix, "--no-capture-tombstones", "--no-outbox"))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO docs VALUES (1, repeat('x', 20000), 1)")
            conn.execute("UPDATE docs SET n = 2 WHERE id = 1")
            conn.execute("DELETE FROM docs WHERE id = 1")
        topic = f"{topic_prefix}.public.docs"
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 3,
                                    timeout=60)
            extra = collector.collect(timeout=1)
        docs = _payloads(extra, topic)
        assert [p["op"] for p in docs if p is not None] == ["c", "u", "d"]
        assert None not in docs  # no tombstone
        update = docs[1]
        assert update is not None and update["after"] == {
            "id": 1, "body": "__debezium_unavailable_value", "n": 2}
        assert len(got) >= 3
    finally:
        relay.stop()


def test_a_type_without_a_mapping_is_dead_lettered_and_the_stream_goes_on(
        db: str, broker: object, topic_prefix: str) -> None:
    _setup(db)
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=_capture(topic_prefix))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO hosts VALUES (1, '((1,1),(0,0))')")
            conn.execute("INSERT INTO customers VALUES (2, 'bob', NULL)")
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(
                until=lambda ms: any(m.topic.endswith(".dlq") for m in ms)
                and any(m.topic.endswith("customers") for m in ms), timeout=60)
        dead = next(m for m in got if m.topic.endswith(".dlq"))
        assert b"addr" in dead.headers["error"] and b"box" in dead.headers["error"]
        assert dead.headers["original_topic"] == f"{topic_prefix}.public.hosts".encode()
        assert "dead-lettering" in relay.stderr
    finally:
        relay.stop()


def test_capture_refuses_missing_tables_in_one_line(db: str, broker: object,
                                                    topic_prefix: str) -> None:
    _setup(db)
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    common = ("run", "--dsn", db, "--brokers", bootstrap, "--capture-prefix", topic_prefix)
    missing = run_cli(*common, "--plugin", "pgoutput", "--capture", "public.nope")
    assert missing.returncode == 2, missing.stderr
    assert "public.nope does not exist" in missing.stderr


def test_init_capture_adds_the_tables_and_reports_their_problems_and_doctor_checks_them(
        db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text);"
                     "CREATE TABLE events_log (at timestamptz, what text)")
    before = run_cli("doctor", "--dsn", db, "--capture", "public.customers,public.events_log",
                     "--format", "json")
    verdicts = {c["name"]: c for c in json.loads(before.stdout)}
    assert verdicts["captured tables: publication"]["verdict"] == "warn"
    assert verdicts["replica identity"]["verdict"] == "fail"
    assert "ALTER TABLE public.events_log REPLICA IDENTITY FULL" in verdicts["replica identity"]["fix"]
    result = run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
                     "--capture", "public.customers,public.events_log")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert ("captured tables (2, inserts, updates and deletes published): public.customers, "
            "public.events_log") in lines
    assert any(line.startswith("warning: public.events_log has no primary key") for line in lines)
    with psycopg.connect(db) as conn:
        published = conn.execute(
            "SELECT tablename FROM pg_publication_tables WHERE pubname = 'cdc_relay_outbox'"
            " ORDER BY 1").fetchall()
        flags = conn.execute("SELECT pubinsert, pubupdate, pubdelete FROM pg_publication"
                             " WHERE pubname = 'cdc_relay_outbox'").fetchone()
    assert [r[0] for r in published] == ["cdc_relay_signal", "customers", "events_log",
                                        "outbox_events"]  # the signal table: incremental snapshots
    assert flags == (True, True, True)
    after = run_cli("doctor", "--dsn", db, "--capture", "public.customers,public.events_log",
                    "--format", "json")
    verdicts = {c["name"]: c for c in json.loads(after.stdout)}
    assert verdicts["captured tables: publication"]["verdict"] == "pass"
    assert verdicts["captured tables"]["detail"] == "2: public.customers, public.events_log"
    assert after.returncode == 1  # the replica identity still fails


def test_doctor_capture_fails_a_missing_table_and_init_refuses_it(db: str) -> None:
    result = run_cli("doctor", "--dsn", db, "--capture", "public.nope")
    assert result.returncode == 1
    assert any(line.startswith("FAIL  captured tables") and "public.nope does not exist" in line
               for line in result.stdout.splitlines()), result.stdout
    refused = run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
                      "--capture", "public.nope")
    assert refused.returncode == 2
    assert "captured table public.nope does not exist" in refused.stderr


DDL_WORKLOAD = [
    "INSERT INTO shapes VALUES (1, 'ada', 'x', 5)",
    "ALTER TABLE shapes ADD COLUMN c text DEFAULT 'dflt'",
    "INSERT INTO shapes VALUES (2, 'bob', 'y', 6, 'new')",
    "ALTER TABLE shapes DROP COLUMN b",
    "UPDATE shapes SET n = 7 WHERE id = 2",
    "ALTER TABLE shapes ALTER COLUMN n TYPE bigint",
    "INSERT INTO shapes VALUES (3, 'cy', 9000000000, NULL)",
    "ALTER TABLE shapes RENAME COLUMN name TO full_name",
    "INSERT INTO shapes VALUES (4, 'di', 1, 'z')",
    "DELETE FROM shapes WHERE id = 1",
]


def test_schema_changes_mid_stream_each_event_has_the_shape_of_its_moment(
        db: str, broker: object, topic_prefix: str) -> None:
    """The DDL is all done before the relay reads the first change, so the catalog it reads
    is the last shape: the events still take each moment's from the Relation messages."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE shapes (id int PRIMARY KEY, name text, b text, n int)")
    init_db(db, plugin="pgoutput")
    assert run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
                   "--capture", "public.shapes").returncode == 0
    with psycopg.connect(db, autocommit=True) as conn:
        for statement in DDL_WORKLOAD:
            conn.execute(statement)
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    topic = f"{topic_prefix}.public.shapes"
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput",
                        extra=("--capture", "public.shapes", "--capture-prefix", topic_prefix,
                               "--message-format", "debezium-json", "--no-outbox"))
    try:
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 7,
                                    timeout=60)
    finally:
        relay.stop()
    events = [json.loads(m.value) for m in got if m.topic == topic and m.value is not None]
    assert [e["payload"]["after"] for e in events[:5]] == [
        {"id": 1, "name": "ada", "b": "x", "n": 5},
        {"id": 2, "name": "bob", "b": "y", "n": 6, "c": "new"},
        {"id": 2, "name": "bob", "n": 7, "c": "new"},
        {"id": 3, "name": "cy", "n": 9_000_000_000, "c": "dflt"},  # NULL: the default
        {"id": 4, "full_name": "di", "n": 1, "c": "z"},
    ]
    types = [{f["field"]: f["type"] for f in e["schema"]["fields"][1]["fields"]} for e in events]
    assert types[0] == {"id": "int32", "name": "string", "b": "string", "n": "int32"}
    assert types[2]["n"] == "int32" and types[3]["n"] == "int64"
    assert events[5]["payload"]["op"] == "d"
    assert events[5]["payload"]["before"] == {"id": 1, "full_name": None, "n": None, "c": "dflt"}


def test_snapshot_initial_publishes_existing_rows_as_read_events_then_streams(
        db: str, broker: object, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")  # the relay creates the slot, exporting its snapshot
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text); CREATE TABLE b (id int PRIMARY KEY)")
        conn.execute("INSERT INTO a VALUES (1, 'x'), (2, 'y'), (3, 'z'); INSERT INTO b VALUES (9)")
        emit(conn, "customer", "1", "CustomerCreated", {"id": 1})
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
        "--capture", "public.a,public.b", "--capture-prefix", topic_prefix,
        "--snapshot", "initial"))
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE a SET v = 'x2' WHERE id = 1")
            conn.execute("INSERT INTO b VALUES (10)")
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len(_payloads(ms, f"{topic_prefix}.public.a"))
                                    >= 4 and len(_payloads(ms, f"{topic_prefix}.public.b")) >= 2
                                    and any(m.topic.endswith(".customer") for m in ms), timeout=60)
    finally:
        relay.stop()
    a = [p for p in _payloads(got, f"{topic_prefix}.public.a") if p is not None]
    b = [p for p in _payloads(got, f"{topic_prefix}.public.b") if p is not None]
    marks = [(p["op"], p["source"]["snapshot"], p["after"]["id"]) for p in a + b]  # type: ignore[index]
    assert marks == [("r", "first", 1), ("r", "true", 2), ("r", "last_in_data_collection", 3),
                     ("u", "false", 1), ("r", "last", 9), ("c", "false", 10)]
    assert a[0]["before"] is None and a[3]["after"] == {"id": 1, "v": "x2"}
    lsn = a[0]["source"]["lsn"]  # type: ignore[index]
    assert all(p["source"]["lsn"] == lsn for p in a[:3] + b[:1])  # type: ignore[index]
    assert a[3]["source"]["lsn"] > lsn  # type: ignore[index,operator]


def test_snapshot_initial_without_an_outbox_reads_the_tables_then_streams(
        db: str, broker: object, topic_prefix: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:  # no init: no outbox table at all
        conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO a VALUES (1, 'x'), (2, 'y')")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    extra = ("--capture", "public.a", "--capture-prefix", topic_prefix, "--no-outbox",
             "--snapshot", "initial")
    topic = f"{topic_prefix}.public.a"
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=extra)
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("DELETE FROM a WHERE id = 2")
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len(_payloads(ms, topic)) >= 4, timeout=60)
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.stop()
    again = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=extra)
    assert again.stop() == 0, again.stderr  # a restart: the snapshot is done, it streams
    events = [(p["op"], p["source"]["snapshot"]) for p in _payloads(got, topic) if p]  # type: ignore[index]
    assert events == [("r", "first"), ("r", "last"), ("d", "false")]
    assert "backfill of slot cdc_relay finished" in again.stderr


def test_a_schema_pattern_leaves_the_outbox_and_the_relays_tables_to_the_relay(
        db: str, broker: object, topic_prefix: str) -> None:
    """``--capture 'public.*'`` with the outbox in ``public``: the outbox's rows stay events
    on their own topics, and the relay's bookkeeping tables are not streamed."""
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
        "--capture", "public.*", "--capture-prefix", topic_prefix))
    try:
        with psycopg.connect(db) as conn:
            event_id = str(emit(conn, "order", "o-1", "OrderCreated", {"a": 1}))
            conn.execute("INSERT INTO items VALUES (1, 'x')")
            conn.commit()
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            collector.collect(count=2, timeout=60)
            messages = collector.collect(timeout=1.0)
    finally:
        assert relay.stop() == 0, relay.stderr
    assert sorted(m.topic for m in messages) == [f"{topic_prefix}.order",
                                                 f"{topic_prefix}.public.items"]
    order = next(m for m in messages if m.topic == f"{topic_prefix}.order")
    assert order.headers["id"].decode() == event_id
    refused = run_cli("run", "--dsn", db, "--brokers", bootstrap, "--plugin", "pgoutput",
                      "--capture", "public.items,public.outbox_events",
                      "--capture-prefix", topic_prefix)
    assert refused.returncode == 2, refused.stderr
    assert "outbox table the relay relays as events" in refused.stderr
    assert "Traceback" not in refused.stderr
