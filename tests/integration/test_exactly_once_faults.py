"""``run --exactly-once`` under faults, on Apache Kafka: kill -9, fencing, broker restart, big
and poisoned transactions. A read_committed consumer must end with every committed event
exactly once and no rolled-back one: one that reads when the run is over, and (in the kill
test) one that stays caught up from the start to the end."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import orjson
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg.conninfo import conninfo_to_dict

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.helpers import free_port
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.model import Lsn
from cdc_relay.outbox import emit
from tests.integration.eos_support import (
    READ_COMMITTED,
    assert_exactly_once,
    checkpoints,
    collect_exactly,
    event_ids,
    explain_missing,
    start_eos_relay,
)
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.test_operations import scrape
from tests.integration.wal_support import (
    Expected,
    confirmed_flush,
    current_wal,
    init_db,
    write_workload,
)
from tests.support import CliProcess, KafkaCollector, wait_for


@contextmanager
def repeatedly(write: Callable[[int], None], *, seed: int, pause: float) -> Iterator[None]:
    """``write(seed)``, ``seed`` counting up, in a thread until the block ends."""
    done = threading.Event()

    def writer() -> None:
        next_seed = seed
        while not done.is_set():
            write(next_seed)
            next_seed += 1
            done.wait(pause)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def steady_writes(dsn: str, expected: Expected) -> AbstractContextManager[None]:
    """Transactions of 1..20 events over three topics, some with a business row, every
    tenth rolled back, until the block ends."""
    return repeatedly(lambda seed: write_workload(
        dsn, transactions=10, seed=seed, expected=expected, max_events=20, rollback_every=10),
        seed=100, pause=0.3)


@contextmanager
def caught_up_reader(bootstrap: str, prefix: str) -> Iterator[KafkaCollector]:
    """A read_committed consumer that reads ``prefix``'s topics in a thread of its own from
    now until the block ends: it sees each commit as it happens, aborts included."""
    stop = threading.Event()
    reader = KafkaCollector(bootstrap, prefix, config=READ_COMMITTED)

    def read() -> None:
        while not stop.is_set():
            reader.collect(timeout=0.2)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield reader
    finally:
        stop.set()
        thread.join()
        reader.close()


def _metric(port: int, name: str) -> float:
    return scrape(port).get(name, -1.0)


def read_when_settled(dsn: str, end: int) -> None:
    """Wait until the slot passed ``end`` (only a Kafka commit moves it past events)."""
    wait_for(lambda: confirmed_flush(dsn) >= end, timeout=60, message="the slot past the end")


def _newest_checkpoint(cp_reader: KafkaCollector, read_for: float) -> int:
    found = checkpoints(cp_reader.collect(timeout=read_for))
    return max((cp.lsn for cp in found), default=0)


def _checkpoint_at_start(relay: CliProcess) -> int:
    """The checkpoint the relay read at start-up, after fencing: the newest of its predecessors."""
    found = re.search(r"exactly-once: checkpoint (\S+), slot at", relay.stderr)
    assert found, relay.stderr
    return 0 if found[1] == "none" else int(Lsn.parse(found[1]))


def _wait_kill_point(kind: str, port: int, rng: random.Random, dsn: str, proxy: TcpProxy,
                     relay: CliProcess, cp_reader: KafkaCollector) -> None:
    if kind == "mid-transaction":  # a Kafka transaction is open with events in it
        wait_for(lambda: _metric(port, "cdc_relay_transaction_open_age_seconds") > 0,
                 timeout=20, interval=0.005, message="an open Kafka transaction")
    elif kind == "after-commit":  # committed to Kafka, not yet confirmed to PostgreSQL
        # Status updates stop reaching the walsender (the WAL stream and the Kafka
        # commits go on), so the point lasts until the kill, however prompt the relay is.
        # A checkpoint past every earlier one was committed by this relay.
        earlier = _checkpoint_at_start(relay)
        proxy.pause_requests()
        wait_for(lambda: _newest_checkpoint(cp_reader, 0.02) > max(earlier, confirmed_flush(dsn)),
                 timeout=20, interval=0, message="a checkpoint of this relay ahead of the slot")
    else:
        time.sleep(rng.uniform(0.05, 0.8))  # a random point of the run, not a synchronisation


BEHIND = "committed view of the checkpoint topic is behind"


def kill_at(kind: str, db: str, broker: ApacheKafka, topic_prefix: str, proxy: TcpProxy,
            rng: random.Random, *, plugin: str, extra: tuple[str, ...] = ()) -> tuple[str, bool]:
    """A relay reaching PostgreSQL (``db``) through ``proxy``, killed (-9) at the kill point
    ``kind``: its log, and whether it left the checkpoint ahead of the slot."""
    port = free_port()
    through = db.replace(f"port={conninfo_to_dict(db)['port']}", f"port={proxy.port}")
    relay = start_eos_relay(through, broker.bootstrap, topic_prefix, plugin=plugin, extra=(
        *extra, "--metrics-port", str(port), "--status-interval", "1s", "--txn-interval", "150ms"))
    # A checkpoint reader per relay, opened once it has fenced the one before.
    with KafkaCollector(broker.bootstrap, f"{topic_prefix}.checkpoints",
                        config=READ_COMMITTED) as cp_reader:
        try:
            _wait_kill_point(kind, port, rng, db, proxy, relay, cp_reader)
        finally:
            relay.kill()
            proxy.cut()  # what a pause held back never arrives
            proxy.restore()
            proxy.resume()
        return relay.stderr, _newest_checkpoint(cp_reader, 0.3) > confirmed_flush(db)


def _kill_relays(db: str, broker: ApacheKafka, topic_prefix: str, plugin: str, proxy: TcpProxy,
                 kinds: list[str], expected: Expected, ahead_of_slot: list[str], logs: list[str],
                 rng: random.Random) -> None:
    """A relay per kind of kill point, each killed there (-9) while transactions are written."""
    try:
        with steady_writes(db, expected):
            for kind in kinds:
                log, ahead = kill_at(kind, db, broker, topic_prefix, proxy, rng, plugin=plugin)
                logs.append(log)
                if ahead:
                    ahead_of_slot.append(kind)
    finally:
        proxy.close()


@pytest.mark.slow
@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_kill_9_at_random_points_leaves_every_committed_event_exactly_once(
        db: str, broker: ApacheKafka, topic_prefix: str, pg_cluster: PostgresCluster,
        plugin: str) -> None:
    """Issue 32's scenario: 10 kill -9s under load, then more events through the last relay."""
    init_db(db, plugin=plugin)
    expected = Expected()
    rng = random.Random(14)
    kinds = ["mid-transaction", "after-commit", "random"] * 3 + ["mid-transaction"]
    ahead_of_slot: list[str] = []  # kills that left the checkpoint ahead of the slot (replay must skip)
    logs: list[str] = []
    proxy = TcpProxy(pg_cluster.port)  # the killed relays reach PostgreSQL through it
    with caught_up_reader(broker.bootstrap, topic_prefix) as live:
        _kill_relays(db, broker, topic_prefix, plugin, proxy, kinds, expected, ahead_of_slot, logs, rng)
        with start_eos_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as last:
            write_workload(db, transactions=30, seed=999, expected=expected, max_events=20,
                           rollback_every=10)  # more events, through the last relay only
            read_when_settled(db, current_wal(db))
            assert last.stop() == 0, last.stderr
            logs.append(last.stderr)
        wait_for(lambda: expected.ids <= set(event_ids(list(live.messages))), timeout=60,
                 message="every committed event at the caught-up reader")
        seen_live = list(live.messages)
    with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        messages = collect_exactly(collector, expected, timeout=60)
    assert_exactly_once(seen_live, expected)
    assert len(expected.events) > 300 and expected.rolled_back
    assert_exactly_once(messages, expected)
    print(f"{plugin}: {len(kinds)} kills, {len(ahead_of_slot)} with the checkpoint ahead of the slot"
          f" ({', '.join(sorted(ahead_of_slot))}), "
          f"{len(expected.events)} events committed, {len(expected.rolled_back)} rolled back")
    assert len(ahead_of_slot) >= 1, "no kill landed between a Kafka commit and the slot update"
    assert len({m.topic for m in messages if not m.topic.endswith(".checkpoints")}) == 3
    # Every relay read its checkpoint back both ways at start-up, and none found it hidden.
    assert all("exactly-once: checkpoint " in log and BEHIND not in log for log in logs)


def _slot_pid(dsn: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'cdc_relay'"
                           ).fetchone()
    return None if row is None else row[0]


def test_a_second_relay_fences_the_first_whose_late_writes_never_appear(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    init_db(db)
    port = free_port()
    first = start_eos_relay(db, broker.bootstrap, topic_prefix,
                            extra=("--metrics-port", str(port), "--txn-interval", "2s"))
    try:
        expected = write_workload(db, transactions=5, seed=3, rollback_every=0)
        # Every event is in the broker, inside the first relay's still open transaction.
        wait_for(lambda: _metric(port, "outbox_events_published_total") >= len(expected.events),
                 timeout=20, message="the first relay producing")
        age = _metric(port, "cdc_relay_transaction_open_age_seconds")
        os.kill(first.proc.pid, signal.SIGSTOP)  # a zombie: alive, its transaction open
        stopped_at = time.monotonic()
        assert 0 < age < 2.0, f"the first relay's transaction is not open (age {age})"
        with psycopg.connect(db, autocommit=True) as conn:  # its walsender goes, the slot frees
            conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                         " WHERE slot_name = 'cdc_relay'")
        wait_for(lambda: _slot_pid(db) is None, timeout=20, message="the slot released")
        with start_eos_relay(db, broker.bootstrap, topic_prefix) as second:
            read_when_settled(db, current_wal(db))  # the second relay replayed the first's events
            # Resumed after its --txn-interval, the zombie's first act is to commit (the loop
            # ticks before it reads the stream): that commit must be fenced.
            wait_for(lambda: age + time.monotonic() - stopped_at > 2.5, timeout=10)
            os.kill(first.proc.pid, signal.SIGCONT)
            wait_for(lambda: "fenced" in first.stderr, timeout=30, message="the first relay fenced")
            write_workload(db, transactions=5, seed=4, expected=expected, rollback_every=3)
            read_when_settled(db, current_wal(db))
            with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
                messages = collect_exactly(collector, expected)
            assert first.running(), "the fenced relay should stand by, not exit"
            assert second.stop() == 0, second.stderr
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
        first.kill()
    assert_exactly_once(messages, expected)


def test_a_broker_restart_under_load_is_survived_exactly_once(
        db: str, private_broker: ApacheKafka, topic_prefix: str) -> None:
    """The broker restarts while a Kafka transaction is open."""
    init_db(db)
    expected = Expected()
    port = free_port()
    with start_eos_relay(db, private_broker.bootstrap, topic_prefix, extra=(
            "--metrics-port", str(port), "--txn-interval", "3s")) as relay:
        with steady_writes(db, expected):
            wait_for(lambda: _metric(port, "cdc_relay_transactions_committed_total") >= 1
                     and 0.2 < _metric(port, "cdc_relay_transaction_open_age_seconds") < 2.0,
                     timeout=30, interval=0.01, message="a Kafka transaction open, far from its commit")
            private_broker.restart()
            wait_for(lambda: len(expected.events) > 400, timeout=60, message="more writes")
        try:
            read_when_settled(db, current_wal(db))
        except TimeoutError:
            print(relay.stderr)
            raise
        aborted = _metric(port, "cdc_relay_transactions_aborted_total")
        with KafkaCollector(private_broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            try:
                messages = collect_exactly(collector, expected, timeout=30)
            except TimeoutError:
                print(relay.stderr[-5000:])
                print(explain_missing(private_broker.bootstrap, topic_prefix, expected))
                raise
        assert relay.running(), relay.stderr
        assert relay.stop() == 0, relay.stderr
    assert_exactly_once(messages, expected)
    assert aborted >= 1, "the transaction open across the restart was not aborted and replayed"


BIG_TXN_EVENTS = 100_000


@pytest.mark.slow  # a 100,000-event transaction
def test_one_postgres_transaction_of_100k_events_is_one_atomic_kafka_transaction(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        conn.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)"
            " SELECT 'bulk', 'b-' || (i %% 97), 'BulkLoaded', jsonb_build_object('i', i)"
            " FROM generate_series(1, %s) AS i", (BIG_TXN_EVENTS,))
        conn.commit()
    port = free_port()
    started = time.monotonic()
    with start_eos_relay(db, broker.bootstrap, topic_prefix, extra=(
            "--metrics-port", str(port), "--transaction-timeout", "120s")) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        messages = collector.collect(until=lambda ms: len(ms) >= BIG_TXN_EVENTS + 1, timeout=180)
        elapsed = time.monotonic() - started
        committed = _metric(port, "cdc_relay_transactions_committed_total")
        assert relay.stop() == 0, relay.stderr
    counts = event_ids(messages)
    assert len(counts) == BIG_TXN_EVENTS and max(counts.values()) == 1
    assert committed == 1, "the PostgreSQL transaction was split across Kafka transactions"
    print(f"one {BIG_TXN_EVENTS}-event transaction through Apache Kafka: {elapsed:.1f} s")


def test_poison_events_inside_a_transaction_are_dead_lettered_and_the_rest_arrive_once(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    init_db(db)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # The broker refuses records over 2 kB on this topic; librdkafka's own limit is 1 MB.
    admin.create_topics([NewTopic(f"{topic_prefix}.order", 1, 1,
                                  config={"max.message.bytes": "2000"})])[f"{topic_prefix}.order"].result()
    good: list[str] = []
    with psycopg.connect(db) as conn:
        for i in range(5):
            good.append(str(emit(conn, "order", f"o-{i}", "OrderPlaced", {"i": i})))
        too_big = str(emit(conn, "order", "o-big", "OrderPlaced", {"pad": "x" * 5000}))
        illegal = str(emit(conn, "bad topic!", "x-1", "Bad", {"i": 0}))
        good.append(str(emit(conn, "customer", "c-1", "CustomerSeen", {"i": 9})))
        conn.commit()
        good.append(str(emit(conn, "order", "o-after", "OrderPlaced", {"after": True})))
        conn.commit()
    end = current_wal(db)
    with start_eos_relay(db, broker.bootstrap, topic_prefix) as relay:
        read_when_settled(db, end)  # the aborted attempts are over
        with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            messages = collector.collect(until=lambda ms: len(ms) >= len(good) + 3, timeout=30)
            messages = collector.collect(timeout=1.0)
        assert relay.stop() == 0, relay.stderr
    counts = event_ids(messages)
    assert set(counts) == set(good) and max(counts.values()) == 1
    dead = [m for m in messages if m.topic.endswith(".dlq")]
    assert sorted(m.headers["id"].decode() for m in dead) == sorted([too_big, illegal])
    big = next(m for m in dead if m.headers["id"].decode() == too_big)
    assert b"TOO_LARGE" in big.headers["error"] and big.value == b""
    assert orjson.loads(next(m for m in messages if m.headers.get("id") == good[-1].encode()).value) \
        == {"after": True}


def test_a_split_transaction_killed_mid_way_resumes_after_the_events_in_kafka(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    init_db(db)
    total, split = 20_000, 2_000
    with psycopg.connect(db) as conn:
        conn.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)"
            " SELECT 'bulk', 'b-' || (i %% 31), 'BulkLoaded', jsonb_build_object('i', i)"
            " FROM generate_series(1, %s) AS i", (total,))
        conn.commit()
    end = current_wal(db)
    port = free_port()
    extra = ("--txn-split-events", str(split))
    relay = start_eos_relay(db, broker.bootstrap, topic_prefix,
                            extra=(*extra, "--metrics-port", str(port)))
    try:
        wait_for(lambda: _metric(port, "cdc_relay_transactions_committed_total") >= 2, timeout=60,
                 interval=0.005, message="two split commits")
    finally:
        relay.kill()
    with KafkaCollector(broker.bootstrap, f"{topic_prefix}.checkpoints",
                        config=READ_COMMITTED) as cp_reader:
        last = checkpoints(cp_reader.collect(until=lambda ms: len(ms) >= 2, timeout=20))[-1]
    assert last.partial_commit_lsn is not None and 0 < last.partial_events < total
    with start_eos_relay(db, broker.bootstrap, topic_prefix, extra=extra) as second:
        read_when_settled(db, end)
        assert f"skipping the first {last.partial_events} events" in second.stderr
        assert second.stop() == 0
    with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
        counts = event_ids(collector.collect(until=lambda ms: len(event_ids(ms)) >= total,
                                             timeout=60))
    assert len(counts) == total and max(counts.values()) == 1
