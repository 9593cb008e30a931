"""The demo's traffic: sample orders written to PostgreSQL and their events read back.

Owns what flows through the pipeline under demonstration: the ``orders`` table, the
writer thread that commits an order change and its outbox event (``outbox.emit``) in one
transaction at a steady rate, the consumer that reads the topic back with ``assign()``,
and the ``Book`` that pairs each commit with its receipt (latency, duplicates, per-order
order). Like ``cdc_relay.outbox``, this is application-side code importing psycopg and
confluent-kafka itself.

Must not start or stop services or the relay (cdc_relay.app.demo), nor print anything
(cdc_relay.demo.report renders what the Book recorded).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_relay.outbox import emit

TOPIC = "outbox.event.order"
PARTITIONS = 4
ORDERS_DDL = """CREATE TABLE IF NOT EXISTS orders (
    id text PRIMARY KEY, customer text NOT NULL, total numeric(10, 2) NOT NULL,
    status text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"""


@dataclass
class Book:
    """Commit and receipt times per event id, shared by the writer thread and the consumer.

    Either may come first (a receipt can be stamped before the writer thread has recorded
    its commit), so each side pairs with the other under one lock.
    """

    commits: dict[str, float] = field(default_factory=dict)
    receipts: dict[str, float] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)  # appended only: slices are safe
    paired: int = 0  # committed events that were received
    duplicates: int = 0
    out_of_order: int = 0
    _last_seq: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _pair(self, committed: float | None, received: float | None) -> None:
        if committed is not None and received is not None:
            self.paired += 1
            self.latencies_ms.append((received - committed) * 1000)

    def committed(self, event_id: str, at: float) -> None:
        """The writer committed ``event_id`` at ``at``."""
        with self._lock:
            self.commits[event_id] = at
            self._pair(at, self.receipts.get(event_id))

    def received(self, event_id: str, aggregate_id: str, seq: int, at: float) -> None:
        """The consumer got ``event_id`` (duplicates and per-order order are checked here)."""
        with self._lock:
            if event_id in self.receipts:
                self.duplicates += 1
                return
            self.receipts[event_id] = at
            self._pair(self.commits.get(event_id), at)
            last = self._last_seq.get(aggregate_id, 0)
            self.out_of_order += seq < last
            self._last_seq[aggregate_id] = max(seq, last)


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value or ""


class OrderWriter:
    """A daemon thread writing ``events`` orders at ``rate``/s, one transaction each.

    Each commit is stamped in the ``Book``; ``written`` counts them and ``error`` holds
    whatever stopped the thread early.
    """

    def __init__(self, dsn: str, events: int, rate: float, book: Book) -> None:
        self.dsn, self.events, self.rate, self.book = dsn, events, rate, book
        self.written = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._write, name="demo-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        """Ask the thread to stop before its next order and wait up to ``timeout`` s."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout)

    def _write(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                started = time.monotonic()
                for n in range(self.events):
                    delay = started + n / self.rate - time.monotonic()
                    if delay > 0 and self._stop.wait(delay):
                        return
                    if self._stop.is_set():
                        return
                    event_id = order_step(conn, n)
                    conn.commit()
                    self.book.committed(str(event_id), time.time())
                    self.written = n + 1
        except BaseException as exc:
            self.error = exc


def order_step(conn: psycopg.Connection[Any], n: int) -> uuid.UUID:
    """Event ``n``: every order is placed, then paid, then shipped (3 events)."""
    order, seq = f"order-{n // 3 + 1:06d}", n % 3 + 1
    total = round(10 + (n // 3) % 90 * 1.25, 2)
    if seq == 1:
        conn.execute("INSERT INTO orders (id, customer, total, status) VALUES (%s, %s, %s, 'placed')",
                     (order, f"customer-{n % 17}", total))
        return emit(conn, "order", order, "OrderPlaced",
                    {"orderId": order, "seq": seq, "total": total, "currency": "EUR"})
    status = "paid" if seq == 2 else "shipped"
    conn.execute("UPDATE orders SET status = %s, updated_at = now() WHERE id = %s", (status, order))
    return emit(conn, "order", order, "OrderPaid" if seq == 2 else "OrderShipped",
                {"orderId": order, "seq": seq, "status": status})


def subscribe(brokers: str) -> Consumer:
    """Create the topic if needed and a consumer assigned to all of it from the start."""
    admin = AdminClient({"bootstrap.servers": brokers, "log_level": 3})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)],
                                      operation_timeout=10).values():
        with contextlib.suppress(KafkaException):  # already exists
            future.result()
    consumer = Consumer({
        "bootstrap.servers": brokers, "group.id": "cdc-relay-demo",
        "enable.auto.commit": False, "fetch.wait.max.ms": 10, "log_level": 3,
    })
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    # The first fetches after assign() set up connections and offsets (~200 ms here):
    # done now, or the first events' latency would include them.
    consumer.consume(num_messages=1, timeout=0.5)
    return consumer


def consume_one(consumer: Consumer, book: Book, timeout: float) -> None:
    """Poll one message and record its receipt in ``book`` (errors and timeouts: nothing)."""
    message = consumer.poll(timeout)
    if message is None or message.error() is not None:
        return
    at = time.time()
    headers = dict(message.headers() or [])
    try:
        seq = int(orjson.loads(message.value() or b"{}").get("seq", 0))
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        seq = 0
    book.received(_text(headers.get("id")), _text(message.key()), seq, at)
