"""PostgreSQL 18's idle_replication_slot_timeout against a real server.

The cluster is this module's own PostgreSQL 18 with a 4 s timeout (the setting takes
seconds; 0 is off) and ``checkpoint_timeout = 1h``: PostgreSQL invalidates an idle slot
only at a checkpoint, so nothing happens until the test issues ``CHECKPOINT`` - and the
test waits on the observable conditions (the slot's inactive time, its
``invalidation_reason``), never on a clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc_relay.errors import ExitCode
from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import free_port
from cdc_relay.local.postgres import PostgresCluster
from tests.integration.wal_support import (
    assert_contract,
    collect_ids,
    init_db,
    start_relay,
    write_workload,
)
from tests.support import CliProcess, KafkaCollector, run_cli, scrape, wait_for

TIMEOUT_SECONDS = 4
SETTINGS = {"idle_replication_slot_timeout": f"{TIMEOUT_SECONDS}s", "checkpoint_timeout": "1h",
            "max_wal_size": "1GB"}


@pytest.fixture
def idle_pg(pg18_bin: Path) -> Iterator[str]:
    """A database on a PostgreSQL 18 cluster of the test's own (with the short timeout)."""
    cluster = PostgresCluster(bin_dir=pg18_bin, settings=SETTINGS)
    try:
        cluster.start()
        yield cluster.create_database("app")
    finally:
        cluster.cleanup()


def _slot(dsn: str) -> tuple[float | None, str | None]:
    """(seconds the slot has been inactive, its invalidation_reason)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM now() - inactive_since)::float8,"
                           " invalidation_reason FROM pg_replication_slots"
                           " WHERE slot_name = 'cdc_relay'").fetchone()
    assert row is not None
    return row[0], row[1]


def _inactive_past_half(dsn: str) -> bool:
    inactive, _ = _slot(dsn)
    return inactive is not None and inactive > TIMEOUT_SECONDS / 2


def _invalidate_by_checkpoint(dsn: str) -> None:
    """CHECKPOINT until PostgreSQL invalidates the idle slot (the first after the timeout)."""
    def invalidated() -> bool:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        return _slot(dsn)[1] == "idle_timeout"

    wait_for(invalidated, timeout=60, interval=0.5, message="the slot invalidated by idle_timeout")


def test_doctor_and_status_warn_then_the_loss_names_the_setting_and_recovery_loses_nothing(
        idle_pg: str, broker: Broker, topic_prefix: str) -> None:
    init_db(idle_pg, plugin="pgoutput")
    with start_relay(idle_pg, broker.bootstrap, topic_prefix, plugin="pgoutput") as relay:
        expected = write_workload(idle_pg, transactions=5, seed=61)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        assert relay.stop() == 0, relay.stderr
    write_workload(idle_pg, transactions=5, seed=62, expected=expected)  # not relayed yet

    wait_for(lambda: _inactive_past_half(idle_pg), timeout=30, message="half the budget used")
    doctor = run_cli("doctor", "--dsn", idle_pg, "--plugin", "pgoutput")
    warned = [line for line in doctor.stdout.splitlines() if line.startswith("WARN  idle timeout")]
    assert warned and "idle_replication_slot_timeout" in warned[0], doctor.stdout
    status = run_cli("status", "--dsn", idle_pg)
    assert status.returncode == 0, status.stderr
    assert "WARNING" in status.stdout and "idle_replication_slot_timeout" in status.stdout

    _invalidate_by_checkpoint(idle_pg)
    status = run_cli("status", "--dsn", idle_pg)
    assert "idle_timeout" in status.stdout and "--on-slot-loss recover" in status.stdout
    doctor = run_cli("doctor", "--dsn", idle_pg, "--plugin", "pgoutput")
    assert doctor.returncode == ExitCode.FAILURE
    assert "idle_timeout" in doctor.stdout and "max_slot_wal_keep_size exceeded" not in doctor.stdout

    args = ("run", "--dsn", idle_pg, "--brokers", broker.bootstrap, "--plugin", "pgoutput",
            "--topic-pattern", topic_prefix + ".{aggregate_type}", "--dead-letter-topic",
            topic_prefix + ".dlq", "--status-interval", "200ms")
    refused = run_cli(*args, timeout=90)
    assert refused.returncode == ExitCode.SLOT_LOST, refused.stderr
    assert "idle_replication_slot_timeout" in refused.stderr
    assert "max_slot_wal_keep_size exceeded" not in refused.stderr
    assert "--on-slot-loss recover" in refused.stderr
    with CliProcess([*args, "--on-slot-loss", "recover"]) as recovering, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        try:
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
        except TimeoutError as exc:
            raise AssertionError(recovering.stderr) from exc
        assert recovering.running(), recovering.stderr
    assert_contract(messages, expected, topic_prefix)


def test_the_metrics_show_the_budget_then_the_invalidation_reason(idle_pg: str) -> None:
    init_db(idle_pg, plugin="pgoutput")
    port = free_port()
    # A relay that cannot reach its broker never streams: the slot stays inactive while
    # the relay serves its metrics (the state the budget alert watches for).
    with CliProcess(["run", "--dsn", idle_pg, "--brokers", "127.0.0.1:1", "--plugin",
                     "pgoutput", "--metrics-port", str(port)]) as relay:
        wait_for(lambda: scrape(port).get("cdc_relay_slot_inactive_seconds", 0)
                 > TIMEOUT_SECONDS / 2 or not relay.running(), timeout=60,
                 message="the inactive time past half the timeout")
        assert relay.running(), relay.stderr
        figures = scrape(port)
        assert figures["cdc_relay_slot_idle_timeout_seconds"] == TIMEOUT_SECONDS
        assert figures["cdc_relay_slot_invalidated{reason=idle_timeout}"] == 0
        _invalidate_by_checkpoint(idle_pg)
        wait_for(lambda: scrape(port).get("cdc_relay_slot_invalidated{reason=idle_timeout}") == 1,
                 timeout=60, message="the invalidation reason in the metrics")
        assert scrape(port)["cdc_relay_slot_invalidated{reason=wal_removed}"] == 0
