"""WAL mode's loop under trouble, against the real services: a frozen broker at
shutdown with a short ``wal_sender_timeout``, a topic that does not exist yet, and one
stuck event while the server is busy with other tables.

Topics are made "missing" with the producer's ``allow.auto.create.topics=false`` (the
local broker honours it; real Kafka clusters usually have auto-creation off anyway) and a
short ``topic.metadata.propagation.max.ms``, so the client gives up on the topic in
seconds instead of librdkafka's 30.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_relay.local.broker import Broker
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.wal_support import (
    assert_a_fresh_relay_delivers,
    assert_contract,
    collect_ids,
    confirmed_flush,
    current_wal,
    init_db,
    lsn_int,
    start_relay,
    write_workload,
)
from tests.support import KafkaCollector, wait_for

pytestmark = pytest.mark.faults

NO_AUTO_CREATE = ("--producer-config", "allow.auto.create.topics=false")


def _create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in names]).values():
        future.result(timeout=10)


def _sent_everything(dsn: str) -> bool:
    """The walsender has sent the relay all WAL written so far."""
    target = current_wal(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT sent_lsn::text FROM pg_stat_replication"
                           " WHERE application_name = 'cdc-relay'").fetchone()
    return row is not None and row[0] is not None and lsn_int(row[0]) >= target


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.slow  # waits out a frozen broker
def test_sigterm_with_a_frozen_broker_keeps_the_walsender_alive_and_exits_0(
    short_timeout_cluster: PostgresCluster, private_broker: Broker, topic_prefix: str
) -> None:
    dsn = short_timeout_cluster.dsn()
    init_db(dsn)
    with start_relay(dsn, private_broker.bootstrap, topic_prefix,
                     extra=("--message-timeout", "60s")) as relay:
        private_broker.pause()
        try:
            expected = write_workload(dsn, transactions=5, seed=71, rollback_every=0)
            wait_for(lambda: _sent_everything(dsn), timeout=30, message="the relay reading it")
            log_before = short_timeout_cluster.log_path.read_text(errors="replace")
            # The acks never come; shutdown waits for them (bounded), and must keep the
            # walsender (5 s timeout) alive meanwhile. Killed if not out within 30 s.
            code = relay.stop(signal.SIGTERM, timeout=30)
        finally:
            private_broker.resume()
    assert code == 0, relay.stderr
    during = short_timeout_cluster.log_path.read_text(errors="replace")[len(log_before):]
    assert "replication timeout" not in during
    assert "terminating walsender" not in during
    assert "confirmed" in relay.stderr and "unacknowledged" in relay.stderr
    # Nothing unacked was confirmed: a new relay delivers every event.
    assert_a_fresh_relay_delivers(dsn, private_broker.bootstrap, topic_prefix, expected)


def test_a_topic_created_after_its_events_gets_them_all_and_nothing_is_dead_lettered(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    # Every topic but the orders' exists (and the dead-letter topic, to see what reaches it).
    _create_topics(broker.bootstrap, *(f"{topic_prefix}.{name}" for name in
                                       ("customer", "invoice", "dlq")))
    with start_relay(db, broker.bootstrap, topic_prefix, extra=(
            *NO_AUTO_CREATE, "--producer-config", "topic.metadata.propagation.max.ms=500",
    )) as relay, KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        expected = write_workload(db, transactions=20, seed=81)
        # Keep writing while the topic is missing: events then also meet a producer that
        # already knows the topic is missing (produce() itself refuses them).
        done = threading.Event()

        def writer() -> None:
            seed = 82
            while not done.is_set():
                write_workload(db, transactions=3, seed=seed, expected=expected, max_events=10)
                seed += 1

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            wait_for(lambda: relay.stderr.count("resuming from the slot") >= 3, timeout=30,
                     message="the relay retrying the missing topic")
        finally:
            done.set()
            thread.join()
        _create_topics(broker.bootstrap, f"{topic_prefix}.order")
        messages = collect_ids(collector, topic_prefix, expected.ids, timeout=60)
        assert relay.stop() == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    assert not [m for m in messages if m.topic == f"{topic_prefix}.dlq"]
    assert "dead-lettering" not in relay.stderr
    assert "does not exist: create it" in relay.stderr


def test_one_stuck_event_while_other_tables_churn_keeps_memory_flat(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE busy (n int)")
        conn.execute("CREATE PROCEDURE churn(n int) LANGUAGE plpgsql AS $$ BEGIN"
                     " FOR i IN 1..n LOOP INSERT INTO busy VALUES (i); COMMIT; END LOOP; END $$")
    # The event's topic does not exist and the client waits long for it: its delivery
    # is held, so it pins the watermark while 300k other transactions commit.
    with start_relay(db, broker.bootstrap, topic_prefix, extra=(
            *NO_AUTO_CREATE, "--producer-config", "topic.metadata.propagation.max.ms=120000",
            "--message-timeout", "120s")) as relay:
        with psycopg.connect(db) as conn:
            stuck = emit(conn, "order", "o-1", "OrderPlaced", {"stuck": True})
            conn.commit()
        stuck_end = current_wal(db)
        pid = relay.proc.pid
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CALL churn(50000)")
            wait_for(lambda: _sent_everything(db), timeout=60, message="the relay reading")
            rss_warm = _status_kb(pid, "VmRSS")
            conn.execute("CALL churn(250000)")
            wait_for(lambda: _sent_everything(db), timeout=120, message="the relay reading")
            rss_end = _status_kb(pid, "VmRSS")
        assert confirmed_flush(db) < stuck_end, "confirmed past the undelivered event"
        assert relay.running(), relay.stderr
        end = current_wal(db)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            _create_topics(broker.bootstrap, f"{topic_prefix}.order")
            collect_ids(collector, topic_prefix, {str(stuck)})
        wait_for(lambda: confirmed_flush(db) >= end, timeout=30, message="the slot catching up")
        peak = _status_kb(pid, "VmHWM")
        assert relay.stop() == 0
    growth_mb = (rss_end - rss_warm) / 1024
    print(f"stuck event + 300k other transactions: RSS {rss_warm / 1024:.0f} -> "
          f"{rss_end / 1024:.0f} MB, peak {peak / 1024:.0f} MB")
    # One commit-queue entry per transaction would be ~25 MB for these 250k.
    assert growth_mb < 10, f"RSS grew {growth_mb:.0f} MB while one event was stuck"
