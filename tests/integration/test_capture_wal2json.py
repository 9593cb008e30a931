"""``run --capture`` with wal2json, proven equal to the pgoutput capture event by event.

Debezium no longer reads wal2json, so the oracle is the relay's own pgoutput capture, itself
proven equal to Debezium (test_capture_debezium.py, on the same workload): two relays on
one database, slots of their own, one with ``--plugin pgoutput`` and one with ``--plugin
wal2json``, read capture_workload/workload.sql over the tables of setup.sql (every type,
NULLs and edge values, each REPLICA IDENTITY, a key change, unchanged TOAST values, ADD /
DROP COLUMN, a type change, a rename, a typmod change, TRUNCATEs). Keys and values are
compared whole - ``source`` (lsn, txId, sequence, ts_ms) and the schema blocks included -
but for the top-level ``ts_*`` (each relay's moment), ``source.name`` (each one's prefix) and the
one documented difference
(docs/table-cdc.md, wal2json): NaN and the infinities of ``real``/``double precision``,
which wal2json writes as null. A kill -9 of a wal2json capture relay under writes loses
nothing.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg

from cdc_relay.outbox import emit
from tests.integration.wal_support import confirmed_flush, current_wal, init_db, start_relay
from tests.support import CliProcess, KafkaCollector, Msg, init_outbox, run_cli, wait_for

HERE = Path(__file__).parent / "capture_workload"
TABLES = ["t_types", "t_default", "t_full", "t_index", "t_nothing", "t_nopk", "t_toast", "t_e",
          "t_toast2", "t_full_nopk", "t_pk2", "t_ddl", "t_trunc", "t_trunc2"]
# (topic, key's id, column, pgoutput's value): wal2json writes NaN and ±Infinity as null
NAN_AND_INFINITIES = {("t_types", 2, "c_real", "NaN"), ("t_types", 2, "c_double", "-Infinity"),
                      ("t_types", 3, "c_real", "Infinity")}


def _both_relays(db: str, bootstrap: str, prefix: str, w2j: str, *extra: str) -> list[CliProcess]:
    """A pgoutput relay (slot cdc_relay) and a wal2json one (cdc_relay_w) capturing TABLES."""
    return [start_relay(db, bootstrap, pfx, slot=slot, plugin=plugin, extra=(
        "--capture", ",".join(f"public.{t}" for t in TABLES), "--capture-prefix", pfx,
        "--message-format", "debezium-json",
        *extra)) for pfx, slot, plugin in ((prefix, "cdc_relay", "pgoutput"),
                                           (w2j, "cdc_relay_w", "wal2json"))]


def _run_workload(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        for statement in (HERE / "workload.sql").read_text().split(";\n"):
            if statement.strip():
                conn.execute(statement)


def test_wal2json_capture_equals_pgoutput_capture_event_by_event(
        db: str, broker: object, topic_prefix: str) -> None:
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute((HERE / "setup.sql").read_text())
    w2j = f"{topic_prefix}w"
    relays = _both_relays(db, bootstrap, topic_prefix, w2j, "--capture-truncate")
    try:
        _run_workload(db)
        with psycopg.connect(db) as conn:  # the outbox beside: one transaction with a change
            conn.execute("INSERT INTO t_nopk VALUES ('with the outbox', 2)")
            emit(conn, "customer", "1", "CustomerCreated", {"id": 1})
        end = current_wal(db)
        for slot in ("cdc_relay", "cdc_relay_w"):  # every event of both acknowledged
            wait_for(lambda slot=slot: confirmed_flush(db, slot) >= end, timeout=60,
                     message=f"{slot} confirming the workload")
        with KafkaCollector(bootstrap, topic_prefix + ".public.") as collector:
            expected = collector.collect(timeout=8)  # all of it is in the broker: read it
        with KafkaCollector(bootstrap, w2j + ".public.") as collector:
            got = collector.collect(count=len(expected), timeout=60)
        for prefix in (topic_prefix, w2j):
            with KafkaCollector(bootstrap, prefix + ".customer") as collector:
                outbox = collector.collect(count=1, timeout=30)
            assert json.loads(json.loads(outbox[0].value)["payload"]) == {"id": 1}
    finally:
        for relay in relays:
            relay.stop()
    assert len(expected) > 60
    left_out: set[tuple[str, int, str, str]] = set()
    differences = _differences(expected, got, topic_prefix, w2j, left_out)
    assert not differences, f"{len(differences)} differences:\n" + "\n".join(differences[:30])
    # the documented difference (a workload grown with more such values adds to it)
    assert left_out >= NAN_AND_INFINITIES


def _differences(expected: list[Msg], got: list[Msg], prefix: str, w2j: str,
                 left_out: set[tuple[str, int, str, str]]) -> list[str]:
    """pgoutput's messages against wal2json's, topic by topic, one by one."""
    def by_topic(msgs: list[Msg], pfx: str) -> dict[str, list[Msg]]:
        out: dict[str, list[Msg]] = {}
        for m in sorted(msgs, key=lambda m: (m.topic, m.offset)):
            out.setdefault(m.topic.replace(pfx + ".", "PFX.", 1), []).append(m)
        return out

    ours, theirs = by_topic(expected, prefix), by_topic(got, w2j)
    assert sorted(ours) == sorted(theirs)
    differences = []
    for topic, records in ours.items():
        assert len(theirs[topic]) == len(records), topic
        for i, (a, b) in enumerate(zip(records, theirs[topic], strict=True)):
            key_a, key_b = _normal(a.key, prefix), _normal(b.key, w2j)
            value_a, value_b = _normal(a.value, prefix), _normal(b.value, w2j)
            _known(topic, key_a, value_a, value_b, left_out)
            if key_a != key_b:
                differences.append(f"{topic}#{i} key:\n  pgoutput {key_a}\n  wal2json {key_b}")
            if value_a != value_b:
                differences.append(f"{topic}#{i} value:\n  pgoutput {value_a}\n  wal2json {value_b}")
    return differences


def _normal(raw: bytes | None, prefix: str) -> Any:
    """Parsed, the prefix replaced, the top-level ``ts_*`` (each relay's moment) left out."""
    if raw is None:
        return None
    data = json.loads(raw.decode().replace(f'"{prefix}.', '"PFX.'))
    payload = data.get("payload")
    if isinstance(payload, dict) and "source" in payload:
        for key in ("ts_ms", "ts_us", "ts_ns"):
            payload.pop(key, None)
        payload["source"].pop("name", None)
    return data


def _known(topic: str, key: Any, ours: Any, theirs: Any,
           left_out: set[tuple[str, int, str, str]]) -> None:
    """Takes the documented difference (NaN, ±Infinity of real/double) out of ``theirs``."""
    if not ours or not theirs:
        return
    for image in ("before", "after"):
        mine, other = ours["payload"][image], theirs["payload"][image]
        if not mine or not other:
            continue
        for column, value in mine.items():
            if value in ("NaN", "Infinity", "-Infinity") and other.get(column) is None:
                left_out.add((topic.rsplit(".", 1)[1], key["payload"]["id"], column, value))
                other[column] = value


def test_kill_9_of_a_wal2json_capture_relay_under_writes_loses_nothing(
        db: str, broker: object, topic_prefix: str) -> None:
    """kill -9 of the relay while a writer inserts and updates a captured table: after a
    restart every change arrives (at least once), each key's last arrival its last state."""
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    init_db(db, plugin="wal2json")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (id int PRIMARY KEY, v numeric(30,10), note text)")
    extra = ("--capture", "public.kv", "--capture-prefix", topic_prefix,
             "--message-format", "debezium-json-schemaless")
    relay = start_relay(db, bootstrap, topic_prefix, plugin="wal2json", extra=extra)
    done, killed = threading.Event(), threading.Event()

    def writer() -> None:
        with psycopg.connect(db, autocommit=True) as conn:
            for i in range(600):
                if i == 400:  # some writes surely after the kill, while it restarts
                    killed.wait(60)
                conn.execute("INSERT INTO kv VALUES (%s, %s, 'x') ON CONFLICT (id) DO UPDATE "
                             "SET v = EXCLUDED.v, note = kv.note || 'y'",
                             (i % 150, f"{i}.0123456789"))
        done.set()

    thread = threading.Thread(target=writer, daemon=True)
    try:
        with KafkaCollector(bootstrap, topic_prefix + ".public.") as collector:
            thread.start()
            collector.collect(count=50, timeout=60)  # streaming under writes: now kill it
            relay.kill()
            killed.set()
            relay = start_relay(db, bootstrap, topic_prefix, plugin="wal2json", extra=extra)
            thread.join(timeout=120)
            assert done.is_set()
            got = collector.collect(until=lambda msgs: _changes(msgs) >= 600, timeout=90)
    finally:
        relay.stop()
    assert _changes(got) == 600  # every change, a repeat being the same change (same lsn)
    last: dict[int, dict[str, Any]] = {}
    for m in sorted(got, key=lambda m: m.offset):
        event = json.loads(m.value)
        last[event["after"]["id"]] = event["after"]
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT id, v::text, note FROM kv").fetchall()
    assert len(last) == len(rows) == 150
    assert {(i, a["note"]) for i, a in last.items()} == {(r[0], r[2]) for r in rows}


def _changes(msgs: list[Msg]) -> int:
    """Distinct changes (a repeat after the kill is the same change: the same lsn)."""
    return len({json.loads(m.value)["source"]["lsn"] for m in msgs if m.value})


def test_snapshot_initial_with_wal2json_equals_pgoutput_then_streams(
        db: str, broker: object, topic_prefix: str) -> None:
    """``--snapshot initial`` with wal2json: the workload's tables as they end, as ``op: r``
    events equal to the pgoutput relay's (each one's own snapshot: ``source.lsn``, ``txId``,
    ``sequence`` and ``ts_*`` left out), then a change made after it streams."""
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    init_outbox(db, "--no-slot")  # the relays create their slots, exporting the snapshot
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute((HERE / "setup.sql").read_text())
    _run_workload(db)
    with psycopg.connect(db, autocommit=True) as conn:
        rows = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
                   for t in TABLES)
    w2j = f"{topic_prefix}w"
    relays = _both_relays(db, bootstrap, topic_prefix, w2j, "--snapshot", "initial")
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE t_default SET a = 'after' WHERE id = 10")
        collected = []
        for prefix in (topic_prefix, w2j):
            with KafkaCollector(bootstrap, prefix + ".public.") as collector:
                collected.append(collector.collect(count=rows + 1, timeout=60))
    finally:
        for relay in relays:
            relay.stop()
    expected, got = ([replace(m, value=_without_snapshot_position(m.value))
                      for m in msgs if _op(m) == "r"] for msgs in collected)
    assert len(expected) == len(got) == rows > 10
    differences = _differences(expected, got, topic_prefix, w2j, set())
    assert not differences, f"{len(differences)} differences:\n" + "\n".join(differences[:30])
    streamed = [json.loads(m.value) for m in collected[1] if _op(m) == "u"]
    assert [e["payload"]["after"]["a"] for e in streamed] == ["after"]


def _op(m: Msg) -> str | None:
    return None if m.value is None else json.loads(m.value)["payload"]["op"]


def _without_snapshot_position(raw: bytes | None) -> bytes | None:
    """A read event without what names its own snapshot (position, transaction, clock)."""
    if raw is None:
        return None
    data = json.loads(raw)
    for key in ("lsn", "txId", "sequence", "ts_ms", "ts_us", "ts_ns"):
        data["payload"]["source"].pop(key)
    return json.dumps(data).encode()


def test_init_and_doctor_capture_with_wal2json_need_no_publication(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text);"
                     "CREATE TABLE events_log (at timestamptz, what text)")
    tables = "public.customers,public.events_log"
    result = run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "wal2json",
                     "--capture", tables)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert ("captured tables (2, named in the slot's add-tables when the relay streams): "
            "public.customers, public.events_log") in lines
    assert any(line.startswith("warning: public.events_log has no primary key") and
               "wal2json skips its UPDATE and DELETE" in line for line in lines), lines
    with psycopg.connect(db) as conn:
        published = conn.execute("SELECT count(*) FROM pg_publication_tables").fetchone()
    assert published == (0,)
    doctor = run_cli("doctor", "--dsn", db, "--plugin", "wal2json", "--capture", tables,
                     "--format", "json")
    verdicts = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert verdicts["captured tables: publication"]["verdict"] == "pass"
    assert verdicts["replica identity"]["verdict"] == "fail"
    assert "REPLICA IDENTITY FULL" in verdicts["replica identity"]["fix"]
