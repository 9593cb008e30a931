"""Shared pieces of the RabbitMQ and NATS sink tests: readers, relays, workloads.

The machine's RabbitMQ and NATS are shared: every test uses names from its own prefix
and deletes what it declared. Messages read back are turned into ``tests.support.Msg``
(topic = routing key / subject, offset = arrival order / stream sequence) so that
``wal_support.assert_contract`` checks them exactly as it checks Kafka records.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit

import nats
import pika
import psycopg

from tests.integration.wal_support import Expected, confirmed_flush, write_workload
from tests.support import CliProcess, Msg, wait_for

# ---------------------------------------------------------------- RabbitMQ

class RabbitReader:
    """Declares the test's exchange and queues, reads them back, deletes them all on close."""

    def __init__(self, url: str, exchange: str) -> None:
        self.exchange = exchange
        self.port = int(urlsplit(url).port or 5672)
        self._conn = pika.BlockingConnection(pika.URLParameters(url))
        self._channel = self._conn.channel()
        self._channel.exchange_declare(exchange, "topic", durable=True)
        self._queues: list[str] = []
        self.read: dict[str, list[Msg]] = {}

    def bind(self, queue: str, *keys: str) -> None:
        """A durable queue bound to the exchange with each routing key pattern."""
        self._channel.queue_declare(queue, durable=True)
        for key in keys:
            self._channel.queue_bind(queue, self.exchange, key)
        self._queues.append(queue)

    def collect(self, queue: str, *, until: Any, timeout: float = 60.0) -> list[Msg]:
        """Read ``queue`` until ``until(messages)``; return everything read from it so far."""
        got = self.read.setdefault(queue, [])
        if queue not in self._queues:
            self._queues.append(queue)
        deadline = time.monotonic() + timeout
        while not until(got):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(got)} messages from {queue} in {timeout} s")
            method, props, body = self._channel.basic_get(queue, auto_ack=True)
            if method is None:
                self._conn.process_data_events(0.05)
                continue
            got.append(to_msg(method, props, body, len(got)))
        return list(got)

    def available(self, queue: str) -> list[Msg]:
        """Read what ``queue`` holds now; return everything read from it so far."""
        got = self.read.setdefault(queue, [])
        while True:
            method, props, body = self._channel.basic_get(queue, auto_ack=True)
            if method is None:
                return list(got)
            got.append(to_msg(method, props, body, len(got)))

    def close(self) -> None:
        # The relay declares the dead-letter queue ({prefix}.dlq in these tests) itself.
        for queue in dict.fromkeys([*self._queues, f"{self.exchange}.dlq"]):
            with suppress(Exception):
                self._channel.queue_delete(queue)
        with suppress(Exception):
            self._channel.exchange_delete(self.exchange)
        with suppress(Exception):
            self._conn.close()


def to_msg(method: Any, props: Any, body: bytes, offset: int) -> Msg:
    headers = {k: (v.encode() if isinstance(v, str) else bytes(v))
               for k, v in (props.headers or {}).items()}
    headers["_message_id"] = (props.message_id or "").encode()
    headers["_type"] = (props.type or "").encode()
    headers["_content_type"] = (props.content_type or "").encode()
    headers["_delivery_mode"] = str(props.delivery_mode).encode()
    return Msg(topic=method.routing_key, partition=0, offset=offset,
               key=headers.get("aggregate_id"), value=body, headers=headers,
               timestamp=(props.timestamp or 0) * 1000)


# ---------------------------------------------------------------- NATS

def stream_messages(url: str, stream: str, subject: str = ">") -> list[Msg]:
    """Every message the stream holds (optionally of one subject), in stream order."""
    async def read() -> list[Msg]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                return []  # not created yet
            if not info.state.messages:
                return []
            found = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                with suppress(nats.js.errors.NotFoundError):
                    raw = await js.get_msg(stream, seq)
                    if subject == ">" or raw.subject == subject:
                        found.append(raw)
            return [Msg(topic=m.subject, partition=0, offset=m.seq or 0,
                        key=(m.headers or {}).get("aggregate_id", "").encode(), value=m.data,
                        headers={k: v.encode() for k, v in (m.headers or {}).items()},
                        timestamp=int((m.headers or {}).get("timestamp", "0")))
                    for m in found]
        finally:
            await nc.close()
    return asyncio.run(read())


def stream_count(url: str, stream: str) -> int:
    async def count() -> int:
        nc = await nats.connect(url)
        try:
            return int((await nc.jetstream().stream_info(stream)).state.messages)
        except nats.js.errors.NotFoundError:
            return 0
        finally:
            await nc.close()
    return asyncio.run(count())


def delete_stream(url: str, stream: str) -> None:
    async def delete() -> None:
        nc = await nats.connect(url)
        try:
            with suppress(nats.js.errors.NotFoundError):
                await nc.jetstream().delete_stream(stream)
        finally:
            await nc.close()
    asyncio.run(delete())


# ---------------------------------------------------------------- relays and workloads

def start_poller(dsn: str, brokers: str, prefix: str, *extra: str) -> CliProcess:
    """``cdc-relay poll`` with the test's topic pattern and dead-letter topic."""
    return CliProcess(["poll", "--dsn", dsn, "--brokers", brokers,
                       "--topic-pattern", prefix + ".{aggregate_type}",
                       "--dead-letter-topic", f"{prefix}.dlq", "--message-timeout", "10s",
                       "--interval", "200ms", *extra])


def poll_rows(dsn: str, where: str = "TRUE") -> list[tuple[Any, ...]]:
    """(id, attempts, processed, dead-lettered, last_error) of the outbox rows matching ``where``."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT id::text, attempts, processed_at IS NOT NULL, dead_lettered_at IS NOT NULL,"
            f" last_error FROM outbox_events WHERE {where} ORDER BY created_at").fetchall()


class Writer:
    """Commits one-transaction workloads on a thread until stopped; ``expected`` grows."""

    def __init__(self, dsn: str, limit: int) -> None:
        self.expected = Expected()
        self._dsn, self._limit = dsn, limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for seed in range(self._limit):
            if self._stop.is_set():
                return
            write_workload(self._dsn, transactions=1, seed=seed, expected=self.expected,
                           rollback_every=0, max_events=8)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


@contextmanager
def write_continuously(dsn: str, limit: int = 400) -> Iterator[Writer]:
    writer = Writer(dsn, limit)
    try:
        yield writer
    finally:
        writer.stop()


def crash_with_replays(relay: CliProcess, dsn: str, expected: Expected,
                       delivered: Callable[[], set[str]]) -> set[str]:
    """SIGKILL the relay at a moment when the broker holds events the slot has not confirmed.

    The relay is frozen (SIGSTOP) while the slot's confirmed LSN and the broker's content
    are compared; if no delivered event lies past the confirmed LSN it is thawed and
    tried again. Returns the delivered events a restart must publish again. Commit
    positions are read just after each COMMIT, so the first position past the confirmed
    LSN may still belong to the confirmed transaction: its events are left out.
    """
    pid = relay.proc.pid

    def attempt() -> set[str] | None:
        os.kill(pid, signal.SIGSTOP)
        confirmed = confirmed_flush(dsn)
        arrived = delivered()
        positions = dict(expected.commit_lsn)
        later = sorted({lsn for lsn in positions.values() if lsn > confirmed})
        unsure = later[0] if later else None
        replays = {i for i in arrived if positions.get(i, 0) > confirmed and positions[i] != unsure}
        if replays:
            relay.kill()
            return replays
        os.kill(pid, signal.SIGCONT)
        return None

    return wait_for(attempt, timeout=60, interval=0.1, message="delivered events past the slot")
