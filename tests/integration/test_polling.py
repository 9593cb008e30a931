"""Polling mode end to end: real PostgreSQL, real broker, ``cdc-relay poll`` processes.

Assertions are about state - which rows are processed, how many attempts they used,
what reached Kafka and in which order - never about how long something took. Timeouts
only bound how long a test waits for a state.
"""

from __future__ import annotations

import random
import signal
import uuid
from collections import defaultdict
from collections.abc import Iterator

import orjson
import psycopg
import pytest

from cdc_relay.local.broker import Broker
from cdc_relay.outbox import emit
from tests.support import CliProcess, KafkaCollector, Msg, init_outbox, run_cli, wait_for


def init_db(dsn: str) -> None:
    init_outbox(dsn, "--no-slot")


def start_poller(dsn: str, bootstrap: str, prefix: str, *extra: str,
                 pattern: str = "{aggregate_type}") -> CliProcess:
    return CliProcess(["poll", "--dsn", dsn, "--brokers", bootstrap,
                       "--topic-pattern", f"{prefix}.{pattern}", "--message-timeout", "10s",
                       "--dead-letter-topic", f"{prefix}.dead-letters",
                       "--interval", "200ms", *extra])


def insert(dsn: str, count: int, *, aggregates: int = 5, per_txn: int = 10,
           aggregate_type: str = "order", start: int = 0) -> list[str]:
    """``count`` events in transactions of ``per_txn``; payload {"seq": n}; returns ids."""
    ids = []
    with psycopg.connect(dsn) as conn:
        for n in range(start, start + count):
            ids.append(str(emit(conn, aggregate_type, f"a-{n % aggregates}", "Changed",
                                {"seq": n})))
            if (n + 1) % per_txn == 0:
                conn.commit()
        conn.commit()
    return ids


def rows(dsn: str, where: str = "TRUE") -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT id::text, attempts, processed_at IS NOT NULL, dead_lettered_at IS NOT NULL,"
            f" last_error FROM outbox_events WHERE {where} ORDER BY created_at").fetchall()


def processed_count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL").fetchone()
        assert row is not None
        return int(row[0])


def published_ids(messages: list[Msg]) -> list[str]:
    return [m.headers["id"].decode() for m in messages]


@pytest.fixture
def collector(broker: Broker, topic_prefix: str) -> Iterator[KafkaCollector]:
    with KafkaCollector(broker.bootstrap, topic_prefix) as kafka:
        yield kafka


def collect_ids(kafka: KafkaCollector, ids: set[str], timeout: float = 60) -> list[Msg]:
    return kafka.collect(until=lambda ms: ids <= set(published_ids(ms)), timeout=timeout)


# ------------------------------------------------------------------------------------

def test_events_are_published_with_the_contract_and_marked_processed(
        db: str, broker: Broker, topic_prefix: str, collector: KafkaCollector) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        first = str(emit(conn, "order", "o-1", "OrderPlaced", {"total": 12.5, "b": [1, 2]}))
        conn.commit()
        payload_text = conn.execute("SELECT payload::text FROM outbox_events").fetchone()
    with start_poller(db, broker.bootstrap, topic_prefix) as poller:
        [message] = collect_ids(collector, {first})
        assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    assert payload_text is not None
    assert message.value == payload_text[0].encode()  # jsonb's text: what WAL mode sends
    assert (message.topic, message.key) == (f"{topic_prefix}.order", b"o-1")
    assert message.headers == {"id": first.encode(), "event_type": b"OrderPlaced",
                               "aggregate_type": b"order"}
    assert rows(db) == [(first, 0, True, False, None)]


@pytest.mark.slow
def test_three_pollers_one_killed_mid_run_lose_nothing(
        db: str, broker: Broker, topic_prefix: str, collector: KafkaCollector) -> None:
    init_db(db)
    ids = set(insert(db, 3000, aggregates=40, per_txn=25))
    pollers = [start_poller(db, broker.bootstrap, topic_prefix, "--batch-size", "50",
                            "--workers", "2") for _ in range(3)]
    try:
        wait_for(lambda: processed_count(db) >= 300, timeout=60, message="first batches")
        assert pollers[0].kill() == -signal.SIGKILL
        ids |= set(insert(db, 1000, aggregates=40, per_txn=25, start=3000))  # live traffic
        messages = collect_ids(collector, ids, timeout=120)
        wait_for(lambda: processed_count(db) == len(ids), timeout=60, message="all processed")
        for poller in pollers[1:]:
            assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    finally:
        for poller in pollers:
            poller.kill()
    assert set(published_ids(messages)) == ids
    assert {r[1] for r in rows(db)} == {0}  # nobody's fault: no attempt counted
    # A killed poller's open batch is published again (at least once); nothing else is.
    duplicates = len(messages) - len(set(published_ids(messages)))
    assert duplicates <= 2 * 50


@pytest.mark.slow  # waits out a broker outage
@pytest.mark.faults
def test_a_broker_outage_burns_no_attempts_and_marks_nothing_unacked(
        db: str, private_broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    before = set(insert(db, 20))
    with start_poller(db, private_broker.bootstrap, topic_prefix, "--message-timeout", "2s",
                      "--max-attempts", "2", "--backoff-base", "50ms") as poller, \
            KafkaCollector(private_broker.bootstrap, topic_prefix) as kafka:
        collect_ids(kafka, before)
        private_broker.pause()
        try:
            during = set(insert(db, 30, start=20))
            wait_for(lambda: "broker-wide failure" in poller.stderr, timeout=60,
                     message="the poller noticed the outage")
            wait_for(lambda: poller.stderr.count("not claiming events") >= 2, timeout=60,
                     message="the poller waiting for the broker")
            pending = rows(db, "processed_at IS NULL")
            assert {r[0] for r in pending} == during  # nothing unacked is processed
            assert {r[1] for r in pending} == {0}  # and the outage cost no attempt
        finally:
            private_broker.resume()
        collect_ids(kafka, during, timeout=90)
        wait_for(lambda: processed_count(db) == 50, timeout=60, message="all processed")
        assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    assert {(r[1], r[3]) for r in rows(db)} == {(0, False)}


@pytest.mark.slow  # waits out an unreachable broker
def test_a_poller_that_cannot_reach_any_broker_claims_nothing(
        db: str, broker: Broker, topic_prefix: str, collector: KafkaCollector) -> None:
    init_db(db)
    ids = set(insert(db, 10))
    closed_port = f"127.0.0.1:{_free_port()}"
    with start_poller(db, closed_port, topic_prefix) as blind:
        wait_for(lambda: blind.stderr.count("not claiming events") >= 2, timeout=60,
                 message="the blind poller waiting")
        assert rows(db, "processed_at IS NOT NULL OR attempts > 0") == []
        assert blind.stop(signal.SIGTERM) == 0, blind.stderr
    with start_poller(db, broker.bootstrap, topic_prefix) as poller:
        collect_ids(collector, ids)
        wait_for(lambda: processed_count(db) == 10, timeout=30, message="all processed")
        poller.stop()
    assert {r[1] for r in rows(db)} == {0}


def _free_port() -> int:
    from cdc_relay.local.helpers import free_port
    return free_port()


def test_a_poison_event_becomes_a_dead_letter_and_retry_puts_it_back(
        db: str, broker: Broker, topic_prefix: str, collector: KafkaCollector) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        poison = str(emit(conn, "no spaces allowed", "p-1", "Odd", {"x": 1}))
        conn.commit()
    healthy = set(insert(db, 30))
    with start_poller(db, broker.bootstrap, topic_prefix, "--max-attempts", "3",
                      "--backoff-base", "50ms", "--backoff-max", "200ms") as poller:
        collect_ids(collector, healthy)
        wait_for(lambda: rows(db, f"id = '{poison}' AND dead_lettered_at IS NOT NULL"),
                 timeout=60, message="the poison event dead-lettered")
        later = set(insert(db, 10, start=30))  # healthy events keep flowing
        collect_ids(collector, later)
        assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    dlq = f"{topic_prefix}.dead-letters"
    copies = collector.collect(until=lambda ms: any(m.topic == dlq for m in ms), timeout=30)
    [copy] = [m for m in copies if m.topic == dlq]
    assert copy.headers["id"] == poison.encode() and b"topic" in copy.headers["error"]
    [(_, attempts, processed, dead, error)] = rows(db, f"id = '{poison}'")
    assert (attempts, processed, dead) == (3, False, True)
    assert "no spaces allowed" in str(error) and "topic" in str(error)

    table = run_cli("dead-letters", "list", "--dsn", db)
    assert table.returncode == 0, table.stderr
    assert poison in table.stdout and "no spaces allowed/p-1" in table.stdout
    listed = run_cli("dead-letters", "list", "--dsn", db, "--format", "json")
    [entry] = orjson.loads(listed.stdout)
    assert (entry["id"], entry["attempts"], entry["event_type"]) == (poison, 3, "Odd")
    assert entry["dead_lettered_at"] and "topic" in entry["last_error"]

    retried = run_cli("dead-letters", "retry", "--dsn", db, "--id", poison,
                      "--id", str(uuid.uuid4()))
    assert retried.returncode == 0, retried.stderr
    assert "requeued 1" in retried.stdout and "not dead letters" in retried.stdout
    assert rows(db, f"id = '{poison}'")[0][1:4] == (0, False, False)
    assert orjson.loads(run_cli("dead-letters", "list", "--dsn", db, "--format",
                                "json").stdout) == []
    # Requeued: a poller whose pattern makes a legal topic of it publishes it.
    with start_poller(db, broker.bootstrap, topic_prefix, pattern="{event_type}") as fixed:
        collect_ids(collector, {poison})
        wait_for(lambda: rows(db, f"id = '{poison}' AND processed_at IS NOT NULL"),
                 timeout=30, message="the requeued event processed")
        fixed.stop()


def test_notify_wakes_the_poller_long_before_its_interval(
        db: str, broker: Broker, topic_prefix: str, collector: KafkaCollector) -> None:
    init_db(db)
    with start_poller(db, broker.bootstrap, topic_prefix, "--interval", "30s") as poller:
        first = set(insert(db, 1))
        collect_ids(collector, first, timeout=20)  # the start-up claim or a NOTIFY
        wait_for(lambda: processed_count(db) == 1, timeout=20, message="first processed")
        for n in range(1, 4):  # each only reachable through NOTIFY: the tick is 30 s away
            collect_ids(collector, set(insert(db, 1, start=n)), timeout=10)
        # dead-letters retry sends a NOTIFY too (requeued rows fire no trigger)
        with psycopg.connect(db) as conn:
            conn.execute("UPDATE outbox_events SET processed_at = NULL, attempts = 3,"
                         " dead_lettered_at = now() WHERE payload->>'seq' = '0'")
        before = len(collector.messages)
        assert run_cli("dead-letters", "retry", "--dsn", db, "--all").returncode == 0
        collector.collect(count=before + 1, timeout=10)
        assert poller.stop(signal.SIGTERM) == 0, poller.stderr


@pytest.mark.slow
def test_strict_order_keeps_each_aggregate_in_order_across_two_pollers(
        db: str, broker: Broker, topic_prefix: str, collector: KafkaCollector) -> None:
    init_db(db)
    rng = random.Random(4)
    expected: dict[str, list[int]] = defaultdict(list)
    poison = ""
    with psycopg.connect(db) as conn:
        for n in range(1500):
            aggregate = f"a-{rng.randrange(12)}"
            event_type = "bad type" if n == 200 else "Changed"
            event_id = str(emit(conn, "order", aggregate, event_type, {"seq": n}))
            if n == 200:
                poison = event_id  # blocks a-?'s later events until it is dead-lettered
            else:
                expected[aggregate].append(n)
            if rng.random() < 0.2:
                conn.commit()
        conn.commit()
    extra = ("--strict-order", "--batch-size", "40", "--max-attempts", "2",
             "--backoff-base", "100ms")
    pollers = [start_poller(db, broker.bootstrap, topic_prefix, *extra,
                            pattern="{event_type}") for _ in range(2)]
    try:
        dlq = f"{topic_prefix}.dead-letters"
        messages = [m for m in collector.collect(
            until=lambda ms: sum(m.topic != dlq for m in ms) >= 1499, timeout=120)
            if m.topic != dlq]
        for poller in pollers:
            assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    finally:
        for poller in pollers:
            poller.kill()
    seen: dict[str, list[int]] = defaultdict(list)
    for message in messages:
        seen[message.key.decode() if message.key else ""].append(orjson.loads(message.value)["seq"])
    assert dict(seen) == dict(expected)
    assert rows(db, f"id = '{poison}'")[0][3] is True


def test_cleanup_deletes_only_processed_rows_older_than_the_cutoff(db: str) -> None:
    init_db(db)
    ids = insert(db, 8)
    old_done, new_done, pending, old_dead = ids[:3], ids[3:5], ids[5:7], ids[7:]
    with psycopg.connect(db) as conn:
        conn.execute("UPDATE outbox_events SET processed_at = now() - interval '3 days'"
                     " WHERE id = ANY(%s::uuid[])", (old_done,))
        conn.execute("UPDATE outbox_events SET processed_at = now() - interval '1 hour'"
                     " WHERE id = ANY(%s::uuid[])", (new_done,))
        conn.execute("UPDATE outbox_events SET dead_lettered_at = now() - interval '9 days',"
                     " created_at = now() - interval '9 days' WHERE id = ANY(%s::uuid[])",
                     (old_dead,))
    result = run_cli("cleanup", "--dsn", db, "--older-than", "2d", "--batch", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "deleted 3 processed row(s)"
    assert {r[0] for r in rows(db)} == set(new_done + pending + old_dead)


def test_cleanup_in_wal_mode_deletes_rows_by_age_whatever_processed_at_says(db: str) -> None:
    init_db(db)
    ids = insert(db, 6)
    old, recent, old_dead = ids[:3], ids[3:5], ids[5:]
    with psycopg.connect(db) as conn:
        conn.execute("UPDATE outbox_events SET created_at = now() - interval '3 days'"
                     " WHERE id = ANY(%s::uuid[])", (old,))
        conn.execute("UPDATE outbox_events SET dead_lettered_at = now(),"
                     " created_at = now() - interval '9 days' WHERE id = ANY(%s::uuid[])",
                     (old_dead,))
    result = run_cli("cleanup", "--dsn", db, "--older-than", "2d", "--wal-mode", "--batch", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "deleted 3 row(s)"
    assert {r[0] for r in rows(db)} == set(recent + old_dead)


@pytest.mark.parametrize("args", [
    ("cleanup", "--older-than", "5 parsecs"),
    ("cleanup", "--older-than", "-1d"),
    ("poll", "--brokers", "127.0.0.1:9", "--interval", "soon"),
    ("poll", "--brokers", "127.0.0.1:9", "--backoff-max", "1y"),
    ("dead-letters", "retry"),
    ("dead-letters", "retry", "--all", "--id", "6f0c7ad1-0000-4000-8000-000000000000"),
    ("dead-letters", "retry", "--id", "not-a-uuid"),
])
def test_bad_input_is_one_line_and_exit_2(db: str, args: tuple[str, ...]) -> None:
    result = run_cli(*args, "--dsn", db)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_polling_a_database_without_the_outbox_says_how_to_create_it(db: str) -> None:
    result = run_cli("poll", "--dsn", db, "--brokers", "127.0.0.1:9")
    assert result.returncode == 2, result.stderr
    assert "does not exist" in result.stderr and "cdc-relay init" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_unknown_producer_setting_is_one_line_before_polling_starts(db: str) -> None:
    init_db(db)
    result = run_cli("poll", "--dsn", db, "--brokers", "127.0.0.1:9",
                     "--producer-config", "no.such.setting=1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "no.such.setting" in result.stderr and "--producer-config" in result.stderr


def test_a_debezium_shaped_table_is_polled_by_configuration(
        db: str, broker: Broker, topic_prefix: str, collector: KafkaCollector) -> None:
    from cdc_relay.model import OutboxColumns

    where = ("--table", "sales.dbz_outbox", "--columns", "debezium")
    init_outbox(db, "--no-slot", *where)
    with psycopg.connect(db) as conn:
        event = str(emit(conn, "invoice", "i-9", "InvoiceIssued", {"n": 1},
                         table="sales.dbz_outbox", columns=OutboxColumns.debezium()))
        conn.commit()
    with start_poller(db, broker.bootstrap, topic_prefix, *where) as poller:
        [message] = collect_ids(collector, {event})
        poller.stop()
    assert (message.topic, message.key) == (f"{topic_prefix}.invoice", b"i-9")
    assert message.headers["event_type"] == b"InvoiceIssued"
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT processed_at IS NOT NULL FROM sales.dbz_outbox").fetchone()
    assert row == (True,)
