"""A signal table outside ``--table``'s schema (``--signal-table``) for every command that
has one: ``init --capture`` creates it and its progress table there, ``run`` reads signals
from it, ``cdc-relay snapshot`` writes to it and ``status`` reads the progress there, as
options, variables and config-file keys (docs/table-cdc.md, incremental snapshots)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.wal_support import start_relay
from tests.support import KafkaCollector, run_cli, wait_for

pytestmark = pytest.mark.integration


def _tables(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = %s "
            "ORDER BY 1", (schema,))]


def _progress(dsn: str, *args: str) -> list[dict[str, Any]]:
    result = run_cli(*args, "status", "--dsn", dsn, "--slot", "cdc_relay", "--format", "json")
    assert result.returncode == 0, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)["incremental_snapshots"]
    return found


def test_init_run_snapshot_and_status_use_a_signal_table_in_another_schema(
        db: str, broker: object, topic_prefix: str, tmp_path: Path) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA ops; CREATE TABLE items (id int PRIMARY KEY, v text);"
                     "INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 5) g")
    init = run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
                   "--capture", "public.items", env={"CDC_RELAY_SIGNAL_TABLE": "ops.signals"})
    assert init.returncode == 0, init.stderr
    assert _tables(db, "ops") == ["cdc_relay_incremental", "signals"]
    assert "cdc_relay_signal" not in _tables(db, "public")  # no default one besides
    with psycopg.connect(db, autocommit=True) as conn:
        published = conn.execute("SELECT schemaname::text, tablename::text FROM "
                                 "pg_publication_tables WHERE pubname = 'cdc_relay_outbox' "
                                 "ORDER BY 1, 2").fetchall()
    assert ("ops", "signals") in published
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
        "--capture", "public.items", "--capture-prefix", topic_prefix,
        "--signal-table", "ops.signals"))
    try:
        done = run_cli("snapshot", "--dsn", db, "--signal-table", "ops.signals", "public.items")
        assert done.returncode == 0, done.stderr
        topic = f"{topic_prefix}.public.items"
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len([m for m in ms if m.topic == topic]) >= 5,
                                    timeout=60)
        assert sorted(json.loads(m.value)["after"]["id"] for m in got if m.value) == [1, 2, 3, 4, 5]
        config = tmp_path / "relay.toml"
        config.write_text('[capture]\nsignal_table = "ops.signals"\n')
        wanted = [{"table": "public.items", "state": "done", "rows_done": 5}]
        wait_for(lambda: _progress(db, "--config", str(config)) == wanted, timeout=30,
                 message="status reading the progress in ops")
        assert _progress(db) == []  # without the option: public's, where there is none
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.kill()


def test_signal_table_without_capture_is_one_line(db: str) -> None:
    result = run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--signal-table", "ops.s")
    assert result.returncode == 2, result.stderr
    assert "need --capture" in result.stderr and "Traceback" not in result.stderr
