"""The relay-thread half of a sink whose broker client runs on a thread of its own.

RabbitMQ (pika's SelectConnection) and NATS (nats-py, asyncio only) each run their
client on one daemon thread per sink generation; the relay's single loop never sees
that thread. ``BackgroundSink`` implements the Sink protocol's bookkeeping for both:

* ``produce`` assigns a sequence number, records the token, and hands the message to the
  subclass's ``_submit`` (which queues it for the I/O thread, in order);
* the I/O thread calls ``_report(seqs, error)`` for confirmations and failures; reports
  wait in a queue and reach the handler only from ``poll`` / ``flush`` / ``close`` on
  the relay's thread - so the handler is never called concurrently, exactly as with
  the Kafka sink;
* at most ``max_in_flight`` messages are unconfirmed: beyond that ``produce`` raises
  QueueFull (backpressure);
* a message unconfirmed for longer than the message timeout, a lost connection or a
  closed channel makes the sink FATAL (``fatal_error``): the loops discard it and
  resume with a new one, as after a fatal Kafka producer error (docs/design.md, failure
  rules). Unconfirmed messages of a failed or closed sink are never reported;
* a connection the broker refuses for the credentials or permissions is a refusal
  (``_fail(..., refused=True)``): ``warm_up`` raises AccessRefused (exit 6, never
  retried); any other failed attempt is retried by ``warm_up`` no sooner than the shared
  Backoff allows (cdc_relay/backoff.py), so an unreachable broker is not hammered.

Sequence numbers, not tokens, identify a publish: WAL mode re-produces a dead letter
under its original token, and a late report of the first publish must not be mistaken
for the second. Must not import a broker client, nor decide what a failure means for
the event (the loops do that).
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from collections.abc import Callable

from cdc_relay.backoff import Backoff
from cdc_relay.errors import AccessRefused, BrokerError
from cdc_relay.model import Message
from cdc_relay.sink.base import (
    BatchHandler,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    ProduceRejected,
    QueueFull,
)

Report = tuple[list[int], DeliveryError | None]


class BackgroundSink:
    """Sink bookkeeping on the relay's thread; subclasses own the I/O thread (module docstring)."""

    kind = "background"  # the sink's name in logs and metrics

    def __init__(self, on_delivery: DeliveryHandler, *, generation: int, max_in_flight: int,
                 message_timeout: float, logger: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.generation = generation
        self._handler = on_delivery
        self._max_in_flight = max_in_flight
        self._message_timeout = message_timeout
        self._log = logger
        self._clock = clock
        self._reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._pending: dict[int, int] = {}  # seq -> token, unconfirmed
        self._sent: deque[tuple[float, int]] = deque()  # (produced at, seq), oldest first
        self._next_seq = 0
        self._fatal: DeliveryError | None = None
        self._refused = False
        self._closed = False
        # Reconnect attempts of warm_up: 0.25 s, doubling to 5 s (docs/operations.md).
        self._reconnect = Backoff(0.25, 5.0)
        self._next_attempt = 0.0

    # -- the Sink protocol (relay thread) --------------------------------------------
    @property
    def fatal_error(self) -> DeliveryError | None:
        """Set when this generation can deliver nothing more (then build a new sink)."""
        return self._fatal

    def produce(self, message: Message, token: int) -> None:
        """Queue ``message`` for the I/O thread; its Delivery comes from a later poll."""
        if self._closed:
            raise ProduceRejected(DeliveryError(
                ErrorKind.FATAL, f"{self.kind} sink generation {self.generation} is closed"))
        if self._fatal is not None:
            raise ProduceRejected(self._fatal)
        if len(self._pending) >= self._max_in_flight:
            raise QueueFull(f"{self._max_in_flight} messages await confirmation")
        refused = self._refuse(message)
        if refused is not None:
            raise ProduceRejected(refused)
        seq = self._next_seq
        self._next_seq = seq + 1
        self._pending[seq] = token
        self._sent.append((self._clock(), seq))
        self._submit(seq, message)

    def poll(self, timeout: float) -> int:
        """Hand queued reports to the handler, waiting up to ``timeout`` s for the first."""
        reports = self._reports
        try:
            item = reports.get(timeout=timeout) if timeout > 0 else reports.get_nowait()
        except queue.Empty:
            self._check_timeout()
            return 0
        count = 0
        while True:
            count += self._hand_over(item)
            try:
                item = reports.get_nowait()
            except queue.Empty:
                break
        self._check_timeout()
        return count

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s until every message is reported; return how many remain."""
        deadline = self._clock() + timeout
        self.poll(0)
        while self._pending and self._fatal is None:
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            self.poll(min(0.1, remaining))
        self.poll(0)  # reports queued before a failure still count
        return len(self._pending)

    def pending(self) -> int:
        """Messages produced and not yet reported."""
        return len(self._pending)

    def set_handler(self, handler: DeliveryHandler, delivered: BatchHandler | None = None) -> None:
        """Hand the reports served from now on (by ``poll``/``flush``) to ``handler``, one
        at a time (``delivered`` is not used: these brokers' own round trips dwarf a call)."""
        self._handler = handler

    def close(self, timeout: float) -> None:
        """Flush for up to ``timeout`` s, stop the I/O thread, drop the rest unreported."""
        if self._closed:
            return
        if self._fatal is None and timeout > 0:
            self.flush(timeout)
        else:
            self.poll(0)
        self._closed = True
        self._stop()
        dropped = len(self._pending)
        self._pending.clear()
        self._sent.clear()
        if dropped:
            self._log.info("%s sink generation %d closed; %d unconfirmed message(s) dropped, never "
                           "reported", self.kind, self.generation, dropped, extra={"sink": self.kind})

    # -- for the I/O thread ----------------------------------------------------------
    def _report(self, seqs: list[int], error: DeliveryError | None) -> None:
        """Queue the outcome of these publishes (called on the I/O thread)."""
        self._reports.put((seqs, error))

    def _fail(self, reason: str, *, refused: bool = False) -> None:
        """This generation is unusable (any thread); wakes a waiting ``poll``.

        ``refused``: the broker refused the credentials or permissions (AccessRefused).
        """
        if self._fatal is None and not self._closed:
            self._refused = refused
            self._fatal = DeliveryError(ErrorKind.FATAL, reason)
            # A refusal stops the relay with this reason as its one error line.
            self._log.log(logging.DEBUG if refused else logging.ERROR,
                          "%s sink generation %d failed: %s", self.kind, self.generation, reason,
                          extra={"sink": self.kind})
        self._reports.put(([], None))

    def _retry_allowed(self) -> bool:
        """Whether a failed connection attempt may be retried on this sink (``warm_up`` again).

        Only while nothing was produced: then no report can be lost by starting over, and
        polling mode may keep its sink while it waits for the broker.
        """
        return self._fatal is not None and not self._pending and not self._closed

    def _clear_failure(self) -> None:
        self._fatal = None
        self._refused = False

    def _raise_failure(self, where: str) -> None:
        """Raise for a failed warm-up: AccessRefused for a refusal, else BrokerError."""
        fatal = self._fatal
        if fatal is None:
            return
        if self._refused:
            raise AccessRefused(f"{where} refused the relay: {fatal.reason}")
        raise BrokerError(f"{where}: {fatal.reason}")

    def _may_reconnect(self, timeout: float) -> bool:
        """Before a new connection attempt: wait what the backoff asks (True), or, when that
        is longer than ``timeout``, wait ``timeout`` and say no (False: report the last
        failure again). A refusal is never retried."""
        if self._refused:
            return False
        wait = self._next_attempt - self._clock()
        if wait > timeout:
            time.sleep(max(0.0, timeout))
            return False
        if wait > 0:
            time.sleep(wait)
        self._next_attempt = self._clock() + self._reconnect.next_delay()
        return True

    # -- for subclasses --------------------------------------------------------------
    def _refuse(self, message: Message) -> DeliveryError | None:
        """Why ``message`` can never be published as is (a PERMANENT error), or None."""
        return None

    def _submit(self, seq: int, message: Message) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        """Close the connection and end the I/O thread (bounded wait)."""
        raise NotImplementedError

    # -- internals -------------------------------------------------------------------
    def _hand_over(self, item: Report) -> int:
        seqs, error = item
        pending, handler = self._pending, self._handler
        count = 0
        for seq in seqs:
            token = pending.pop(seq, None)
            if token is None:
                continue
            count += 1
            handler(token, error)
        return count

    def _check_timeout(self) -> None:
        sent, pending = self._sent, self._pending
        while sent and sent[0][1] not in pending:
            sent.popleft()
        if sent and self._fatal is None and self._clock() - sent[0][0] > self._message_timeout:
            self._fail(f"no confirmation within {self._message_timeout:g} s (message timeout): "
                       "the broker is stalled or unreachable")
