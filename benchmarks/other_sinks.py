"""The RabbitMQ, NATS and SQS side of the benchmark (Redis, HTTP, Kinesis: batching_sinks.py).

The wal-rabbitmq and wal-nats modes publish to a throwaway RabbitMQ or NATS server of the
run's own (cdc_relay.local.message_brokers), where the run declares its exchange and queues,
or its stream; wal-sqs starts a moto server of its own
(cdc_relay.local.moto_server) with the run's FIFO queues. ``count_process_rabbitmq``,
``count_process_nats`` and ``count_process_sqs`` run in spawned children like
``kafka_side.count_process`` and stamp the same shared values: the first receipt and the
``expected``-th distinct event id (SQS: the queue's message count, see the function).
Only backlog throughput is measured for these modes (the latency harness is Kafka's).

Must not: touch PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from benchmarks.batching_sinks import http_side, kinesis_side, redis_side
from cdc_relay.local.message_brokers import NatsServer, RabbitMqServer
from cdc_relay.local.moto_server import MOTO_ENV, MotoServer

# wal-redis, wal-http, wal-kinesis: benchmarks/batching_sinks.py
_BATCHING = {"redis": redis_side, "http": http_side, "kinesis": kinesis_side}


@dataclass(frozen=True)
class SinkSide:
    """What the runner needs for one non-Kafka mode: address, relay options, a counter."""

    brokers: str
    relay_args: tuple[str, ...]
    counter: Callable[..., None]
    counter_args: Callable[[str], tuple[Any, ...]]  # topic -> leading arguments of counter


@contextmanager
def machine_sink(sink: str, topics: list[str]) -> Iterator[SinkSide]:
    """Set up the run's own exchange/queues or stream name; clean them up afterwards."""
    run_id = uuid.uuid4().hex[:8]
    if sink in _BATCHING:
        with _BATCHING[sink](topics) as (brokers, args, counter, counter_args):
            yield SinkSide(brokers, args, counter, counter_args)
        return
    if sink == "sqs":
        with sqs_side(topics) as side:
            yield side
        return
    if sink == "rabbitmq":
        with RabbitMqServer() as rabbitmq:
            yield from _rabbitmq_side(rabbitmq.url, run_id, topics)
    else:
        with NatsServer() as nats:
            yield from _nats_side(nats.url, run_id, topics)


def _rabbitmq_side(url: str, run_id: str, topics: list[str]) -> Iterator[SinkSide]:
    """The run's exchange with a queue per topic on RabbitMQ at ``url``; deleted afterwards."""
    import pika

    exchange = f"bench-{run_id}"
    queues = {topic: f"{exchange}.{topic}" for topic in topics}
    dead = f"{exchange}.dlq"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.exchange_declare(exchange, "topic", durable=True)
    for topic, queue in queues.items():
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, topic)
    try:
        yield SinkSide(url, ("--sink", "rabbitmq", "--sink-config", f"exchange={exchange}",
                             "--sink-config", f"dead_letter_queue={dead}"),
                       count_process_rabbitmq, lambda topic: (url, queues[topic]))
    finally:
        for queue in (*queues.values(), dead):
            with suppress(Exception):
                channel.queue_delete(queue)
        with suppress(Exception):
            channel.exchange_delete(exchange)
        conn.close()


def _nats_side(url: str, run_id: str, topics: list[str]) -> Iterator[SinkSide]:
    """The run's JetStream stream on NATS at ``url``; deleted afterwards."""
    stream = f"BENCH_{run_id}"
    # Created up front (the relay finds it), so the counter subscribes before the first event.
    asyncio.run(_create_stream(url, stream, [f"{topic.split('.')[0]}.>" for topic in topics]))
    try:
        yield SinkSide(url, ("--sink", "nats", "--sink-config", f"stream={stream}"),
                       count_process_nats, lambda topic: (url, stream, topic))
    finally:
        asyncio.run(_delete_stream(url, stream))


@contextmanager
def sqs_side(topics: list[str]) -> Iterator[SinkSide]:
    """A moto server with a FIFO queue per topic (``bench.x`` -> ``bench-x.fifo``) and the dead
    letters', the relay told to send there (its later options win over the runner's)."""
    import boto3

    saved = {key: os.environ.get(key) for key in MOTO_ENV}
    os.environ.update(MOTO_ENV)  # for the relay and the counter, children of this process
    try:
        with MotoServer() as server:
            client = boto3.client("sqs", endpoint_url=server.url)
            queues = {topic: topic.replace(".", "-") + ".fifo" for topic in topics}
            for queue in [*queues.values(), "bench-dlq.fifo"]:
                client.create_queue(QueueName=queue, Attributes={"FifoQueue": "true"})
            # moto spends CPU per message in proportion to what a queue holds, and shares
            # the two cores: long timeouts, so its slowness is measured, not replayed.
            yield SinkSide(server.url, ("--sink", "sqs", "--topic-pattern",
                                        "bench-{aggregate_type}.fifo", "--dead-letter-topic",
                                        "bench-dlq.fifo", "--message-timeout", "5m",
                                        "--sink-config", "read_timeout=60"),
                           count_process_sqs, lambda topic: (server.url, queues[topic]))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def _create_stream(url: str, stream: str, subjects: list[str]) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=stream, subjects=sorted(set(subjects)))
    finally:
        await nc.close()


async def _delete_stream(url: str, stream: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        with suppress(Exception):
            await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


def _stamp(seen: set[Any], fresh: list[Any], expected: int, received: Synchronized[int],
           first_at: Synchronized[float], done_at: Synchronized[float]) -> None:
    now = time.time()
    if not seen:
        first_at.value = now
    seen.update(fresh)
    received.value = len(seen)
    if len(seen) >= expected and not done_at.value:
        done_at.value = now


def count_process_rabbitmq(url: str, queue: str, expected: int, received: Synchronized[int],
                           first_at: Synchronized[float], done_at: Synchronized[float],
                           ready: Event, stop: Event) -> None:
    """Child: count distinct ``message_id``\\ s arriving on ``queue``."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=2000)
    seen: set[str] = set()
    batch: list[str] = []
    channel.basic_consume(queue, lambda _ch, _m, props, _b: batch.append(props.message_id),
                          auto_ack=True)
    ready.set()
    try:
        while not stop.is_set():
            conn.process_data_events(time_limit=0.01)
            if batch:
                fresh, batch[:] = list(batch), []
                _stamp(seen, fresh, expected, received, first_at, done_at)
    finally:
        conn.close()


def count_process_nats(url: str, stream: str, subject: str, expected: int,
                       received: Synchronized[int], first_at: Synchronized[float],
                       done_at: Synchronized[float], ready: Event, stop: Event) -> None:
    """Child: count distinct ``Nats-Msg-Id``\\ s stored in ``stream`` under ``subject``."""
    asyncio.run(_count_nats(url, stream, subject, expected, received, first_at, done_at,
                            ready, stop))


async def _count_nats(url: str, stream: str, subject: str, expected: int,
                      received: Synchronized[int], first_at: Synchronized[float],
                      done_at: Synchronized[float], ready: Event, stop: Event) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    seen: set[str] = set()
    batch: list[str] = []

    async def on_message(msg: Any) -> None:
        batch.append((msg.headers or {}).get("Nats-Msg-Id", ""))

    try:
        # An ordered push consumer: the server streams the stream's messages without acks.
        await js.subscribe(subject, stream=stream, ordered_consumer=True, cb=on_message,
                           pending_msgs_limit=-1, pending_bytes_limit=-1)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            if batch:
                fresh, batch[:] = list(batch), []
                _stamp(seen, fresh, expected, received, first_at, done_at)
    finally:
        await nc.close()


def count_process_sqs(url: str, queue: str, expected: int, received: Synchronized[int],
                      first_at: Synchronized[float], done_at: Synchronized[float],
                      ready: Event, stop: Event) -> None:
    """Child: count what ``queue`` holds (ApproximateNumberOfMessages, visible or not).

    Nothing is received: moto answers a FIFO ReceiveMessage (10 messages) in seconds on
    shared cores, far below what the relay sends. Nothing deletes either, so the FIFO
    queue's deduplication drops every replay (moto forgets an id only once its message is
    deleted) and the count is of distinct events.
    """
    import boto3

    client = boto3.client("sqs", endpoint_url=url, region_name=MOTO_ENV["AWS_REGION"])
    queue_url = client.get_queue_url(QueueName=queue)["QueueUrl"]
    ready.set()
    while not stop.is_set():
        attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        count = sum(int(v) for v in attributes.values())
        now = time.time()
        if count and not first_at.value:
            first_at.value = now
        received.value = count
        if count >= expected and not done_at.value:
            done_at.value = now
        stop.wait(0.1)
