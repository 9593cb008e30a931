"""``run --snapshot initial``: backfill, the cut-over to streaming, crashes, refusals."""

from __future__ import annotations

import os
import signal
from collections import Counter

import orjson
import psycopg
import pytest

from cdc_relay.local.broker import Broker
from tests.integration.backfill_support import (
    SteadyWriter,
    assert_aggregate_order,
    assert_messages_match_rows,
    backfill_state,
    count,
    ids_of,
    init_no_slot,
    insert_rows,
    start_backfilling_relay,
    wait_streaming,
)
from tests.support import KafkaCollector, init_outbox, run_cli, wait_for

PLUGINS = ["wal2json", "pgoutput"]


@pytest.mark.slow  # a 20,000-row backfill
@pytest.mark.parametrize("plugin", PLUGINS)
def test_rows_pending_before_the_slot_and_live_rows_arrive_once_in_aggregate_order(
    db: str, broker: Broker, topic_prefix: str, plugin: str
) -> None:
    init_no_slot(db, "--no-trigger")
    backlog = insert_rows(db, 0, 20_000)
    writer = SteadyWriter(db, 100_000)
    writer.start()  # before, during and after the backfill
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector, \
            start_backfilling_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as relay:
        wait_streaming(relay)
        live_before = len(writer.ids)
        wait_for(lambda: len(writer.ids) > live_before + 50, timeout=30, message="live rows")
        live = writer.finish()
        expected = set(backlog) | set(live)
        messages = collector.collect(until=lambda ms: set(ids_of(ms)) >= expected, timeout=90)
        assert relay.stop() == 0, relay.stderr
    published = ids_of(messages)
    assert len(published) == len(set(published)), "an event was published twice"
    assert set(published) == expected
    assert_aggregate_order(messages)
    assert_messages_match_rows(db, messages, topic_prefix)
    # Both sides of the cut-over carried live rows: the backfill marked the ones committed
    # before the slot's consistent point, streaming (which marks nothing) the rest.
    marked = count(db, "SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL"
                       " AND (payload->>'seq')::int >= 100000")
    assert 0 < marked < len(live)
    status = orjson.loads(run_cli("status", "--dsn", db, "--format", "json").stdout)
    assert status["backfill"]["state"] == "done"
    assert status["backfill"]["rows_done"] == status["backfill"]["rows_total"] >= len(backlog)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_snapshot_initial_on_an_existing_slot_is_refused_and_touches_nothing(
    db: str, broker: Broker, plugin: str
) -> None:
    init_outbox(db, "--plugin", plugin)  # creates the slot
    insert_rows(db, 0, 10)
    result = run_cli("run", "--dsn", db, "--brokers", broker.bootstrap, "--plugin", plugin,
                     "--snapshot", "initial")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "already exists" in lines[-1], result.stderr
    assert "slot drop" in lines[-1] and "--snapshot never" in lines[-1]
    assert backfill_state(db) is None  # no state table was created
    assert count(db, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 10
    doctor = run_cli("doctor", "--dsn", db, "--plugin", plugin, "--format", "json")
    check = next(c for c in orjson.loads(doctor.stdout) if c["name"] == "backfill")
    # the rows are younger than the slot: it streams them (no false "never published")
    assert check["verdict"] == "pass" and "10 newer rows" in check["detail"]


def test_bad_snapshot_input_is_one_line_exit_2_and_touches_nothing(db: str, broker: Broker) -> None:
    with psycopg.connect(db) as conn:  # a Debezium table without the bookkeeping columns
        conn.execute("CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),"
                     " aggregatetype text NOT NULL, aggregateid text NOT NULL,"
                     " type text NOT NULL, payload jsonb, created_at timestamptz DEFAULT now())")
    common = ("--dsn", db, "--brokers", broker.bootstrap)
    cases = {
        "bookkeeping": ("run", *common, "--table", "outbox", "--columns", "debezium",
                        "--snapshot", "initial"),
        "unknown value": ("run", *common, "--snapshot", "sometimes"),
        "polling mode": ("poll", *common, "--snapshot", "initial"),
    }
    for name, args in cases.items():
        result = run_cli(*args)
        assert result.returncode == 2, (name, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (name, result.stderr)
        assert "Traceback" not in result.stderr
    assert "processed_at" in run_cli(*cases["bookkeeping"]).stderr
    assert count(db, "SELECT count(*) FROM pg_replication_slots") == 0
    assert backfill_state(db) is None


@pytest.mark.slow  # a 30,000-row backfill
def test_kill_9_mid_backfill_then_the_same_command_loses_nothing(
    db: str, private_broker: Broker, topic_prefix: str
) -> None:
    plugin = "pgoutput"
    init_no_slot(db)
    backlog = insert_rows(db, 0, 30_000)
    bootstrap = private_broker.bootstrap
    with KafkaCollector(bootstrap, topic_prefix) as collector:
        relay = start_backfilling_relay(db, bootstrap, topic_prefix, plugin=plugin,
                                        extra=("--max-inflight", "1000"))
        wait_for(lambda: count(db, "SELECT count(*) FROM outbox_events"
                                   " WHERE processed_at IS NOT NULL") > 0,
                 timeout=60, interval=0.01, message="the backfill marking rows")
        os.kill(relay.proc.pid, signal.SIGSTOP)  # freeze it mid-backfill, then crash it
        unmarked_at_kill = set(_ids(db, "processed_at IS NULL"))
        relay.kill()
        assert backfill_state(db) == "running"
        status = orjson.loads(run_cli("status", "--dsn", db, "--format", "json").stdout)
        assert status["backfill"]["state"] == "running" and not status["backfill"]["running"]
        assert 0 < status["backfill"]["rows_done"] < len(backlog)
        doctor = orjson.loads(run_cli("doctor", "--dsn", db, "--plugin", plugin,
                                      "--format", "json").stdout)
        check = next(c for c in doctor if c["name"] == "backfill")
        assert check["verdict"] == "warn" and "did not finish" in check["detail"]
        assert 0 < len(unmarked_at_kill) < len(backlog)
        after_kill = insert_rows(db, 200_000, 100, per_txn=10)  # committed after the slot
        with start_backfilling_relay(db, bootstrap, topic_prefix, plugin=plugin) as again:
            wait_streaming(again)
            live = insert_rows(db, 300_000, 100, per_txn=10)
            expected = set(backlog) | set(after_kill) | set(live)
            messages = collector.collect(until=lambda ms: set(ids_of(ms)) >= expected,
                                         timeout=90)
            assert again.stop() == 0, again.stderr
        assert "did not finish" in again.stderr
    published = ids_of(messages)
    assert set(published) == expected
    # Exactly the documented duplicates: rows not yet marked when the relay died, and rows
    # committed after the slot's consistent point (the redo's fresh snapshot sees them too).
    repeated = {i for i, n in Counter(published).items() if n > 1}
    assert repeated <= unmarked_at_kill | set(after_kill)
    assert not repeated & set(live)
    assert_aggregate_order(messages)
    assert backfill_state(db) == "done"


def _ids(dsn: str, where: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(f"SELECT id::text FROM outbox_events WHERE {where}")]


@pytest.mark.slow  # a 20,000-row backfill
def test_a_broker_stall_mid_backfill_resumes_in_the_same_snapshot_with_a_new_producer(
    db: str, private_broker: Broker, topic_prefix: str
) -> None:
    init_no_slot(db)
    backlog = insert_rows(db, 0, 20_000)
    bootstrap = private_broker.bootstrap
    with KafkaCollector(bootstrap, topic_prefix) as collector, start_backfilling_relay(
            db, bootstrap, topic_prefix, extra=("--message-timeout", "2s",
                                                "--max-inflight", "1000")) as relay:
        wait_for(lambda: count(db, "SELECT count(*) FROM outbox_events"
                                   " WHERE processed_at IS NOT NULL") > 0,
                 timeout=60, interval=0.01, message="the backfill marking rows")
        private_broker.pause()
        try:
            wait_for(lambda: "resuming the backfill at row" in relay.stderr, timeout=60,
                     message="the backfill giving up on the stalled producer")
        finally:
            private_broker.resume()
        wait_streaming(relay)
        messages = collector.collect(until=lambda ms: set(ids_of(ms)) >= set(backlog),
                                     timeout=90)
        assert relay.stop() == 0, relay.stderr
    assert "did not finish" not in relay.stderr  # resumed in place, not redone
    assert set(ids_of(messages)) == set(backlog)
    assert_aggregate_order(messages)
    assert backfill_state(db) == "done"
    assert count(db, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_partitioned_outbox_is_backfilled_from_every_partition(
    db: str, broker: Broker, topic_prefix: str, plugin: str
) -> None:
    from tests.integration.test_partitioned_outbox import insert, make_outbox

    make_outbox(db, [1, 2, 3])
    init_no_slot(db, "--no-trigger")
    backlog = insert(db, [1, 2, 3], 50)
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector, \
            start_backfilling_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as relay:
        wait_streaming(relay)
        live = insert(db, [2, 3], 20)
        messages = collector.collect(until=lambda ms: set(ids_of(ms)) >= backlog | live,
                                     timeout=60)
        assert relay.stop() == 0, relay.stderr
    published = ids_of(messages)
    assert set(published) == backlog | live
    assert len(published) == len(set(published))
    assert "150 pending rows" in relay.stderr


def test_backfilled_and_streamed_events_carry_header_columns_alike(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_no_slot(db, "--no-trigger")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("ALTER TABLE outbox_events ADD COLUMN tenant text")
    backlog = insert_rows(db, 0, 30)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE outbox_events SET tenant = 'acme'")
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector, \
            start_backfilling_relay(db, broker.bootstrap, topic_prefix,
                                    extra=("--header", "tenant:tenant-id")) as relay:
        wait_streaming(relay)
        with psycopg.connect(db) as conn:
            live = [row[0] for row in conn.execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, tenant)"
                " SELECT 'order', 'o-live', 'Placed', jsonb_build_object('seq', g), 'acme'"
                " FROM generate_series(1, 5) AS g RETURNING id::text")]
        expected = set(backlog) | set(live)
        messages = collector.collect(until=lambda ms: set(ids_of(ms)) >= expected, timeout=60)
        assert relay.stop() == 0, relay.stderr
    assert set(ids_of(messages)) == expected
    assert {m.headers.get("tenant-id") for m in messages} == {b"acme"}, "both sides carry it"


def test_doctor_counts_only_rows_older_than_the_slot_as_never_published(db: str) -> None:
    """WAL mode never sets processed_at: rows written after the slot was made are the slot's
    to publish, not a backlog nobody published."""
    init_outbox(db, "--no-slot")
    insert_rows(db, 0, 3)  # before the slot: really never published
    init_outbox(db, "--plugin", "pgoutput")  # creates (and records) the slot
    insert_rows(db, 3, 5)
    doctor = run_cli("doctor", "--dsn", db, "--plugin", "pgoutput", "--format", "json")
    check = next(c for c in orjson.loads(doctor.stdout) if c["name"] == "backfill")
    assert check["verdict"] == "warn", check
    assert check["detail"].startswith("3 rows older than slot cdc_relay have processed_at NULL")
    assert "5 newer rows keep processed_at NULL" in check["detail"]
