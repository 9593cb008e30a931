"""Shared pieces of the SQS sink tests: a reader of the test's own queues on moto's server.

Every test creates its queues under its own prefix and deletes them. Messages read back
are turned into ``tests.support.Msg`` so that ``wal_support.assert_contract`` checks them
as it checks Kafka records: the queue ``{prefix}-{aggregate_type}.fifo`` reads as topic
``{prefix}.{aggregate_type}``, the offset is the order of receipt, the key the
``aggregate_id`` attribute, the timestamp SQS's SentTimestamp. Receiving deletes what was
received at once, so a FIFO group is never held back by a message in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from typing import Any

import boto3

from tests.support import Msg, wait_for


def queue_topic(prefix: str, queue: str) -> str:
    """``{prefix}-{x}.fifo`` (or without .fifo) -> ``{prefix}.{x}``: the name assert_contract expects."""
    stem = queue.removesuffix(".fifo")
    return prefix + "." + stem[len(prefix) + 1:] if stem.startswith(prefix + "-") else stem


def sqs_args(prefix: str, *extra: str, fifo: bool = True) -> tuple[str, ...]:
    """Relay options sending to ``{prefix}-{aggregate_type}[.fifo]``, dead letters to ``{prefix}-dlq``."""
    suffix = ".fifo" if fifo else ""
    return ("--sink", "sqs", "--topic-pattern", f"{prefix}-{{aggregate_type}}{suffix}",
            "--dead-letter-topic", f"{prefix}-dlq{suffix}", *extra)


class SqsReader:
    """Creates the test's queues, receives (and deletes) their messages, deletes the queues."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self.client: Any = boto3.client("sqs", endpoint_url=url)
        self.read: dict[str, list[Msg]] = {}

    def create(self, *names: str, **attributes: str) -> None:
        """Create queues ``{prefix}-{name}`` (FIFO when the name ends in .fifo)."""
        for name in names:
            attrs = dict(attributes)
            if name.endswith(".fifo"):
                attrs["FifoQueue"] = "true"
            self.client.create_queue(QueueName=f"{self.prefix}-{name}", Attributes=attrs)

    def queue_url(self, name: str) -> str:
        return str(self.client.get_queue_url(QueueName=f"{self.prefix}-{name}")["QueueUrl"])

    def receive(self, name: str) -> list[Msg]:
        """Receive (and delete) what ``{prefix}-{name}`` holds now; return all read from it so far."""
        queue = f"{self.prefix}-{name}"
        got = self.read.setdefault(queue, [])
        url = self.queue_url(name)
        while True:
            reply = self.client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                MessageAttributeNames=["All"], AttributeNames=["All"])
            messages = reply.get("Messages", [])
            if not messages:
                return list(got)
            for m in messages:
                got.append(to_msg(self.prefix, queue, m, len(got)))
            self.client.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])

    def collect(self, names: list[str], until: Callable[[list[Msg]], bool],
                timeout: float = 90.0) -> list[Msg]:
        """Receive from ``names`` until ``until(everything read)``; return everything read."""
        everything: list[Msg] = []

        def read() -> bool:
            everything[:] = [m for name in names for m in self.receive(name)]
            return until(everything)

        wait_for(read, timeout=timeout, interval=0.1, message=f"the messages from {names}")
        return everything

    def close(self) -> None:
        with suppress(Exception):
            for url in self.client.list_queues(QueueNamePrefix=self.prefix).get("QueueUrls", []):
                with suppress(Exception):
                    self.client.delete_queue(QueueUrl=url)


def to_msg(prefix: str, queue: str, m: dict[str, Any], offset: int) -> Msg:
    headers: dict[str, bytes] = {}
    for name, attr in m.get("MessageAttributes", {}).items():
        value = attr.get("StringValue")
        headers[name] = value.encode() if value is not None else bytes(attr.get("BinaryValue", b""))
    system = m.get("Attributes", {})
    for name in ("MessageGroupId", "MessageDeduplicationId"):
        if name in system:
            headers["_" + name] = system[name].encode()
    return Msg(topic=queue_topic(prefix, queue), partition=0, offset=offset,
               key=headers.get("aggregate_id"), value=m["Body"].encode(), headers=headers,
               timestamp=int(system.get("SentTimestamp", "0")))


def ids_of(messages: list[Msg]) -> set[str]:
    return {m.headers["id"].decode() for m in messages}
