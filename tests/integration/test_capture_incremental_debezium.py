"""Incremental snapshots' ``op: r`` events against Debezium's own incremental snapshot.

The differential workload's tables with a primary key (tests/integration/capture_workload/)
as they end, snapshotted incrementally by Debezium embedded (an ``execute-snapshot`` row in
its ``signal.data.collection``, ``snapshot.mode=no_data``) and by a running relay (the same
row through ``cdc-relay snapshot``): key, value and schema block of every event equal,
``source.snapshot`` included - but each one's own position, transaction and clock
(``source.lsn``, ``txId``, ``sequence``, ``ts_*``, as for ``--snapshot initial``; Debezium
writes null as the ``lsn`` and ``txId`` of these rows).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.integration.test_capture_debezium import (
    HERE,
    TABLES,
    _unavailable,
    assert_same_read_events,
)
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, run_cli, skip_or_fail_in_ci, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_incremental_snapshot_events_equal_debezium_incremental_snapshot(
        db: str, broker: object, topic_prefix: str, tmp_path: Path) -> None:
    why = _unavailable()
    if why is not None:
        skip_or_fail_in_ci(f"Debezium embedded cannot run here: {why}")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute((HERE / "setup.sql").read_text())
        for statement in (HERE / "workload.sql").read_text().split(";\n"):
            if statement.strip():
                conn.execute(statement)
        keyed = [t for t in TABLES if conn.execute(
            "SELECT 1 FROM pg_index WHERE indrelid = %s::regclass AND indisprimary",
            (f"public.{t}",)).fetchone()]
        rows = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
                   for t in keyed)
        names = [f"public.{t}" for t in keyed]
        conn.execute("CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32)"
                     " NOT NULL, data varchar(2048))")
        conn.execute(f"CREATE PUBLICATION dbz_pub FOR TABLE {', '.join(names)}, dbz_signal")
        conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
        conn.execute("INSERT INTO dbz_signal VALUES ('s1', 'execute-snapshot', %s)",
                     (json.dumps({"data-collections": names, "type": "incremental"}),))
    assert len(keyed) >= 8 and rows > 10
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
        "--capture", ",".join(names), "--capture-prefix", topic_prefix, "--message-format",
        "debezium-json", "--no-outbox"))
    try:
        asked = run_cli("snapshot", "--dsn", db, *names)
        assert asked.returncode == 0, asked.stderr
        conn_info = conninfo_to_dict(db)
        out = tmp_path / "debezium.jsonl"
        env = {**os.environ, "DBZ_COUNT_PREFIX": "dbz.public.t_",
               "DBZ_EXTRA": json.dumps({"signal.data.collection": "public.dbz_signal"})}
        subprocess.run([sys.executable, "-m", "tests.integration.debezium_child",
                        str(conn_info["host"]), str(conn_info["port"]), str(conn_info["dbname"]),
                        "dbz", "dbz_pub", "dbz", ",".join([*names, "public.dbz_signal"]),
                        str(rows), str(out)],
                       check=True, timeout=300, capture_output=True, stdin=subprocess.DEVNULL,
                       env=env)
        debezium = [r for r in map(json.loads, out.read_text().splitlines())
                    if r[0].startswith("dbz.public.t_")]
        assert len(debezium) == rows
        wait_for(lambda: relay.stderr.count("incremental snapshot of") >= 2 * len(keyed),
                 timeout=60, message="the relay's snapshots finished")
        with KafkaCollector(bootstrap, topic_prefix + ".public.") as collector:
            got = collector.collect(count=rows, timeout=60)
    finally:
        relay.stop()
    assert_same_read_events(debezium, got, topic_prefix)  # BC dates: as --snapshot initial's
    # docs/table-cdc.md, known differences: Debezium's rows carry no position, the relay's
    # the high watermark's (its chunk's transaction, its LSN)
    ours = [json.loads(m.value)["payload"]["source"] for m in got if m.value]
    theirs = [json.loads(value)["payload"]["source"] for _, _, value in debezium]
    assert {s["snapshot"] for s in ours} == {s["snapshot"] for s in theirs} == {"incremental"}
    assert {(s["lsn"], s["txId"]) for s in theirs} == {(None, None)}
    assert all(isinstance(s["lsn"], int) and isinstance(s["txId"], int) for s in ours)
