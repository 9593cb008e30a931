"""``--sink rabbitmq`` end to end against the machine's RabbitMQ: both modes, crashes, cuts, dead letters."""

from __future__ import annotations

import signal
from collections.abc import Callable

import orjson
import psycopg

from tests.integration.sinks.support import (
    RabbitReader,
    crash_with_replays,
    poll_rows,
    start_poller,
    write_continuously,
)
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.wal_support import (
    Expected,
    assert_contract,
    init_db,
    start_relay,
    write_workload,
)
from tests.support import Msg, wait_for


def rabbit_args(prefix: str, *extra: str) -> tuple[str, ...]:
    return ("--sink", "rabbitmq", "--sink-config", f"exchange={prefix}",
            "--sink-config", f"dead_letter_queue={prefix}.dlq", *extra)


def ids_of(messages: list[Msg]) -> set[str]:
    return {m.headers["id"].decode() for m in messages}


def test_wal_mode_publishes_the_contract_in_order_and_dead_letters_the_unroutable(
        db: str, rabbitmq_url: str, rabbit: RabbitReader, topic_prefix: str) -> None:
    init_db(db)
    # No queue for invoices: every invoice event is unroutable (returned) -> dead letter.
    rabbit.bind(f"{topic_prefix}.q", f"{topic_prefix}.order", f"{topic_prefix}.customer")
    relay = start_relay(db, rabbitmq_url, topic_prefix, extra=rabbit_args(topic_prefix))
    with relay:
        expected = write_workload(db, transactions=30, seed=17, max_events=12)
        routed = Expected([e for e in expected.events if e["aggregate_type"] != "invoice"],
                          expected.rolled_back)
        unroutable = {str(e["id"]) for e in expected.events if e["aggregate_type"] == "invoice"}
        assert routed.events and unroutable
        got = rabbit.collect(f"{topic_prefix}.q", until=lambda ms: ids_of(ms) >= routed.ids)
        dead = rabbit.collect(f"{topic_prefix}.dlq", until=lambda ms: ids_of(ms) >= unroutable)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(got, routed, topic_prefix)
    by_id = {str(e["id"]): e for e in expected.events}
    for m in got:
        assert m.headers["_message_id"] == m.headers["id"]
        assert m.headers["_type"] == m.headers["event_type"]
        assert m.headers["_content_type"] == b"application/json"
        assert m.headers["_delivery_mode"] == b"2"  # persistent
        assert m.key == str(by_id[m.headers["id"].decode()]["aggregate_id"]).encode()
    assert ids_of(dead) == unroutable  # and nothing else: routed events never dead-letter
    for m in dead:
        assert m.topic == f"{topic_prefix}.dlq"
        assert b"unroutable" in m.headers["error"]
        assert m.headers["original_topic"] == f"{topic_prefix}.invoice".encode()
        assert orjson.loads(m.value or b"") == by_id[m.headers["id"].decode()]["payload"]
    assert "sink rabbitmq" in relay.stderr


def test_poll_mode_publishes_in_order_and_dead_letters_the_unroutable(
        db: str, rabbitmq_url: str, rabbit: RabbitReader, topic_prefix: str) -> None:
    init_db(db)
    rabbit.bind(f"{topic_prefix}.q", f"{topic_prefix}.order", f"{topic_prefix}.customer")
    expected = write_workload(db, transactions=25, seed=5, max_events=12)
    routed = Expected([e for e in expected.events if e["aggregate_type"] != "invoice"],
                      expected.rolled_back)
    unroutable = {str(e["id"]) for e in expected.events if e["aggregate_type"] == "invoice"}
    with start_poller(db, rabbitmq_url, topic_prefix, *rabbit_args(topic_prefix),
                      "--max-attempts", "1") as poller:
        got = rabbit.collect(f"{topic_prefix}.q", until=lambda ms: ids_of(ms) >= routed.ids)
        dead = rabbit.collect(f"{topic_prefix}.dlq", until=lambda ms: ids_of(ms) >= unroutable)
        wait_for(lambda: len(poll_rows(db, "processed_at IS NOT NULL OR dead_lettered_at IS NOT "
                                           "NULL")) == len(expected.events),
                 timeout=30, message="every row settled")
        assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    assert_contract(got, routed, topic_prefix)
    assert ids_of(dead) == unroutable
    dead_rows = {row[0] for row in poll_rows(db, "dead_lettered_at IS NOT NULL")}
    assert dead_rows == unroutable
    assert all("unroutable" in str(row[4]) for row in poll_rows(db, "dead_lettered_at IS NOT NULL"))


def test_kill_9_mid_stream_loses_nothing_and_replays_carry_the_same_message_id(
        db: str, rabbitmq_url: str, rabbit: RabbitReader, topic_prefix: str) -> None:
    init_db(db)
    queue = f"{topic_prefix}.q"
    rabbit.bind(queue, f"{topic_prefix}.#")
    relay = start_relay(db, rabbitmq_url, topic_prefix, extra=rabbit_args(topic_prefix))
    with relay, write_continuously(db) as writer:
        wait_for(lambda: rabbit.collect(queue, until=lambda ms: len(ms) > 50), timeout=60)
        replayed = crash_with_replays(relay, db, writer.expected,
                                      lambda: ids_of(rabbit.available(queue)))
    expected = writer.expected
    with start_relay(db, rabbitmq_url, topic_prefix, extra=rabbit_args(topic_prefix)) as again:
        got = rabbit.collect(queue, until=lambda ms: ids_of(ms) >= expected.ids)
        assert again.stop(signal.SIGTERM) == 0, again.stderr
    assert_contract(got, expected, topic_prefix)
    copies: dict[str, list[Msg]] = {}
    for m in got:
        copies.setdefault(m.headers["id"].decode(), []).append(m)
    for event_id in replayed:
        assert len(copies[event_id]) >= 2, f"event {event_id} was not replayed"
    for event_copies in copies.values():
        first = event_copies[0]
        for copy in event_copies[1:]:
            assert copy.headers == first.headers and copy.value == first.value


def test_a_cut_connection_is_waited_out_and_nothing_is_lost(
        db: str, rabbit: RabbitReader, topic_prefix: str,
        proxy_factory: Callable[[int], TcpProxy]) -> None:
    init_db(db)
    queue = f"{topic_prefix}.q"
    rabbit.bind(queue, f"{topic_prefix}.#")
    proxy = proxy_factory(rabbit.port)
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F"
    with start_relay(db, url, topic_prefix, extra=rabbit_args(topic_prefix)) as relay:
        before = write_workload(db, transactions=5, seed=1, rollback_every=0)
        rabbit.collect(queue, until=lambda ms: ids_of(ms) >= before.ids)
        proxy.cut()
        after = write_workload(db, transactions=5, seed=2, rollback_every=0)
        wait_for(lambda: "broker not reachable" in relay.stderr, timeout=60,
                 message="the relay noticing the cut")
        proxy.restore()
        got = rabbit.collect(queue, until=lambda ms: ids_of(ms) >= before.ids | after.ids)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert "rabbitmq sink generation 1 failed" in relay.stderr
    assert "guest:guest" not in relay.stderr  # the password never reaches a log line
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT count(*) FROM outbox_events").fetchone()
    assert row is not None and row[0] == len(before.events) + len(after.events)
    assert ids_of(got) == before.ids | after.ids
