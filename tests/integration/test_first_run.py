"""The first run on a stock server: ``init`` and ``run`` with no plugin flag publish.

A stock PostgreSQL 15 with only ``wal_level = logical`` keeps Debian's default
``output_plugin_libraries`` (pgoutput, test_decoding: no wal2json), so the default plugin
must be pgoutput; an init asked for wal2json there says what it applied and what not.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import free_port
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.support import CliProcess, KafkaCollector, run_cli, wait_for


@pytest.fixture
def stock_cluster() -> Iterator[PostgresCluster]:
    """A cluster of this test's own with the server's own output_plugin_libraries."""
    cluster = PostgresCluster(stock_plugins=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


def _allowed_plugins(cluster: PostgresCluster) -> str | None:
    known = cluster.execute(
        "SELECT count(*) FROM pg_settings WHERE name = 'output_plugin_libraries'")
    return cluster.execute("SHOW output_plugin_libraries") if known == "1" else None


@pytest.mark.slow
def test_init_and_run_with_no_plugin_flag_publish_on_a_stock_server(
        stock_cluster: PostgresCluster, broker: Broker, topic_prefix: str) -> None:
    allowed = _allowed_plugins(stock_cluster)
    assert allowed is None or "wal2json" not in allowed  # the stock allow-list
    dsn = stock_cluster.dsn()
    init = run_cli("init", "--dsn", dsn)
    assert init.returncode == 0, init.stderr
    assert "replication slot cdc_relay (pgoutput): created" in init.stdout
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector, CliProcess(
            ["run", "--dsn", dsn, "--brokers", broker.bootstrap,
             "--topic-pattern", topic_prefix + ".{aggregate_type}"]) as relay:
        wait_for(lambda: "streaming from slot" in relay.stderr or not relay.running(),
                 timeout=60, message="the relay streaming")
        assert relay.running(), relay.stderr
        with psycopg.connect(dsn, autocommit=True) as conn:
            event_id = emit(conn, "order", "o-1", "Created", {"n": 1})
        messages = collector.collect(count=1, timeout=60)
        assert relay.stop() == 0, relay.stderr
    assert messages[0].headers["id"] == str(event_id).encode()
    assert messages[0].topic == f"{topic_prefix}.order"
    assert "plugin pgoutput" in relay.stderr


def test_init_asked_for_a_plugin_the_server_refuses_says_what_it_applied(
        stock_cluster: PostgresCluster) -> None:
    allowed = _allowed_plugins(stock_cluster)
    if allowed is None:
        pytest.skip("this PostgreSQL has no output_plugin_libraries setting")
    result = run_cli("init", "--dsn", stock_cluster.dsn(), "--plugin", "wal2json")
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "init applied the outbox schema" in result.stderr
    assert "but NOT WAL mode's replication slot 'cdc_relay' (wal2json)" in result.stderr
    assert "--plugin pgoutput" in result.stderr
    # The schema part is there: polling mode can use the table as it is.
    assert stock_cluster.execute("SELECT to_regclass('public.outbox_events') IS NOT NULL") == "t"


def test_polling_without_the_notify_trigger_warns_with_the_fix(
        db: str, broker: Broker, topic_prefix: str) -> None:
    assert run_cli("init", "--dsn", db, "--plugin", "pgoutput").returncode == 0  # WAL mode
    with CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap,
                     "--topic-pattern", topic_prefix + ".{aggregate_type}"]) as poller:
        wait_for(lambda: "polling mode: table" in poller.stderr or not poller.running(),
                 timeout=30, message="the poller started")
        assert poller.stop() == 0, poller.stderr
    assert "has no NOTIFY trigger" in poller.stderr
    assert "Fix: cdc-relay init --mode poll" in poller.stderr
    # With the trigger (or --no-notify) there is nothing to warn about.
    assert run_cli("init", "--dsn", db, "--mode", "poll").returncode == 0
    with CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap,
                     "--topic-pattern", topic_prefix + ".{aggregate_type}"]) as poller:
        wait_for(lambda: "polling mode: table" in poller.stderr or not poller.running(),
                 timeout=30, message="the poller started")
        assert poller.stop() == 0, poller.stderr
    assert "NOTIFY trigger" not in poller.stderr


def test_dead_letters_from_a_topic_with_kafka_down_is_one_line() -> None:
    result = run_cli("dead-letters", "list", "--from-topic", "outbox.dead-letters",
                     "--brokers", f"127.0.0.1:{free_port()}")
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # librdkafka's own lines: debug only
    assert "cannot reach Kafka" in result.stderr
