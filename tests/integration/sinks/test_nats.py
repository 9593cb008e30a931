"""``--sink nats`` end to end against the machine's NATS JetStream: both modes, crashes, cuts, dead letters.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import orjson

from tests.integration.sinks.support import (
    crash_with_replays,
    poll_rows,
    start_poller,
    stream_count,
    stream_messages,
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


def nats_args(stream: str, *extra: str) -> tuple[str, ...]:
    return ("--sink", "nats", "--sink-config", f"stream={stream}", *extra)


def ids_of(messages: list[Msg]) -> set[str]:
    return {m.headers["id"].decode() for m in messages}


def arrived(url: str, stream: str, ids: set[str], subject: str = ">") -> list[Msg]:
    """Wait until every id is in the stream; return the stream's messages."""
    return wait_for(lambda: (lambda ms: ms if ids_of(ms) >= ids else None)(
        stream_messages(url, stream, subject)), timeout=60, interval=0.2,
        message=f"{len(ids)} events in stream {stream}")


def test_wal_mode_publishes_the_contract_in_order_and_dead_letters_subjects_without_a_stream(
        db: str, nats_url: str, nats_stream: str, topic_prefix: str) -> None:
    init_db(db)
    p = topic_prefix
    # The created stream covers orders, customers and dead letters, not invoices.
    args = nats_args(nats_stream, "--sink-config", f"stream_subjects={p}.order,{p}.customer,{p}.dlq")
    with start_relay(db, nats_url, p, extra=args) as relay:
        expected = write_workload(db, transactions=30, seed=23, max_events=12)
        routed = Expected([e for e in expected.events if e["aggregate_type"] != "invoice"],
                          expected.rolled_back)
        unroutable = {str(e["id"]) for e in expected.events if e["aggregate_type"] == "invoice"}
        assert routed.events and unroutable
        everything = arrived(nats_url, nats_stream, routed.ids | unroutable)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    got = [m for m in everything if not m.topic.endswith(".dlq")]
    dead = [m for m in everything if m.topic == f"{p}.dlq"]
    assert_contract(got, routed, p)
    for m in got:
        assert m.headers["Nats-Msg-Id"] == m.headers["id"]
        assert m.key == m.headers["aggregate_id"] and m.timestamp > 0
    by_id = {str(e["id"]): e for e in expected.events}
    assert ids_of(dead) == unroutable
    for m in dead:
        assert b"no JetStream stream covers" in m.headers["error"]
        assert m.headers["original_topic"] == f"{p}.invoice".encode()
        assert orjson.loads(m.value or b"") == by_id[m.headers["id"].decode()]["payload"]
    assert "sink nats" in relay.stderr and f"created JetStream stream {nats_stream}" in relay.stderr


def test_poll_mode_publishes_in_order_through_a_cut_connection_without_burning_attempts(
        db: str, nats_url: str, nats_port: int, nats_stream: str, topic_prefix: str,
        proxy_factory: Callable[[int], TcpProxy]) -> None:
    init_db(db)
    proxy = proxy_factory(nats_port)
    before = write_workload(db, transactions=15, seed=3, max_events=12)
    with start_poller(db, f"nats://127.0.0.1:{proxy.port}", topic_prefix,
                      *nats_args(nats_stream), "--max-attempts", "2") as poller:
        arrived(nats_url, nats_stream, before.ids)
        proxy.cut()
        after = write_workload(db, transactions=15, seed=4, max_events=12, expected=Expected())
        wait_for(lambda: "not claiming events" in poller.stderr, timeout=60,
                 message="the poller waiting for the broker")
        proxy.restore()
        messages = arrived(nats_url, nats_stream, before.ids | after.ids)
        wait_for(lambda: len(poll_rows(db, "processed_at IS NOT NULL"))
                 == len(before.events) + len(after.events), timeout=30, message="all processed")
        assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    both = Expected(before.events + after.events, before.rolled_back | after.rolled_back)
    assert_contract(messages, both, topic_prefix)
    assert len(messages) == len(both.events)  # one copy each: replays were de-duplicated
    assert {row[1] for row in poll_rows(db)} == {0}  # the outage burnt no attempt
    assert "nats sink generation 1 failed" in poller.stderr


def test_kill_9_mid_stream_replays_are_dropped_by_the_duplicate_window(
        db: str, nats_url: str, nats_stream: str, topic_prefix: str) -> None:
    init_db(db)
    args = nats_args(nats_stream)
    relay = start_relay(db, nats_url, topic_prefix, extra=args)
    with relay, write_continuously(db) as writer:
        wait_for(lambda: stream_count(nats_url, nats_stream) > 50, timeout=60)
        replayed = crash_with_replays(relay, db, writer.expected,
                                      lambda: ids_of(stream_messages(nats_url, nats_stream)))
    expected = writer.expected
    with start_relay(db, nats_url, topic_prefix, extra=args) as again:
        messages = arrived(nats_url, nats_stream, expected.ids)
        assert again.stop(signal.SIGTERM) == 0, again.stderr
    assert replayed  # the restart published these again ...
    assert_contract(messages, expected, topic_prefix)
    assert len(messages) == len(expected.ids)  # ... and the stream kept one copy of each
    dropped = [line for line in again.stderr.splitlines() if "duplicate(s) by Nats-Msg-Id" in line]
    assert dropped, again.stderr
    count = int(dropped[-1].split("dropped ")[1].split(" ")[0])
    assert count >= len(replayed)
