"""A time-partitioned outbox loses nothing, in both plugins and in polling mode.

Rows go to several partitions; a partition is created and dropped before the relay
reads its rows, one is dropped while the relay streams, one is created while it streams.
A table with the outbox's columns that is not a partition stays unpublished.
"""

from __future__ import annotations

import re
import signal
import uuid

import psycopg
import pytest

from cdc_relay.local.broker import Broker
from tests.integration.wal_support import start_relay
from tests.support import CliProcess, KafkaCollector, init_outbox, run_cli, wait_for

PARTITIONED_OUTBOX = """
CREATE TABLE outbox_events (
    id UUID NOT NULL DEFAULT gen_random_uuid(),
    aggregate_type VARCHAR(100) NOT NULL,
    aggregate_id VARCHAR(100) NOT NULL,
    event_type VARCHAR(100) NOT NULL,
    payload JSONB NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at)
"""


def _month(month: int) -> tuple[str, str]:
    return f"2026-{month:02d}-01", f"2026-{month + 1:02d}-01"


def create_partition(dsn: str, month: int) -> None:
    start, end = _month(month)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE outbox_events_{month:02d} PARTITION OF outbox_events "
                     f"FOR VALUES FROM ('{start}') TO ('{end}')")


def insert(dsn: str, months: list[int], per_month: int, table: str = "outbox_events") -> set[str]:
    """One transaction: ``per_month`` events in each month's partition; their ids."""
    ids: set[str] = set()
    with psycopg.connect(dsn) as conn:
        for month in months:
            for n in range(per_month):
                event_id = str(uuid.uuid4())
                conn.execute(
                    f"INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload,"
                    " created_at) VALUES (%s, 'order', %s, 'OrderPlaced', %s::jsonb, %s)",
                    (event_id, f"o-{month}", f'{{"n": {n}}}', f"2026-{month:02d}-10"))
                ids.add(event_id)
        conn.commit()
    return ids


def make_outbox(dsn: str, months: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(PARTITIONED_OUTBOX)
        # Same columns, not a partition: its rows are not the outbox's.
        conn.execute("CREATE TABLE lookalike (LIKE outbox_events)")
    for month in months:
        create_partition(dsn, month)


def _ids(collector: KafkaCollector, wanted: set[str]) -> set[str]:
    messages = collector.collect(
        until=lambda ms: wanted <= {m.headers.get("id", b"").decode() for m in ms}, timeout=90)
    return {m.headers["id"].decode() for m in messages}


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_wal_mode_relays_every_partition_including_dropped_and_new_ones(
        db: str, broker: Broker, topic_prefix: str, plugin: str) -> None:
    make_outbox(db, [1, 2, 3])
    init_outbox(db, "--plugin", plugin)
    expected = insert(db, [1, 2, 3], 5)
    # A partition created, filled and dropped before the relay reads its rows.
    create_partition(db, 4)
    expected |= insert(db, [4], 5)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DROP TABLE outbox_events_04")
    stray = insert(db, [1], 3, table="lookalike")
    with start_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        expected |= insert(db, [1, 2, 3], 5)
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("DROP TABLE outbox_events_01")  # mid-stream: cleanup by DROP
            conn.execute("ALTER TABLE outbox_events DETACH PARTITION outbox_events_02")
        create_partition(db, 5)  # mid-stream: next month's partition
        expected |= insert(db, [3, 5], 5)
        seen = _ids(collector, expected)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert expected <= seen
    assert not (stray & seen), "rows of a table that is not a partition were published"
    if plugin == "wal2json":  # decided by name, with the catalog of today
        assert "public.outbox_events_04, which no longer exists" in relay.stderr, relay.stderr
        assert "public.lookalike has the outbox's columns but is not a partition" in relay.stderr
    doctor = run_cli("doctor", "--dsn", db, "--plugin", plugin)
    assert "partitioned, 2 partition(s)" in doctor.stdout, doctor.stdout


def test_an_existing_publication_of_a_partitioned_outbox_is_fixed_up(db: str) -> None:
    make_outbox(db, [1])
    with psycopg.connect(db, autocommit=True) as conn:  # as earlier versions created it
        conn.execute("CREATE PUBLICATION cdc_relay_outbox FOR TABLE outbox_events"
                     " WITH (publish = 'insert')")
    before = run_cli("doctor", "--dsn", db, "--plugin", "pgoutput")
    assert "publish_via_partition_root = true" in before.stdout, before.stdout
    result = run_cli("init", "--dsn", db, "--plugin", "pgoutput")
    assert result.returncode == 0, result.stderr  # not "already member of publication"
    assert "publication cdc_relay_outbox: updated" in result.stdout
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT pubviaroot FROM pg_publication").fetchone()
        tables = conn.execute("SELECT tablename FROM pg_publication_tables").fetchall()
    assert row == (True,) and tables == [("outbox_events",)]
    again = run_cli("init", "--dsn", db, "--plugin", "pgoutput")
    assert "publication cdc_relay_outbox: existed" in again.stdout


def test_polling_mode_relays_a_partitioned_outbox(db: str, broker: Broker, topic_prefix: str) -> None:
    make_outbox(db, [1, 2])
    result = run_cli("init", "--dsn", db, "--mode", "poll")
    assert result.returncode == 0, result.stderr
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = "
                           "'outbox_events'::regclass AND NOT tgisinternal").fetchone()
        assert row is not None and row[0] == 1
        index = conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = "
                             "'outbox_events_01' AND indexdef LIKE '%%processed_at IS NULL%%'").fetchone()
        assert index is not None and index[0] == 1  # the pending index reaches the partitions
    expected = insert(db, [1, 2], 20)
    with CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap, "--interval", "200ms",
                     "--topic-pattern", topic_prefix + ".{aggregate_type}",
                     "--dead-letter-topic", topic_prefix + ".dlq", "--batch-size", "7",
                     "--strict-order"]) as poller, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        create_partition(db, 3)
        expected |= insert(db, [2, 3], 20)
        seen = _ids(collector, expected)

        def all_processed() -> bool:
            with psycopg.connect(db, autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM outbox_events "
                                   "WHERE processed_at IS NULL").fetchone()
            return row is not None and row[0] == 0

        wait_for(all_processed, timeout=30, message="every row marked processed")
        assert poller.stop() == 0, poller.stderr
    assert expected <= seen
    status = run_cli("status", "--dsn", db)
    assert status.returncode == 0, status.stderr
    assert re.search(r"partitioned\s+3 partitions", status.stdout), status.stdout
