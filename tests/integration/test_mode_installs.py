"""Each mode installs only what it uses; two-phase commit with WAL mode's defaults."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from cdc_relay.app.init import init_database
from cdc_relay.config import OutboxConfig
from cdc_relay.local.broker import Broker
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.wal_support import start_relay
from tests.support import CliProcess, KafkaCollector, run_cli, wait_for


def _count(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _triggers(dsn: str) -> int:
    return _count(dsn, "SELECT count(*) FROM pg_trigger WHERE tgrelid = "
                       "'outbox_events'::regclass AND NOT tgisinternal")


def _slots(dsn: str) -> int:
    return _count(dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_relay'")


def test_init_installs_what_the_mode_uses_and_upgrades_an_old_install(
        db: str, broker: Broker, topic_prefix: str) -> None:
    # What init of earlier versions left: the NOTIFY trigger and a wal2json slot.
    init_database(db, OutboxConfig(), slot="cdc_relay", plugin="wal2json", notify_trigger=True,
                  mode="wal")
    assert (_triggers(db), _slots(db)) == (1, 1)
    with psycopg.connect(db, autocommit=True) as conn:  # the slot falls behind
        conn.execute("CREATE TABLE filler AS SELECT g, repeat('x', 500) AS pad "
                     "FROM generate_series(1, 40000) AS g")

    doctor = run_cli("doctor", "--dsn", db)
    assert doctor.returncode == 1, doctor.stdout  # the inactive slot retains WAL
    assert "PREPARE TRANSACTION" in doctor.stdout  # the trigger, reported as a cost
    assert "no relay streams from it, and it retains" in doctor.stdout
    doctor = run_cli("doctor", "--dsn", db, "--mode", "poll")
    assert doctor.returncode == 1
    assert "replication slot cdc_relay (wal2json) is inactive and retains" in doctor.stdout

    wal = run_cli("init", "--dsn", db)  # the default: WAL mode
    assert wal.returncode == 0, wal.stderr
    # No --plugin: the existing slot's plugin is used (its default was wal2json), and said.
    assert "exists with plugin 'wal2json': using it" in wal.stdout
    assert "notify trigger: dropped" in wal.stdout
    assert (_triggers(db), _slots(db)) == (0, 1)

    poll = run_cli("init", "--dsn", db, "--mode", "poll")
    assert poll.returncode == 0, poll.stderr
    assert "notify trigger: created" in poll.stdout
    assert "warning: replication slot cdc_relay (wal2json) is inactive" in poll.stdout
    assert (_triggers(db), _slots(db)) == (1, 1)  # a slot is never dropped behind one's back

    with CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap,
                     "--topic-pattern", topic_prefix + ".{aggregate_type}"]) as poller:
        wait_for(lambda: "polling mode does not read it" in poller.stderr or not poller.running(),
                 timeout=30, message="the poller's warning")
        assert "replication slot cdc_relay (wal2json) is inactive" in poller.stderr
        assert poller.stop() == 0, poller.stderr

    both = run_cli("init", "--dsn", db, "--mode", "wal", "--no-slot")
    assert both.returncode == 2
    assert both.stderr.count("\n") == 1 and "--no-slot" in both.stderr


@pytest.fixture
def prepared_cluster() -> Iterator[PostgresCluster]:
    """A cluster of this test's own that allows prepared transactions."""
    cluster = PostgresCluster(settings={"max_prepared_transactions": "10"})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


def _prepare(dsn: str, gid: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        event_id = str(emit(conn, "order", gid, "Prepared", {"gid": gid}))
        conn.execute(f"PREPARE TRANSACTION '{gid}'")
    return event_id


def _finish(dsn: str, gid: str, commit: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"{'COMMIT' if commit else 'ROLLBACK'} PREPARED '{gid}'")


def test_two_phase_commit_works_with_the_default_init(
        prepared_cluster: PostgresCluster, broker: Broker, topic_prefix: str) -> None:
    dsn = prepared_cluster.dsn()
    result = run_cli("init", "--dsn", dsn)
    assert result.returncode == 0, result.stderr
    run = uuid.uuid4().hex[:6]
    committed = _prepare(dsn, f"a{run}")
    rolled_back = _prepare(dsn, f"b{run}")
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        with start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput") as relay:
            _finish(dsn, f"a{run}", commit=True)
            _finish(dsn, f"b{run}", commit=False)
            across_restart = _prepare(dsn, f"c{run}")
            collector.collect(until=lambda ms: any(m.headers.get("id") == committed.encode()
                                                   for m in ms), timeout=60)
            assert relay.stop(signal.SIGTERM) == 0, relay.stderr
        with start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput") as relay:
            _finish(dsn, f"c{run}", commit=True)
            with psycopg.connect(dsn) as conn:
                sentinel = str(emit(conn, "order", "last", "Sentinel", {}))
                conn.commit()
            messages = collector.collect(until=lambda ms: {across_restart, sentinel} <= {
                m.headers.get("id", b"").decode() for m in ms}, timeout=60)
            assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    ids = [m.headers["id"].decode() for m in messages]
    assert {committed, across_restart, sentinel} <= set(ids)
    assert rolled_back not in ids
