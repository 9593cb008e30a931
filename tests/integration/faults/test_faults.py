"""Fault injection: WAL mode survives every fault without losing an event.

Each test checks that every committed event is eventually in Kafka and that no
rolled-back one is. Services that a test pauses, kills or restarts are its own.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import free_port
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.wal_support import (
    Expected,
    assert_a_fresh_relay_delivers,
    assert_contract,
    collect_ids,
    confirmed_flush,
    init_db,
    start_relay,
    write_workload,
)
from tests.support import KafkaCollector, scrape, wait_for

pytestmark = pytest.mark.faults


def wait_for_inflight(port: int, count: int) -> None:
    """Wait until the relay has read ``count`` events and awaits their acks."""
    wait_for(lambda: scrape(port).get("cdc_relay_inflight_events") == count, timeout=30,
             message=f"{count} events in flight")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_broker_stall_longer_than_wal_sender_timeout_keeps_the_stream_alive(
    short_timeout_cluster: PostgresCluster, private_broker: Broker, topic_prefix: str
) -> None:
    dsn = short_timeout_cluster.dsn()
    init_db(dsn)
    expected = write_workload(dsn, transactions=10, seed=11)
    # Messages must outlive the stall here, so the relay waits instead of replaying.
    with start_relay(dsn, private_broker.bootstrap, topic_prefix,
                     extra=("--message-timeout", "60s")) as relay:
        with KafkaCollector(private_broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        private_broker.pause()
        try:
            write_workload(dsn, transactions=30, seed=12, expected=expected)
            time.sleep(12)  # > 2 x wal_sender_timeout with the broker frozen
        finally:
            private_broker.resume()
        with KafkaCollector(private_broker.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, expected.ids)
        assert relay.stop() == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    server_log = short_timeout_cluster.log_path.read_text(errors="replace")
    assert "replication timeout" not in server_log


def test_broker_restart_losing_producer_state_is_survived_without_a_manual_restart(
    db: str, private_tansu: Broker, topic_prefix: str
) -> None:
    """Tansu is memory-only: its restart forgets every topic and producer id, so the relay's
    idempotent producer fails fatally and is replaced, replaying from the slot."""
    init_db(db)
    with start_relay(db, private_tansu.bootstrap, topic_prefix,
                     extra=("--message-timeout", "5s")) as relay:
        before = write_workload(db, transactions=10, seed=21)
        with KafkaCollector(private_tansu.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, before.ids)
        private_tansu.restart()  # memory-only: topics and producer ids are gone
        after = write_workload(db, transactions=20, seed=22)
        with KafkaCollector(private_tansu.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, after.ids, timeout=120)
        assert relay.running(), relay.stderr
        assert relay.stop() == 0
    assert_contract(messages, after, topic_prefix)


def test_apache_kafka_killed_and_started_again_is_waited_out_and_nothing_is_lost(
    db: str, private_broker: ApacheKafka, topic_prefix: str
) -> None:
    """A crashed broker (SIGKILL) that comes back with its log: events written while it was
    down time out in the producer (a new one replays them from the slot) or wait, and every
    one arrives after it is back, in order per aggregate."""
    init_db(db)
    expected = Expected()
    with start_relay(db, private_broker.bootstrap, topic_prefix,
                     extra=("--message-timeout", "5s")) as relay:
        write_workload(db, transactions=10, seed=21, expected=expected)
        with KafkaCollector(private_broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        private_broker.kill()
        write_workload(db, transactions=20, seed=22, expected=expected)  # while it is down
        private_broker.start()
        write_workload(db, transactions=10, seed=23, expected=expected)
        with KafkaCollector(private_broker.bootstrap, topic_prefix) as collector:
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=120)
        assert relay.running(), relay.stderr
        assert relay.stop() == 0
    assert_contract(messages, expected, topic_prefix)


@pytest.mark.parametrize("how", ["restart", "kill"])
def test_postgres_restart_or_crash_is_survived_by_reconnecting(
    private_pg_cluster: PostgresCluster, broker: Broker, topic_prefix: str, how: str
) -> None:
    dsn = private_pg_cluster.dsn()
    init_db(dsn)
    with start_relay(dsn, broker.bootstrap, topic_prefix) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        expected = write_workload(dsn, transactions=15, seed=31)
        collect_ids(collector, topic_prefix, expected.ids)
        if how == "restart":
            private_pg_cluster.restart("fast")
        else:
            private_pg_cluster.kill()
            private_pg_cluster.start()
        write_workload(dsn, transactions=15, seed=32, expected=expected)
        messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
        assert relay.running(), relay.stderr
        assert "reconnecting" in relay.stderr
        assert relay.stop() == 0
    assert_contract(messages, expected, topic_prefix)


def test_standby_relay_waits_on_a_busy_slot_and_takes_over(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        active = start_relay(db, broker.bootstrap, topic_prefix)
        first = write_workload(db, transactions=5, seed=41)
        collect_ids(collector, topic_prefix, first.ids)
        with start_relay(db, broker.bootstrap, topic_prefix, wait=False) as standby:
            wait_for(lambda: "standing by" in standby.stderr, timeout=30,
                     message="the standby reporting a busy slot")
            assert standby.running()
            active.kill()
            expected = write_workload(db, transactions=10, seed=42, expected=first)
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
            assert standby.stop() == 0
    assert_contract(messages, expected, topic_prefix)


@pytest.mark.slow  # a 100,000-event transaction
def test_one_transaction_of_100k_events_streams_with_bounded_memory(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        conn.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)"
            " SELECT 'bulk', 'b-' || (i % 97), 'BulkLoaded',"
            " jsonb_build_object('i', i, 'pad', repeat('x', 120))"
            " FROM generate_series(1, 100000) AS i")
        conn.commit()
    with start_relay(db, broker.bootstrap, topic_prefix,
                     extra=("--max-inflight", "20000")) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = collector.collect(until=lambda ms: len({m.headers["id"] for m in ms}) >= 100_000,
                                     timeout=240)
        wait_for(lambda: confirmed_flush(db) > 0 and relay.running(), timeout=10)
        peak = _peak_rss_mb(relay.proc.pid)
        assert relay.stop() == 0
    assert len({m.headers["id"] for m in messages}) == 100_000
    print(f"peak relay RSS for one 100k-event transaction: {peak:.0f} MB")
    assert peak < 300, f"peak RSS {peak:.0f} MB"


def test_oversized_event_goes_to_the_dead_letter_topic_and_the_stream_continues(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        big = emit(conn, "order", "o-big", "Huge", {"blob": "x" * 2_000_000})
        conn.commit()
        small = emit(conn, "order", "o-small", "Small", {"ok": True})
        conn.commit()
    with start_relay(db, broker.bootstrap, topic_prefix) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = collector.collect(until=lambda ms: {m.headers.get("id") for m in ms} >= {
            str(big).encode(), str(small).encode()}, timeout=60)
        assert relay.stop() == 0
    dead = [m for m in messages if m.topic == f"{topic_prefix}.dlq"]
    assert [m.headers["id"] for m in dead] == [str(big).encode()]
    assert int(dead[0].headers["payload_omitted_bytes"]) > 2_000_000
    assert [m.headers["id"] for m in messages if m.topic == f"{topic_prefix}.order"] == [
        str(small).encode()]


def test_sigterm_flushes_and_exits_0_and_a_second_signal_exits_at_once(
    db: str, private_broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    with start_relay(db, private_broker.bootstrap, topic_prefix) as relay:
        expected = write_workload(db, transactions=5, seed=51)
        with KafkaCollector(private_broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)
        assert relay.stop(signal.SIGTERM, timeout=30) == 0
    # With the broker frozen the flush cannot finish: the second signal ends it at once.
    port = free_port()
    with start_relay(db, private_broker.bootstrap, topic_prefix,
                     extra=("--message-timeout", "120s", "--metrics-port", str(port))) as relay:
        private_broker.pause()
        try:
            unacked = write_workload(db, transactions=3, seed=52, rollback_every=0)
            wait_for_inflight(port, len(unacked.events))
            relay.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: "SIGTERM: stopping" in relay.stderr, timeout=10,
                     message="the first SIGTERM logged")
            assert relay.running()  # flushing: the acks cannot come
            assert relay.stop(signal.SIGTERM, timeout=10) == 130
        finally:
            private_broker.resume()


@pytest.mark.slow  # waits out a frozen broker
def test_sigterm_with_the_broker_frozen_exits_0_without_confirming_unacked_events(
    db: str, private_broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    port = free_port()
    with start_relay(db, private_broker.bootstrap, topic_prefix,
                     extra=("--message-timeout", "120s", "--metrics-port", str(port))) as relay:
        private_broker.pause()
        try:
            expected = write_workload(db, transactions=5, seed=61, rollback_every=0)
            wait_for_inflight(port, len(expected.events))  # read, waiting for acks
            # Bounded shutdown: the acks never come, the process still exits cleanly.
            assert relay.stop(signal.SIGTERM, timeout=40) == 0, relay.stderr
        finally:
            private_broker.resume()
    assert_a_fresh_relay_delivers(db, private_broker.bootstrap, topic_prefix, expected)


@pytest.mark.slow  # kills and restarts the relay again and again
def test_repeated_kill_9_during_continuous_writes_loses_nothing(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    expected = Expected()
    done = threading.Event()

    def writer() -> None:
        seed = 100
        while not done.is_set():
            write_workload(db, transactions=5, seed=seed, expected=expected, max_events=10)
            seed += 1

    rng = random.Random(7)
    thread = threading.Thread(target=writer)
    thread.start()
    kills: list[int] = []
    try:
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            for _ in range(10):
                relay = start_relay(db, broker.bootstrap, topic_prefix)
                time.sleep(rng.uniform(0.2, 1.5))
                relay.kill()
                kills.append(confirmed_flush(db))
            done.set()
            thread.join()
            with start_relay(db, broker.bootstrap, topic_prefix) as last:
                messages = collect_ids(collector, topic_prefix, expected.ids, timeout=120)
                assert last.stop() == 0
    finally:
        done.set()
        thread.join()
    assert_contract(messages, expected, topic_prefix)
    counts: dict[str, int] = {}
    for m in messages:
        counts[m.headers["id"].decode()] = counts.get(m.headers["id"].decode(), 0) + 1
    # An event confirmed before the first kill was never replayed.
    for event_id, lsn in expected.commit_lsn.items():
        if lsn <= kills[0]:
            assert counts[event_id] == 1, event_id
