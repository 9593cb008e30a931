"""The Kafka side of the benchmark: topics, consumers, the bare producer.

The functions named ``*_process`` run in spawned child processes, so a consumer's
receipt timestamps never wait for another thread's GIL, and the bare producer has a
core's worth of Python to itself like the relay does. They talk to the parent through
shared counters (``multiprocessing.Value``), events, and a pickle file of results.

Consumers use ``assign()`` from the beginning of pre-created topics (the local broker's
group join is slow: docs/design.md, test services), count distinct events (never the
high watermark), and fetch with a low ``fetch.wait.max.ms``: this broker holds a fetch
until that time has passed (benchmarks/README.md, latency), so the consumer's setting is part of every
latency figure - the broker floor measured here shows how much.

Must not: touch PostgreSQL.
"""

from __future__ import annotations

import pickle
import time
import uuid
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from benchmarks.workload import AGGREGATES, payload

PARTITIONS = 4  # what the local broker gives an auto-created topic
FETCH_WAIT_MS = 5
# The relay's producer defaults (cdc_relay.sink.kafka.client.DEFAULT_SETTINGS), for the limits.
PRODUCER_SETTINGS = {"acks": "all", "enable.idempotence": "true", "linger.ms": "5",
                     "queue.buffering.max.messages": "100000",
                     "queue.buffering.max.kbytes": "65536", "compression.type": "none"}


def create_topics(bootstrap: str, names: list[str], partitions: int = PARTITIONS) -> None:
    """Create ``names`` (so consumers can be assigned before the first message)."""
    # log_level 3: no "purging unserved events" notice when the client is destroyed.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names],
                                  operation_timeout=10, request_timeout=15)
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise RuntimeError(f"cannot create topic {name}: {exc}") from exc


def warm_up(bootstrap: str, messages: int = 1, topic: str = "bench.warmup") -> None:
    """``messages`` relay-like messages through a fresh broker and back, before a measurement.

    One is enough to get the broker's start over: Apache Kafka answers a fresh broker's
    first producer-id request with "coordinator load in progress" for a moment, which
    would otherwise be charged to the mode measured on it (its *first event*), though no
    running broker has it. More (``--broker-warmup``) also let a fresh JVM compile its
    produce and fetch paths first, as a long-running broker has.
    """
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS, "log_level": 3})
    producer.produce(topic, b"warm-up", key=b"warm-up")
    for n in range(messages - 1):
        key, value, headers = _message(n)
        while True:
            try:
                producer.produce(topic, value, key=key, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError(f"the broker at {bootstrap} did not ack {messages:,} warm-up "
                           "message(s) in 120 s")
    if messages > 1:  # and read back: the fetch path warms too
        collect(bootstrap, topic, messages)


def _consumer(bootstrap: str, topic: str) -> tuple[Consumer, list[Message]]:
    """An assigned consumer from the beginning of ``topic``, and what its first fetch got.

    The first fetch opens the connections and reads the offsets; it may also bring a
    message already produced (``collect`` runs after the relay started), which the caller
    must count like any other.
    """
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "enable.partition.eof": False,
        "fetch.wait.max.ms": FETCH_WAIT_MS, "fetch.error.backoff.ms": 10,
    })
    partitions = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    first = consumer.consume(num_messages=1, timeout=0.5)  # connections, offsets
    return consumer, first


def _event_id(headers: list[tuple[str, bytes | None]] | None) -> bytes | None:
    for key, value in headers or ():
        if key == "id":
            return value
    return None


def count_process(bootstrap: str, topic: str, expected: int, received: Synchronized[int],
                  first_at: Synchronized[float], done_at: Synchronized[float],
                  ready: Event, stop: Event) -> None:
    """Child: count distinct events on ``topic``; stamp the first and the ``expected``-th.

    An event is told apart by its value: every backlog event's payload carries its own
    number (workload.payload). Reading the ``id`` header instead made confluent-kafka
    convert every message's headers, ~2.5 µs of this process's ~8 µs per event, CPU
    taken from the two cores the relay, PostgreSQL and the broker share. The process
    stays until ``stop`` so the harness can read its CPU when the last event is in.
    """
    consumer, first = _consumer(bootstrap, topic)
    seen: set[bytes | None] = set()
    ready.set()
    try:
        while not stop.is_set():
            # A batch ends when full or after the timeout: the timeout bounds how late
            # the last receipt is stamped.
            batch, first = first or consumer.consume(num_messages=10_000, timeout=0.01), []
            if not batch:
                continue
            now = time.time()
            if not seen:
                first_at.value = now
            seen.update(m.value() for m in batch if m.error() is None)
            received.value = len(seen)
            if len(seen) >= expected and not done_at.value:
                done_at.value = now
    finally:
        consumer.close()


def receipt_process(bootstrap: str, topic: str, out_path: str, received: Synchronized[int],
                    ready: Event, stop: Event) -> None:
    """Child: record ``time.time()`` of each event id's first receipt until ``stop``; pickle."""
    consumer, _ = _consumer(bootstrap, topic)  # nothing before ready: the relay waits for it
    receipts: dict[str, float] = {}
    duplicates = 0
    ready.set()
    try:
        while not stop.is_set():
            # poll(), not consume(n, timeout): consume waits for a full batch or the
            # whole timeout, which would be added to every latency.
            message = consumer.poll(0.05)
            if message is None or message.error() is not None:
                continue
            now = time.time()
            raw = _event_id(message.headers())
            key = raw.decode() if raw else ""
            if key in receipts:
                duplicates += 1
            else:
                receipts[key] = now
                received.value = len(receipts)
    finally:
        consumer.close()
    Path(out_path).write_bytes(pickle.dumps({"receipts": receipts, "duplicates": duplicates}))


def _message(n: int) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    headers = [("id", str(uuid.uuid4()).encode()), ("event_type", b"OrderPlaced"),
               ("aggregate_type", b"order")]
    return f"agg-{n % AGGREGATES}".encode(), payload(n).encode(), headers


def producer_limit_process(bootstrap: str, topic: str, events: int, out_path: str,
                           sent: Synchronized[int]) -> None:
    """Child: produce ``events`` relay-like messages with the relay's producer settings.

    The producer is warmed first (its first ack waits for a producer id: docs/design.md, WAL mode);
    the time runs from the first ``produce()`` to the last delivery report.
    """
    messages = [_message(n) for n in range(events)]
    acked = 0
    failed = 0

    def report(err: Any, _msg: Any) -> None:
        nonlocal acked, failed
        if err is None:
            acked += 1
        else:
            failed += 1

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
    producer.produce(topic, b"warm-up", key=b"warm-up")
    producer.flush(30)
    start = time.perf_counter()
    for n, (key, value, headers) in enumerate(messages):
        while True:
            try:
                producer.produce(topic, value, key=key, headers=headers, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        if n % 5_000 == 0:
            sent.value = acked
    producer.flush(120)
    seconds = time.perf_counter() - start
    sent.value = acked
    Path(out_path).write_bytes(pickle.dumps({"seconds": seconds, "acked": acked, "failed": failed}))


def floor_producer_process(bootstrap: str, topic: str, rate: int, duration: float, warmup: float,
                           linger_ms: int, out_path: str, written: Synchronized[int]) -> None:
    """Child: produce ``rate`` msg/s straight to the broker; pickle each id's send time.

    The send time is taken just before ``produce()``: this measures what the broker and
    the clients add on their own, the floor under every relay latency figure.
    """
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS,
                         "linger.ms": str(linger_ms)})
    producer.produce(topic, b"warm-up", key=b"warm-up")
    producer.flush(30)
    sends: dict[str, float] = {}
    interval = 1 / rate
    start = time.monotonic()
    n = 0
    while n * interval < warmup + duration:
        delay = n * interval - (time.monotonic() - start)
        if delay > 0:
            time.sleep(delay)
        key, value, headers = _message(n)
        now = time.time()
        producer.produce(topic, value, key=key, headers=headers)
        producer.poll(0)
        if n * interval >= warmup:
            sends[headers[0][1].decode()] = now
        written.value = n + 1
        n += 1
    producer.flush(30)
    Path(out_path).write_bytes(pickle.dumps({"commits": sends, "behind_max_s": 0.0,
                                             "achieved_eps": float(rate)}))


def collect(bootstrap: str, topic: str, expected: int, timeout: float = 120.0,
            check: Any = lambda: None) -> dict[bytes, tuple[Any, ...]]:
    """``{id header: (key, value, headers, partition)}`` of the first ``expected`` events.

    In this process (nothing is timed). ``check`` is called between fetches (a producer's
    liveness); RuntimeError when fewer arrive within ``timeout``.
    """
    consumer, first = _consumer(bootstrap, topic)
    found: dict[bytes, tuple[Any, ...]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(found)} of {expected} events arrived on {topic}")
            check()
            batch, first = first or consumer.consume(num_messages=1000, timeout=0.2), []
            for m in batch:
                if m.error() is None:
                    found.setdefault(_event_id(m.headers()) or b"", (
                        m.key(), m.value(), list(m.headers() or ()), m.partition()))
    finally:
        consumer.close()
    return found
