"""``init --capture --no-outbox`` and ``init --capture-truncate``: init installs only what
capturing needs, and a publication that publishes truncates from init on, so a TRUNCATE
written before the first ``run`` is streamed (docs/table-cdc.md)."""

from __future__ import annotations

import json

import psycopg

from tests.integration.wal_support import start_relay
from tests.support import KafkaCollector, Msg, run_cli


def _ops(messages: list[Msg], topic: str) -> list[str | None]:
    return [None if m.value is None else json.loads(m.value)["op"]
            for m in messages if m.topic == topic]


def test_init_capture_no_outbox_installs_the_publication_and_slot_only_and_truncates_stream(
        db: str, broker: object, topic_prefix: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text)")
    init = ("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
            "--capture", "public.items", "--no-outbox", "--capture-truncate")
    result = run_cli(*init)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("outbox: none (--no-outbox")
    assert "publication cdc_relay_outbox: created" in lines
    assert "replication slot cdc_relay (pgoutput): created" in lines
    assert ("captured tables (1, inserts, updates, deletes and truncates published): "
            "public.items") in lines
    with psycopg.connect(db, autocommit=True) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables"
                              " WHERE table_schema = 'public' ORDER BY 1").fetchall()
        published = conn.execute(
            "SELECT array_agg(tablename::text), bool_and(p.pubtruncate)"
            " FROM pg_publication_tables t JOIN pg_publication p USING (pubname)"
            " WHERE pubname = 'cdc_relay_outbox'").fetchone()
        # written before the first run: streamed, the truncate included
        conn.execute("INSERT INTO items VALUES (1, 'a')")
        conn.execute("TRUNCATE items")
        conn.execute("INSERT INTO items VALUES (2, 'b')")
    # the relay's bookkeeping (the slot's record, the incremental snapshots' signal and
    # progress tables), no outbox table, no migrations table
    assert [t[0] for t in tables] == ["cdc_relay_incremental", "cdc_relay_signal",
                                      "cdc_relay_slots", "items"]
    assert published is not None and sorted(published[0]) == ["cdc_relay_signal", "items"]
    assert published[1] is True
    again = run_cli(*init)
    assert again.returncode == 0, again.stderr
    assert "publication cdc_relay_outbox: existed" in again.stdout.splitlines()
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    with start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
            "--capture", "public.items", "--capture-prefix", topic_prefix, "--no-outbox",
            "--capture-truncate")) as relay:
        topic = f"{topic_prefix}.public.items"
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len(_ops(ms, topic)) >= 3, timeout=60)
        assert relay.stop() == 0, relay.stderr
    assert _ops(got, topic) == ["c", "t", "c"]


def test_init_no_outbox_or_capture_truncate_without_capture_is_one_line(db: str) -> None:
    for flag in ("--no-outbox", "--capture-truncate"):
        result = run_cli("init", "--dsn", db, "--slot", "cdc_relay", flag)
        assert result.returncode == 2, result.stderr
        assert "need --capture" in result.stderr and "Traceback" not in result.stderr
