"""Message shaping end to end: formats, Java partitioning, headers from columns, trace
context and the tableless outbox, against real PostgreSQL and the real broker.

The expected bytes are written out from Debezium's documented behaviour (the outbox
event router: key = aggregate id, value = the jsonb payload as io.debezium.data.Json,
which stays JSON text with ``table.expand.json.payload=false``; JsonConverter with
schemas on for ``debezium-json``), as in tests/unit/test_message_formats.py - no
Debezium runs here.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from cdc_relay.local.broker import Broker
from cdc_relay.outbox import emit, emit_async, emit_message, emit_message_async
from tests.integration.wal_support import init_db, start_relay
from tests.support import CliProcess, KafkaCollector, Msg, init_outbox, run_cli

EVENT_ID = uuid.UUID("4d47e190-0402-4048-bc2c-89dd54343cdc")
MESSAGE_ID = uuid.UUID("4d47e190-0402-4048-bc2c-89dd54343cdd")
PAYLOAD = b'{"note": "gr\xc3\xbc\xc3\x9fe \\"ok\\"", "id": 1, "customerId": 123}'
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SPAN = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0x00F067AA0BA902B7, is_remote=False,
                   trace_flags=TraceFlags(1))
SPAN_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
GOLDEN_PAYLOAD_TEXT = '{"id": 1, "note": "grüße \\"ok\\"", "customerId": 123}'  # jsonb's form
GOLDEN_KEY = b'{"schema":{"type":"string","optional":false},"payload":"1"}'
GOLDEN_VALUE = (
    r'{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Json",'
    r'"version":1},"payload":"{\"id\": 1, \"note\": \"grüße \\\"ok\\\"\", '
    r'\"customerId\": 123}"}'.encode())


def murmur2(data: bytes) -> int:
    """The Java producer's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), 32 bit."""
    m, r, mask = 0x5BD1E995, 24, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    full = len(data) // 4 * 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[full:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_murmur2_matches_the_java_reference_values() -> None:
    # Kafka's UtilsTest.testMurmur2 vectors (signed Java ints, here as unsigned).
    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF
    assert murmur2(b"foobar") == -790332482 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") == -985981536 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-longer-string") == -1486304829 & 0xFFFFFFFF
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971 & 0xFFFFFFFF
    assert murmur2(b"abc") == 479470107


def by_id(messages: list[Msg]) -> dict[str, Msg]:
    return {m.headers["id"].decode(): m for m in messages}


def test_debezium_json_headers_and_trace_context_are_identical_in_both_plugins_and_polling(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db, slot="w", plugin="wal2json")
    init_db(db, slot="p", plugin="pgoutput")
    init_outbox(db, "--no-slot", "--with-trace-context")
    again = run_cli("init", "--dsn", db, "--no-slot", "--with-trace-context")
    assert "schema up to date" in again.stdout, again.stdout + again.stderr
    with psycopg.connect(db) as conn:
        conn.execute("ALTER TABLE outbox_events ADD COLUMN tenant text DEFAULT 'acme'")
        conn.commit()
        emit(conn, "order", "1", "OrderCreated", PAYLOAD, event_id=EVENT_ID, traceparent=TRACEPARENT,
             tracestate="vendor=x")
        with trace.use_span(NonRecordingSpan(SPAN)):
            span_row = str(emit(conn, "order", "1", "OrderShipped", PAYLOAD))
            emit_message(conn, "order", "1", "OrderCreated", PAYLOAD, event_id=MESSAGE_ID)
        conn.commit()
    shaping = ("--message-format", "debezium-json", "--header", "tenant:tenant-id")
    wanted = {str(EVENT_ID), span_row, str(MESSAGE_ID)}
    results = {}
    for name, plugin in (("w", "wal2json"), ("p", "pgoutput")):
        with start_relay(db, broker.bootstrap, f"{topic_prefix}{name}", slot=name, plugin=plugin,
                         extra=shaping) as relay, \
                KafkaCollector(broker.bootstrap, f"{topic_prefix}{name}") as collector:
            results[plugin] = by_id(collector.collect(
                until=lambda ms: wanted <= set(by_id(ms)), timeout=60))
            assert relay.stop() == 0, relay.stderr
    with CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap, "--topic-pattern",
                     f"{topic_prefix}q.{{aggregate_type}}", "--interval", "200ms",
                     *shaping]) as poller, \
            KafkaCollector(broker.bootstrap, f"{topic_prefix}q") as collector:
        results["polling"] = by_id(collector.collect(
            until=lambda ms: {str(EVENT_ID), span_row} <= set(by_id(ms)), timeout=60))
        assert poller.stop() == 0, poller.stderr
    for source, messages in results.items():
        row = messages[str(EVENT_ID)]
        assert (row.key, row.value) == (GOLDEN_KEY, GOLDEN_VALUE), source
        assert row.headers == {"id": str(EVENT_ID).encode(), "event_type": b"OrderCreated",
                               "aggregate_type": b"order", "tenant-id": b"acme",
                               "traceparent": TRACEPARENT.encode(), "tracestate": b"vendor=x"}
        assert messages[span_row].headers["traceparent"] == SPAN_TRACEPARENT.encode(), source
        if source == "polling":  # a logical decoding message has no row to poll
            assert str(MESSAGE_ID) not in messages
            continue
        message = messages[str(MESSAGE_ID)]
        assert (message.key, message.value) == (GOLDEN_KEY, GOLDEN_VALUE), source
        assert message.headers == {"id": str(MESSAGE_ID).encode(), "event_type": b"OrderCreated",
                                   "aggregate_type": b"order",
                                   "traceparent": SPAN_TRACEPARENT.encode()}, source


def test_keys_land_where_the_java_partitioner_puts_their_serialized_bytes(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    topic, partitions = f"{topic_prefix}.order", 6
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # referenced until done
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                            replication_factor=1)])
    futures[topic].result(timeout=30)
    with psycopg.connect(db) as conn:
        conn.execute("ALTER TABLE outbox_events ADD COLUMN shard int")
        conn.commit()
        ids = [str(emit(conn, "order", f"order-{n}", "OrderCreated", {"n": n})) for n in range(40)]
        pinned = conn.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload, shard)"
            " VALUES ('order', 'order-0', 'OrderCreated', '{}', 5) RETURNING id::text").fetchone()
        conn.commit()
    assert pinned is not None
    with start_relay(db, broker.bootstrap, topic_prefix, extra=(
            "--message-format", "debezium-json-schemaless", "--partition-column", "shard")) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = by_id(collector.collect(
            until=lambda ms: {*ids, pinned[0]} <= set(by_id(ms)), timeout=60))
        assert relay.stop() == 0, relay.stderr
    assert messages[pinned[0]].partition == 5
    landed = [messages[i] for i in ids]
    assert [m.key for m in landed] == [f'"order-{n}"'.encode() for n in range(40)]
    assert [m.partition for m in landed] == [java_partition(m.key or b"", partitions)
                                             for m in landed]
    assert len({m.partition for m in landed}) > 1


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_emit_message_events_keep_commit_order_with_rows_and_never_appear_when_rolled_back(
        db: str, broker: Broker, topic_prefix: str, plugin: str) -> None:
    init_db(db, plugin=plugin)
    expected: list[str] = []
    rolled_back: set[str] = set()
    with psycopg.connect(db) as conn:
        for t in range(12):
            batch = []
            for n in range(4):
                write = emit_message if (t + n) % 2 else emit
                batch.append(str(write(conn, "order", "a-1", "Changed", {"t": t, "n": n})))
            if t % 4 == 3:
                conn.rollback()
                rolled_back.update(batch)
            else:
                conn.commit()
                expected.extend(batch)
        conn.autocommit = True
        conn.execute("SELECT pg_logical_emit_message(false, 'cdc-relay', 'not an event')")
        last = str(emit_message(conn, "order", "a-1", "Changed", {"last": True}))
        expected.append(last)
    with start_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        messages = collector.collect(until=lambda ms: last in by_id(ms), timeout=60)
        assert relay.stop() == 0, relay.stderr
    seen = [m.headers["id"].decode() for m in messages]
    assert list(dict.fromkeys(seen)) == expected  # one aggregate: one partition, commit order
    assert not rolled_back & set(seen)
    assert {m.topic for m in messages} == {f"{topic_prefix}.order"}
    assert relay.stderr.count("ignored a non-transactional 'cdc-relay' logical decoding") == 1


@pytest.mark.parametrize("command", ["run", "poll"])
def test_an_unknown_column_is_one_line_and_exit_2_at_start_up(
        db: str, broker: Broker, command: str) -> None:
    init_db(db)
    result = run_cli(command, "--dsn", db, "--brokers", broker.bootstrap, "--header", "tennant",
                     timeout=60)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()[-1:]
    assert "no column 'tennant'" in line
    assert "Traceback" not in result.stderr
    result = run_cli(command, "--dsn", db, "--brokers", broker.bootstrap,
                     "--partition-column", "payload", timeout=60)
    assert result.returncode == 2 and "not an integer type" in result.stderr, result.stderr


def test_async_twins_write_the_trace_context_and_the_envelope(db: str) -> None:
    init_db(db, slot="w", plugin="wal2json")
    init_outbox(db, "--no-slot", "--with-trace-context")

    async def scenario() -> tuple[uuid.UUID, uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(db) as conn:
            row = await emit_async(conn, "order", "1", "OrderCreated", PAYLOAD,
                                   traceparent=TRACEPARENT)
            with trace.use_span(NonRecordingSpan(SPAN)):
                message = await emit_message_async(conn, "order", "1", "OrderCreated", PAYLOAD)
            await conn.commit()
        return row, message

    row, message = asyncio.run(scenario())
    with psycopg.connect(db, autocommit=True) as conn:
        stored = conn.execute("SELECT traceparent, tracestate, payload::text FROM outbox_events"
                              " WHERE id = %s", (row,)).fetchone()
        changes = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_changes('w', NULL, NULL, 'format-version', '2',"
            " 'add-msg-prefixes', 'cdc-relay', 'actions', 'insert')").fetchall()
    assert stored == (TRACEPARENT, None, GOLDEN_PAYLOAD_TEXT)
    [content] = [json.loads(c[0])["content"] for c in changes if json.loads(c[0])["action"] == "M"]
    envelope = json.loads(content)
    assert isinstance(envelope.pop("created_at"), int)
    assert envelope == {"v": 1, "id": str(message), "aggregate_type": "order", "aggregate_id": "1",
                        "event_type": "OrderCreated", "payload": GOLDEN_PAYLOAD_TEXT,
                        "traceparent": SPAN_TRACEPARENT, "tracestate": None}
