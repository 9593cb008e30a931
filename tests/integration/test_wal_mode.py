"""WAL mode end to end against the real PostgreSQL and broker."""

from __future__ import annotations

import signal
import threading
from typing import Any

import psycopg
import pytest
from psycopg import pq

from cdc_relay.config import ReplicationConfig, TableRef
from cdc_relay.decoding.wal2json import plugin_options as wal2json_options
from cdc_relay.local.broker import Broker
from cdc_relay.model import Lsn
from cdc_relay.outbox import emit
from cdc_relay.wal.stream.replication import ReplicationStream
from tests.integration.wal_support import (
    Expected,
    assert_contract,
    collect_ids,
    confirmed_flush,
    current_wal,
    init_db,
    start_relay,
    write_workload,
)
from tests.support import KafkaCollector, wait_for

PLUGINS = ["wal2json", "pgoutput"]


@pytest.mark.parametrize("plugin", PLUGINS)
def test_committed_events_arrive_with_the_contract_and_rolled_back_ones_never(
    db: str, broker: Broker, topic_prefix: str, plugin: str
) -> None:
    init_db(db, plugin=plugin)
    expected = write_workload(db, transactions=40, seed=1)  # a backlog before the relay starts
    with start_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        write_workload(db, transactions=40, seed=2, expected=expected)  # and live traffic
        collect_ids(collector, topic_prefix, expected.ids)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
        # A clean stop confirmed everything that was acked: a new relay replays nothing.
        with start_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as again:
            with psycopg.connect(db) as conn:
                sentinel = str(emit(conn, "order", "sentinel", "OrderChanged", {"last": True}))
                conn.commit()
            expected.events.append({"id": sentinel, "aggregate_type": "order",
                                    "aggregate_id": "sentinel", "payload": {"last": True}})
            messages = collect_ids(collector, topic_prefix, {sentinel})
            assert again.stop() == 0, again.stderr
    assert_contract(messages, expected, topic_prefix)
    ids = [m.headers["id"] for m in messages]
    assert len(ids) == len(set(ids)), "events were published twice after a clean stop"


def test_only_outbox_inserts_are_published(db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, total numeric)")
        conn.execute("INSERT INTO orders (total) VALUES (12.5)")
        first = emit(conn, "order", "o-1", "OrderPlaced", {"total": 12.5})
        conn.commit()
        conn.execute("UPDATE outbox_events SET processed_at = now() WHERE id = %s", (first,))
        conn.execute("DELETE FROM outbox_events WHERE id = %s", (first,))
        conn.commit()
        last = emit(conn, "order", "o-1", "OrderShipped", {"by": "post"})
        conn.commit()
    with start_relay(db, broker.bootstrap, topic_prefix) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = collector.collect(until=lambda ms: any(
            m.headers.get("id") == str(last).encode() for m in ms), timeout=60)
        relay.stop()
    assert [m.headers["event_type"] for m in messages] == [b"OrderPlaced", b"OrderShipped"]
    assert {m.topic for m in messages} == {f"{topic_prefix}.order"}


def test_illegal_topic_is_dead_lettered_and_later_events_still_flow(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db)
    with psycopg.connect(db) as conn:
        bad = emit(conn, "no spaces/allowed", "a-1", "Odd", {"x": 1})
        conn.commit()
        good = emit(conn, "order", "o-2", "OrderPlaced", {"x": 2})
        conn.commit()
    with start_relay(db, broker.bootstrap, topic_prefix) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = collector.collect(until=lambda ms: {m.headers.get("id") for m in ms} >= {
            str(bad).encode(), str(good).encode()}, timeout=60)
        assert relay.stop() == 0
    dead = [m for m in messages if m.topic == f"{topic_prefix}.dlq"]
    assert [m.headers["id"] for m in dead] == [str(bad).encode()]
    assert b"topic" in dead[0].headers["error"].lower()
    assert dead[0].value == b'{"x": 1}'
    assert any(m.topic == f"{topic_prefix}.order" for m in messages)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_idle_slot_advances_while_only_other_tables_are_written(
    db: str, broker: Broker, topic_prefix: str, plugin: str
) -> None:
    init_db(db, plugin=plugin)
    with start_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as relay:
        with psycopg.connect(db) as conn:
            conn.execute("CREATE TABLE other (id serial PRIMARY KEY, filler text)")
            for _ in range(20):
                conn.execute("INSERT INTO other (filler) SELECT repeat('x', 500)"
                             " FROM generate_series(1, 2000)")
                conn.commit()
        target = current_wal(db)
        wait_for(lambda: confirmed_flush(db) >= target, timeout=30,
                 message="slot confirmed_flush_lsn reaching the WAL position")
        assert relay.running(), relay.stderr
        relay.stop()


@pytest.mark.parametrize("plugin", PLUGINS)
def test_kill_9_mid_stream_loses_nothing_and_only_unconfirmed_events_repeat(
    db: str, broker: Broker, topic_prefix: str, plugin: str
) -> None:
    init_db(db, plugin=plugin)
    expected = Expected()
    writer = threading.Thread(target=write_workload, args=(db,), kwargs=dict(
        transactions=150, seed=3, expected=expected, max_events=20))
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        relay = start_relay(db, broker.bootstrap, topic_prefix, plugin=plugin)
        writer.start()
        collector.collect(count=300, timeout=60)  # mid-stream
        relay.kill()
        confirmed_at_kill = confirmed_flush(db)
        writer.join()
        with start_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as again:
            messages = collect_ids(collector, topic_prefix, expected.ids)
            assert again.stop() == 0
    assert_contract(messages, expected, topic_prefix)
    counts: dict[str, int] = {}
    for m in messages:
        key = m.headers["id"].decode()
        counts[key] = counts.get(key, 0) + 1
    for event_id, count in counts.items():
        if count > 1:
            # Only events of transactions that were not confirmed may come again.
            assert expected.commit_lsn[event_id] > confirmed_at_kill, event_id


def test_wal2json_and_pgoutput_publish_identical_messages_for_the_same_rows(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    init_db(db, slot="via_wal2json", plugin="wal2json")
    init_db(db, slot="via_pgoutput", plugin="pgoutput")
    expected = write_workload(db, transactions=30, seed=5)
    results = {}
    for plugin in PLUGINS:
        prefix = f"{topic_prefix}{plugin[:3]}"
        with start_relay(db, broker.bootstrap, prefix, slot=f"via_{plugin}", plugin=plugin) as relay, \
                KafkaCollector(broker.bootstrap, prefix) as collector:
            messages = collect_ids(collector, prefix, expected.ids)
            assert relay.stop() == 0, relay.stderr
        assert_contract(messages, expected, prefix)
        results[plugin] = sorted(
            (m.topic.split(".", 1)[1], m.key, m.value, tuple(sorted(m.headers.items())), m.timestamp)
            for m in messages)
    assert results["wal2json"] == results["pgoutput"]


@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_pure_python_path_publishes_what_the_compiled_one_does(
    db: str, broker: Broker, topic_prefix: str, plugin: str
) -> None:
    # --pure-python reads (ReplicationStream.read), decodes, routes and takes delivery
    # reports in Python; every other test here runs the compiled paths.
    init_db(db, slot="compiled", plugin=plugin)
    init_db(db, slot="pure", plugin=plugin)
    expected = write_workload(db, transactions=30, seed=6)
    results = {}
    for path, extra in (("compiled", ()), ("pure", ("--pure-python",))):
        prefix = f"{topic_prefix}{path[:3]}"
        with start_relay(db, broker.bootstrap, prefix, slot=path, plugin=plugin,
                         extra=extra) as relay, \
                KafkaCollector(broker.bootstrap, prefix) as collector:
            messages = collect_ids(collector, prefix, expected.ids)
            assert relay.stop() == 0, relay.stderr
        assert ("pure Python throughout (--pure-python" in relay.stderr) == (path == "pure")
        assert_contract(messages, expected, prefix)
        results[path] = sorted(
            (m.topic.split(".", 1)[1], m.key, m.value, tuple(sorted(m.headers.items())), m.timestamp)
            for m in messages)
    assert results["pure"] == results["compiled"]


def _previous_holder_confirms(db: str, target: int) -> type[ReplicationStream]:
    class PreviousHolderConfirmsMeanwhile(ReplicationStream):
        def _start_replication(self, pgconn: pq.abc.PGconn) -> None:
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("SELECT pg_replication_slot_advance('cdc_relay', %s::pg_lsn)",
                             (str(Lsn(target)),))
            super()._start_replication(pgconn)

    return PreviousHolderConfirmsMeanwhile


def _open_while_the_previous_holder_confirms(
        db: str, seed: int, handed: psycopg.Connection[Any] | None = None) -> None:
    """Open a stream on a slot whose previous holder confirms more between our slot check
    and START_REPLICATION: the resume point must be what the slot has once it is ours."""
    init_db(db)
    expected = write_workload(db, transactions=3, seed=seed, rollback_every=0)
    assert expected.events
    target = current_wal(db)
    before = confirmed_flush(db)
    stream = _previous_holder_confirms(db, target)(
        ReplicationConfig(dsn=db, plugin="wal2json"), wal2json_options(TableRef()), position_conn=handed)
    try:
        start = stream.open()
    finally:
        stream.close()
    assert before < target
    assert start == confirmed_flush(db) >= target


def test_a_standby_resumes_from_the_position_the_slot_holds_when_it_gets_it(db: str) -> None:
    """The previous holder may confirm more between our slot check and START_REPLICATION;
    the resume point must be what the slot has once it is ours, never the older reading."""
    _open_while_the_previous_holder_confirms(db, seed=91)


def test_the_first_stream_reads_the_held_position_on_the_handed_over_connection(
        db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """cdc-relay run hands the start-up checks' connection to the first stream: the held
    position is read on it (after START_REPLICATION, as always), then it is closed, and
    the stream opens no connection but the replication one."""
    handed = psycopg.connect(db, autocommit=True)
    opened: list[str] = []
    real_connect = psycopg.connect

    def counting_connect(conninfo: str, **kwargs: Any) -> psycopg.Connection[Any]:
        opened.append(conninfo)
        return real_connect(conninfo, **kwargs)

    monkeypatch.setattr("cdc_relay.wal.stream.replication.open_connection", counting_connect)
    _open_while_the_previous_holder_confirms(db, seed=92, handed=handed)
    assert handed.closed
    ours = [conninfo for conninfo in opened if "application_name=cdc-relay" in conninfo]
    assert len(ours) == 1 and "replication=database" in ours[0]


def test_a_handed_over_connection_that_broke_meanwhile_is_replaced(db: str) -> None:
    handed = psycopg.connect(db, autocommit=True)
    with psycopg.connect(db, autocommit=True) as admin:  # the server ends that session
        admin.execute("SELECT pg_terminate_backend(%s)", (handed.info.backend_pid,))
    _open_while_the_previous_holder_confirms(db, seed=93, handed=handed)
    assert handed.closed
