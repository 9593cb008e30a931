"""The relay-thread and sender-thread halves of a sink that sends planned batches from threads.

The Redis, HTTP and Kinesis sinks speak synchronous clients (redis-py, httpx, boto3): each
sink generation runs ``concurrency`` daemon sender threads behind ``BackgroundSink``
(sink/background.py), so the relay keeps its single loop. What a batch holds is the
planner's (sink/batches.py): one queue's entries (a stream, a URL), at most one entry
per aggregate at a time, a retried entry holding back its aggregate's later ones. That
rule keeps each aggregate's order whatever the replies say (docs/sinks.md).

A subclass says how a message becomes an ``Outgoing`` (``_build``: its queue, its group,
its size and the client's form of it, or the PERMANENT error that keeps it from being
sent), how to get ready (``_connect``, on a warm-up thread: raise AccessRefused or any
error), and how to send one batch (``_send``, on a sender thread), which settles every
entry of the batch with ``_deliver``, ``_give_up``, ``_retry`` or ``_refuse_all``.

The message timeout runs from an entry's first send (entries waiting their turn behind a
slow receiver are a backlog, not a stall): one unsettled for longer makes the sink FATAL,
and the loops replay with a new one. A refusal (``_refuse_all``) is shared by every sink
of a factory (``SharedState``): each later ``warm_up`` raises it (exit 6).

Must not: import a client library, nor decide what a failure means for the event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from cdc_relay.errors import AccessRefused, BrokerError, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.background import BackgroundSink
from cdc_relay.sink.base import Cause, DeliveryError, DeliveryHandler, ErrorKind, Sink, SinkFactory
from cdc_relay.sink.batches import Pending, Planner


@dataclass(slots=True)
class Outgoing:
    """A message made ready for its sink: where it goes, its aggregate, its size, its form."""

    queue: str
    group: str | None
    size: int
    data: Any


@dataclass
class SharedState:
    """What every sink of one factory shares: an access refusal ends them all (exit 6)."""

    refused: AccessRefused | None = None


class SenderSettings(Protocol):
    """What a planned sink's config gives it (each sink's frozen ``*Config``)."""

    @property
    def where(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def max_in_flight(self) -> int: ...
    @property
    def message_timeout_ms(self) -> int: ...
    @property
    def batch_size(self) -> int: ...


C = TypeVar("C", bound=SenderSettings)


def backoff_delay(attempts: int) -> float:
    """The wait before sending an entry again: 0.1 s doubling to 2 s."""
    return min(0.1 * 2.0 ** min(attempts, 8), 2.0)


class PlannedSink(BackgroundSink, Generic[C]):
    """Sender threads over a Planner (module docstring); subclasses do the I/O."""

    kind = "planned"
    title = ""  # how messages name the sink ("SQS"); empty: its kind
    peer = "receiver"  # how messages name the other end ("endpoint")
    default_limit = 16 << 20  # bytes per batch
    quiet_refusal = True  # a refusal's failed generation logged at DEBUG (the relay's one error line)

    def __init__(self, config: C, on_delivery: DeliveryHandler, *, generation: int = 1,
                 logger: logging.Logger | None = None, shared: SharedState | None = None,
                 client: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        """``client``: a ready client (tests' fakes); None: ``_connect`` builds one.
        ``logger``: else ``cdc_relay.<kind>``."""
        super().__init__(on_delivery, generation=generation, max_in_flight=config.max_in_flight,
                         message_timeout=config.message_timeout_ms / 1000,
                         logger=logger or logging.getLogger(f"cdc_relay.{self.kind}"), clock=clock)
        self._config = config
        self._client: Any = client
        self._where = config.where
        self._concurrency = config.concurrency
        self._shared = shared or SharedState()
        self._cond = threading.Condition()
        self._planner = Planner(max_entries=config.batch_size)
        self._items: dict[int, Outgoing] = {}  # seq -> its outgoing form, until settled
        self._first_sent: dict[int, float] = {}  # seq -> first send, oldest first
        self._limits: dict[str, int] = {}
        self._staged: Outgoing | None = None
        self._warming: threading.Thread | None = None
        self._warm_error: BaseException | None = None
        self._ready = False
        self._stopping = False
        self._threads: list[threading.Thread] = []

    # -- for subclasses --------------------------------------------------------------
    def _build(self, message: Message) -> Outgoing | DeliveryError:
        raise NotImplementedError

    def _connect(self) -> None:
        """Get ready on the warm-up thread (build the client, a first round trip)."""

    def _missing_reason(self, queue: str, reason: str) -> str:
        """What a missing queue's RETRIABLE error says (``reason``: that it does not exist)."""
        return f"{reason} (create it; see docs/sinks.md)"

    def _send(self, batch: list[Pending], items: list[Outgoing]) -> None:
        raise NotImplementedError

    def _allowed(self, queue: str) -> bool:
        """Whether a batch of ``queue`` may be taken now (the HTTP sink's per-host limit)."""
        return True

    def _took(self, items: list[Outgoing]) -> None:
        """A batch of these items was taken (under the planner's lock; the HTTP sink counts
        its requests per host)."""

    def _sent_batch(self, items: list[Outgoing]) -> None:
        """A batch of these items is settled (the HTTP sink's per-host count)."""

    # -- relay thread ----------------------------------------------------------------
    def warm_up(self, timeout: float) -> None:
        """Connect (on a thread of its own, bounded by ``timeout``), then start the senders."""
        if self._shared.refused is not None:
            raise self._shared.refused
        if self._ready:
            return
        if self._warming is None:
            self._warm_error = None
            self._warming = threading.Thread(target=self._warm, daemon=True,
                                             name=f"{self.kind}-warm-up-{self.generation}")
            self._warming.start()
        self._warming.join(timeout)
        if self._warming.is_alive():
            raise BrokerError(f"{self.title or self.kind} at {self._where} did not answer within "
                              f"{timeout:g} s (check --brokers and the network)")
        self._warming = None
        if self._warm_error is not None:
            raise self._warm_error
        self._ready = True
        for n in range(self._concurrency):
            thread = threading.Thread(target=self._sender, daemon=True,
                                      name=f"{self.kind}-sink-{self.generation}-{n}")
            thread.start()
            self._threads.append(thread)

    def _warm(self) -> None:
        try:
            self._connect()
        except AccessRefused as exc:
            self._shared.refused = self._shared.refused or exc
            self._warm_error = self._shared.refused
        except BrokerError as exc:
            self._warm_error = exc
        except Exception as exc:
            self._warm_error = BrokerError(f"{self.title or self.kind} at {self._where}: "
                                           f"{mask_secrets(str(exc) or type(exc).__name__)} "
                                           f"(check --brokers and that the {self.peer} answers)")

    def _refuse(self, message: Message) -> DeliveryError | None:
        built = self._build(message)
        if isinstance(built, DeliveryError):
            return built
        self._staged = built
        return None

    def _submit(self, seq: int, message: Message) -> None:
        item, self._staged = self._staged, None
        assert item is not None
        with self._cond:
            self._items[seq] = item
            self._planner.add(Pending(seq, item.queue, item.group, item.size))
            self._cond.notify()

    def _check_timeout(self) -> None:
        """FATAL when an entry sent first longer than the message timeout ago is unsettled."""
        sent, pending = self._sent, self._pending
        while sent and sent[0][1] not in pending:  # the base class's record, kept trimmed
            sent.popleft()
        with self._cond:
            oldest = next(iter(self._first_sent.values()), None)
        if (oldest is not None and self._fatal is None
                and self._clock() - oldest > self._message_timeout):
            self._fail(f"no reply within {self._message_timeout:g} s of sending (message "
                       f"timeout): the {self.peer} is stalled or unreachable")

    def _stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + self._stop_wait()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._close_client()

    def _stop_wait(self) -> float:
        """How long ``close`` waits for the sender threads, in seconds."""
        return 5.0

    def _close_client(self) -> None:
        """Release the client (after the senders stopped)."""

    # -- sender threads --------------------------------------------------------------
    def _sender(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
                if batch is None:
                    return
                items = [self._items[p.seq] for p in batch]
                self._took(items)
            try:
                self._send(batch, items)
            except Exception as exc:  # a bug must not leave events unreported for ever
                self._fail(f"sender failed: {exc!r}")
                return
            finally:
                self._sent_batch(items)

    def _next_batch(self) -> list[Pending] | None:
        """Wait (holding _cond) for a batch; None when the sink stops or failed."""
        while not self._stopping and self._fatal is None:
            now = self._clock()
            batch = self._planner.take(now, self._limits, self.default_limit, self._allowed)
            if batch:
                for p in batch:
                    self._first_sent.setdefault(p.seq, now)
                return batch
            ready = self._planner.next_ready()
            self._cond.wait(0.5 if ready is None else min(0.5, max(0.001, ready - now)))
        return None

    def _finish(self, done: list[Pending], again: list[Pending] | None = None,
                delay: float = 0.0) -> None:
        with self._cond:
            for p in done:
                self._items.pop(p.seq, None)
                self._first_sent.pop(p.seq, None)
            self._planner.settle(done, again or [], self._clock() + delay)
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _deliver(self, pendings: list[Pending]) -> None:
        """These entries were acknowledged."""
        if pendings:
            self._report([p.seq for p in pendings], None)
            self._finish(pendings)

    def _give_up(self, pendings: list[Pending], error: DeliveryError) -> None:
        """These entries can never be delivered as they are (``error``): reported, done."""
        if pendings:
            self._report([p.seq for p in pendings], error)
            self._finish(pendings)

    def _retry(self, pendings: list[Pending], reason: str, delay: float | None = None) -> None:
        """Send these entries again after ``delay`` (default: the backoff of their attempts);
        their aggregates' later entries wait for them."""
        if not pendings:
            return
        self._log.warning("%s; sending %d message(s) again", reason, len(pendings),
                          extra={"sink": self.kind})
        attempts = max(p.attempts for p in pendings)
        self._finish([], pendings, backoff_delay(attempts) if delay is None else delay)

    def _missing(self, queue: str, batch: list[Pending], reason: str) -> None:
        """``queue`` does not exist: this batch and every entry waiting for it are reported
        RETRIABLE with Cause.TOPIC_MISSING (retried by the loops, never dead-lettered)."""
        with self._cond:
            dropped = self._planner.drop_queue(queue)
            for p in dropped:
                self._items.pop(p.seq, None)
                self._first_sent.pop(p.seq, None)
        self._finish(batch)
        error = DeliveryError(ErrorKind.RETRIABLE, self._missing_reason(queue, reason),
                              Cause.TOPIC_MISSING)
        self._report([p.seq for p in [*batch, *dropped]], error)

    def _refuse_all(self, refused: AccessRefused, pendings: list[Pending]) -> None:
        """The receiver refused the credentials or permissions: this generation is over."""
        self._shared.refused = self._shared.refused or refused
        self._finish(pendings)
        self._fail(str(refused), refused=self.quiet_refusal)


def planned_factory(sink: Callable[..., PlannedSink[C]], config: C, *,
                    logger: logging.Logger | None = None,
                    check: Callable[[C], object] | None = None) -> SinkFactory:
    """A factory of ``sink(config, ...)``s, numbering their generations and sharing an access
    refusal (``SharedState``).

    ``check``: run once first (no I/O; an AWS sink's ``make_client``), so a missing region or
    unknown profile is a ConfigError at start-up (exit 2), not a warm-up that WAL mode would
    retry.
    """
    if check is not None:
        check(config)
    generation = 0
    shared = SharedState()

    def build(on_delivery: DeliveryHandler) -> Sink:
        nonlocal generation
        generation += 1
        return sink(config, on_delivery, generation=generation, logger=logger, shared=shared)

    return build
