"""Exactly-once delivery into Kafka for WAL mode (docs/design.md, exactly-once delivery).

The DeliveryMode (wal/stream/delivery.py) behind ``run --exactly-once``. Per replication session:

1. **Start-up** (after the slot is ours, before anything is read): a new producer calls
   ``init_transactions`` - fencing the previous owner of this source's transactional.id -
   then reads the checkpoint topic up to the last stable offset (``choose``: refuses
   another cluster's checkpoint unless ``--reset-checkpoint``) and logs an error when
   ``read_committed`` consumers do not see what the slot was confirmed for
   (``committed_view_behind``: the broker lost or hides a committed transaction). A
   producer kept from the previous session aborts what it left open and keeps its
   in-memory checkpoint: only it can have written one since.
2. **Replay**: a transaction whose commit record lies before the checkpoint is skipped
   whole (the loop confirms it at its Commit); the split one skips the events already
   in Kafka (ReplayFilter).
3. **Batching**: the first admitted event begins a Kafka transaction; it commits at a
   PostgreSQL commit boundary once TxnBatch says so (interval, events, bytes), or on a
   tick when no PostgreSQL transaction is open, with the checkpoint record as its last
   message. Only then does ``CommittedTracker.committed`` let the slot move past its
   events.
4. **Errors** of the transaction calls: retriable → call again (bounded); abortable →
   abort and replay from the checkpoint on a new replication session
   (``KafkaTransactionAborted``, a SourceLost); fatal or fenced → ``ProducerFailed``: a
   new producer and step 1 - a fenced relay then finds the slot taken and stands by.
5. **Dead letters** inside a transaction: a message too large or with an illegal topic is
   dead-lettered *before* it is produced, so it cannot doom the transaction; an event
   the broker still refuses aborts the transaction, and in the replay it goes to the
   dead-letter topic (remembered by event id). librdkafka fails a whole batch when the
   broker refuses it as too large, so of a round of "too large" reports only the largest
   event is taken as the culprit; a replay that fails again takes the next one.

It must not import a broker client (the sink does the Kafka calls) nor read the stream.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_relay.config import TxnLimits
from cdc_relay.delivery.engine import ProducerFailed
from cdc_relay.errors import BrokerError, RelayError, SourceLost
from cdc_relay.logs import event_fields
from cdc_relay.model import Begin, InFlight, Lsn, Message, OutboxEvent
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind, Sink
from cdc_relay.sink.transactions import TransactionalSink, TxnError, TxnErrorKind
from cdc_relay.stats import TxnStats
from cdc_relay.wal.exactly_once.checkpoint import (
    SKIP_ALL,
    Checkpoint,
    ReplayFilter,
    checkpoint_key,
    choose,
    committed_view_behind,
)
from cdc_relay.wal.exactly_once.txn_policy import CommittedTracker, TxnBatch

log = logging.getLogger("cdc_relay.exactly_once")

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_HEADER_OVERHEAD = 64  # a generous bound on the record framing librdkafka adds


def _name(event: InFlight) -> str:
    """What names an event across replays: its id; for a captured table's message, whose id
    (the table at the change's LSN) its row's other messages share, the id and the op
    (``d``, ``tombstone``, ``c`` of a primary-key change)."""
    return event.id if type(event) is OutboxEvent else f"{event.id} {event.event_type}"


class KafkaTransactionAborted(SourceLost):
    """The Kafka transaction was aborted: replay from the checkpoint on a new session."""


@dataclass(frozen=True, slots=True)
class ExactlyOnceSettings:
    """Everything the mode needs besides the sink (validated by the CLI and the app)."""

    system_id: str
    slot: str
    limits: TxnLimits = field(default_factory=TxnLimits)
    reset_checkpoint: bool = False
    max_message_bytes: int = 1_000_000  # the producer's message.max.bytes
    call_timeout: float = 30.0  # per transaction call, retries included
    checkpoint_timeout: float = 60.0  # reading the checkpoint topic to its end


class ExactlyOnce:
    """The exactly-once DeliveryMode; see the module docstring."""

    admits = True  # every event joins the open Kafka transaction

    def __init__(self, config: ExactlyOnceSettings, stats: TxnStats | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self.stats = stats or TxnStats()
        self._clock = clock
        self._key = checkpoint_key(config.system_id, config.slot)
        self._reset = config.reset_checkpoint
        self._checkpoint: Checkpoint | None = None  # the last committed one
        self._sink: TransactionalSink | None = None
        self._tracker = CommittedTracker()
        self._batch = TxnBatch(config.limits)
        self._replay = ReplayFilter(None)
        self._refused: dict[str, DeliveryError] = {}  # _name(event) -> why the broker refused it
        self._legal_topics: set[str] = set()
        # too large this round: _name(event) -> (payload size, the refusal)
        self._suspects: dict[str, tuple[int, DeliveryError]] = {}
        self._failure: str | None = None
        self._last_token = -1  # token of the last event admitted into the open transaction
        self._last_end = Lsn(0)  # newest PostgreSQL commit end seen
        self._commit_lsn: Lsn | None = None  # commit record LSN of the open PostgreSQL txn

    # -- session start -----------------------------------------------------------------
    def start(self, sink: Sink, start: Lsn) -> CommittedTracker:
        """Fence and read the checkpoint (new producer) or abort leftovers (kept producer)."""
        txn_sink: TransactionalSink = sink  # type: ignore[assignment]  # built by the app
        self._sink = txn_sink
        self._failure = None
        self._batch = TxnBatch(self._config.limits)
        if not txn_sink.initialized:
            self._call(lambda: txn_sink.init_transactions(self._config.call_timeout),
                       "init_transactions")
            self._checkpoint = self._read_checkpoint(txn_sink, start)
            self._reset = False  # only the first read ignores what is there
        elif txn_sink.in_transaction:
            self._abort("the previous replication session ended with it open")
        checkpoint = self._checkpoint
        self._replay = ReplayFilter(checkpoint)
        self._last_end = Lsn(max(start, checkpoint.lsn if checkpoint else 0))
        self.stats.checkpoint_lsn = int(checkpoint.lsn) if checkpoint else 0
        log.info("exactly-once: checkpoint %s, slot at %s",
                 checkpoint.lsn if checkpoint else "none", start,
                 extra={"checkpoint_lsn": str(checkpoint.lsn) if checkpoint else None})
        self._tracker = CommittedTracker(start)
        return self._tracker

    def _read_checkpoint(self, sink: TransactionalSink, confirmed: Lsn) -> Checkpoint | None:
        """The checkpoint read_committed consumers see; says so when their view lags the log."""
        config = self._config
        try:
            views = sink.read_checkpoint_views(config.checkpoint_timeout)
        except BrokerError as exc:
            raise ProducerFailed(str(exc)) from exc
        checkpoint = choose(views.committed_records(), system_id=config.system_id, slot=config.slot,
                            reset=self._reset)
        behind = committed_view_behind(views, system_id=config.system_id, slot=config.slot,
                                       confirmed=confirmed, fenced=True)
        if behind is not None:
            log.error("exactly-once: the committed view of the checkpoint topic is behind: %s",
                      behind)
        return checkpoint

    # -- the stream --------------------------------------------------------------------
    def begin(self, begin: Begin) -> int:
        batch = self._batch
        batch.begin_pg()
        self._commit_lsn = begin.commit_lsn
        skip = self._replay.skip(begin.commit_lsn)
        if 0 < skip < SKIP_ALL:
            batch.pg_events = skip  # what the checkpoint says is in Kafka already
            log.info("replay: skipping the first %d events of the split transaction at %s",
                     skip, begin.commit_lsn)
        return skip

    def admit(self, token: int, event: InFlight, message: Message) -> DeliveryError | None:
        batch = self._batch
        if batch.should_split():
            self._commit(partial=True)
        if not batch.open:
            self._begin_transaction()
        reason = (self._refused and self._refused.get(_name(event))) or self._refusal(message)
        batch.added(len(message.value or b""))
        self._last_token = token
        return reason

    def _refusal(self, message: Message) -> DeliveryError | None:
        """Why the broker would refuse ``message`` (checked before it can doom the transaction)."""
        topic = message.topic
        if topic not in self._legal_topics:
            if not _LEGAL_TOPIC.match(topic) or topic in (".", ".."):
                return DeliveryError(ErrorKind.PERMANENT, f"TOPIC_EXCEPTION: illegal topic name "
                                     f"{topic!r} (checked before producing)")
            if len(self._legal_topics) < 10_000:  # topics come from event data: bounded cache
                self._legal_topics.add(topic)
        size = len(message.value or b"") + len(message.key or b"") + _HEADER_OVERHEAD + sum(
            len(k) + len(v) for k, v in message.headers)
        if size > self._config.max_message_bytes:
            return DeliveryError(
                ErrorKind.PERMANENT, f"MSG_SIZE_TOO_LARGE: message of about {size} bytes is too "
                f"large for message.max.bytes={self._config.max_message_bytes} (checked before "
                "producing)", Cause.TOO_LARGE)
        return None

    def commit(self, end_lsn: Lsn) -> None:
        self._batch.commit_pg()
        self._commit_lsn = None
        if end_lsn > self._last_end:
            self._last_end = end_lsn
        self._raise_failure()
        if self._batch.should_close(self._clock()):
            self._commit(partial=False)

    def tick(self, now: float) -> float:
        self._raise_failure()
        batch = self._batch
        if batch.should_close(now):
            self._commit(partial=False)
        if batch.open and not batch.in_pg_txn:  # wake up when the interval is over
            return max(0.001, self._config.limits.interval - batch.age(now))
        return 1.0

    def delivery_failed(self, event: InFlight, error: DeliveryError) -> bool:
        """Any failed delivery dooms the open transaction: abort and replay (next tick).

        Failures other than a refusal (purged after the transaction failed, timed out)
        are consequences: they only end the transaction. A producer that died on its
        own (``fatal_error``) is replaced by the loop before the next tick.
        """
        first = self._failure is None
        if error.kind is ErrorKind.PERMANENT:
            if error.cause is Cause.TOO_LARGE:
                self._suspects[_name(event)] = (len(event.payload), error)
            else:
                self._refused[_name(event)] = error
        if first:
            log.warning("delivery inside the Kafka transaction failed (%s): aborting it and "
                        "replaying%s", error.reason, " with the refused event dead-lettered"
                        if error.kind is ErrorKind.PERMANENT else "", extra=event_fields(event))
            self._failure = f"delivery of event {event.id} failed: {error.reason}"
        return True

    def finish(self) -> None:
        """Commit at a boundary; abort an open transaction cut mid-way (it is replayed)."""
        if self._sink is None or not self._batch.open:
            return
        try:
            if self._batch.in_pg_txn or self._failure is not None:
                self._abort("shutdown inside a PostgreSQL transaction")
            else:
                self._commit(partial=False)
        except RelayError as exc:
            log.warning("exactly-once shutdown: %s; the open transaction will be replayed", exc)

    # -- the Kafka transaction ---------------------------------------------------------
    def _raise_failure(self) -> None:
        """A delivery inside the open transaction failed, or the sink doubts it: abort, replay."""
        failure = self._failure
        if failure is None and self._batch.open:
            failure = self._live_sink().doubt
        if failure is not None:
            self._abort(failure)
            # After a failed batch librdkafka must bump the producer epoch to go on, which
            # not every broker supports: a fresh producer (and checkpoint read) is safe anywhere.
            raise ProducerFailed(f"Kafka transaction aborted: {failure}")

    def _begin_transaction(self) -> None:
        sink = self._live_sink()
        self._call(sink.begin_transaction, "begin_transaction")
        now = self._clock()
        self._batch.opened(now)
        self.stats.open_since = time.monotonic()

    def _commit(self, *, partial: bool) -> None:
        sink, batch, config = self._live_sink(), self._batch, self._config
        previous = self._checkpoint
        if partial:
            if self._commit_lsn is None:
                raise RelayError("--txn-split-events needs each transaction's commit LSN, "
                                 "which this replication stream does not give")
            lsn = previous.lsn if previous else Lsn(0)
            checkpoint = Checkpoint(config.system_id, config.slot, Lsn(max(lsn, self._last_end)),
                                    self._commit_lsn, batch.pg_events)
        else:
            checkpoint = Checkpoint(config.system_id, config.slot, self._last_end)
        self._call(lambda: sink.commit_transaction(self._key, checkpoint.encode(),
                                                   config.call_timeout), "commit_transaction")
        batch.closed()
        self._checkpoint = checkpoint
        self.stats.committed += 1
        self.stats.open_since = None
        self.stats.checkpoint_lsn = int(checkpoint.lsn)
        self._tracker.committed(self._last_token)

    def _abort(self, reason: str) -> None:
        """Abort the open transaction; its events are replayed from the checkpoint."""
        sink = self._live_sink()
        if self._suspects:
            culprit = max(self._suspects, key=lambda event_id: self._suspects[event_id][0])
            self._refused[culprit] = self._suspects[culprit][1]
            self._suspects.clear()
        log.warning("aborting the Kafka transaction: %s; replaying from checkpoint %s", reason,
                    self._checkpoint.lsn if self._checkpoint else "none")
        self._call(lambda: sink.abort_transaction(self._config.call_timeout), "abort_transaction")
        self._batch.closed()
        self.stats.aborted += 1
        self.stats.open_since = None
        self._failure = None

    def _call(self, call: Callable[[], None], what: str) -> None:
        """Run a transaction call: retry retriable errors; abortable → abort; else a new producer."""
        deadline = self._clock() + self._config.call_timeout
        while True:
            try:
                call()
                return
            except TxnError as exc:
                if exc.kind is TxnErrorKind.RETRIABLE and self._clock() < deadline:
                    log.info("%s: %s; retrying", what, exc.reason)
                    self._live_sink().poll(0.1)
                    continue
                if exc.kind is TxnErrorKind.ABORTABLE and what != "abort_transaction":
                    self._abort(f"{what}: {exc.reason}")
                    raise KafkaTransactionAborted(f"Kafka transaction aborted: {exc.reason}") from exc
                if exc.kind is TxnErrorKind.FENCED:
                    raise ProducerFailed(f"fenced: another relay took over this source "
                                         f"({exc.reason}); standing by") from exc
                raise ProducerFailed(exc.reason) from exc

    def _live_sink(self) -> TransactionalSink:
        if self._sink is None:
            raise RelayError("exactly-once: no session started")
        return self._sink
