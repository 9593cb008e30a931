"""One replication connection's worth of WAL mode: read → decode → route → produce → confirm.

A ``Session`` lives from START_REPLICATION to the end of that connection. It owns the
AckTracker for the stream, its delivery engine (the events in flight) and the
status-update timer, and talks only to the small protocols below (a source, a decoder)
plus the router and a sink, all handed in as ``SessionParts`` - so fakes drive it in
unit tests. The delivery mode (wal/stream/delivery.py) is called at the points marked
"delivery mode": it makes the tracker and decides, for exactly-once, what is skipped and
when a Kafka transaction commits.

What it does about trouble is the delivery engine's (delivery/engine.py, one per
session; docs/design.md, failure rules): a delivery refused for good is re-sent to the
dead-letter topic under the same token, so the tracker waits for *that* ack; a
dead-letter topic that refuses it too stops the relay (DeadLetterRefused); a missing or
forbidden topic (TopicUnavailable) and every other failed or timed-out delivery
(ProducerFailed) end the session: the caller replaces the producer and replays from the
slot. A decode error is fatal. Nothing is ever skipped. The session keeps what is WAL
mode's: the tracker (LSN confirmation), the status updates, the watchdog.

It must not block on one side while the other needs service: WAL is read only while
the tracker's span and the bytes in flight are under the flow limits, status updates
go out on a timer while backed up and while shutting down (the walsender drops a silent
client after ``wal_sender_timeout``), and a stop request is honoured inside every wait.
Reconnecting, backoff and building producers are the caller's (wal/stream/loop.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cdc_relay.acks import AckTracker
from cdc_relay.capture.incremental import IncrementalSnapshots
from cdc_relay.capture.route import CaptureRouter, Routed
from cdc_relay.config import FlowConfig
from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.delivery.engine import Engine, ProducerFailed, Stopped
from cdc_relay.errors import DeadLetterRefused, SourceLost
from cdc_relay.model import (
    Begin,
    CapturedRow,
    Change,
    Commit,
    IgnoredMessage,
    Lsn,
    Message,
    OutboxEvent,
    SnapshotMark,
    SnapshotSignal,
)
from cdc_relay.routing import Router, RoutingError
from cdc_relay.sink.base import (
    DeliveryError,
    ErrorKind,
    ProduceRejected,
    QueueFull,
    Sink,
)
from cdc_relay.stats import RelayStats
from cdc_relay.wal.stream.delivery import AtLeastOnce, DeliveryMode
from cdc_relay.wal.stream.protocol import ChangeReader

log = logging.getLogger("cdc_relay.relay")

_READ_BATCH = 1000  # messages read per loop turn before the sink is served again


class ReplicationSource(Protocol):
    """What the loop needs from a replication connection (see wal/stream/replication.py)."""

    def open(self) -> Lsn: ...
    def changes(self, decode: DecodeFunction) -> ChangeReader:
        """The reader the loop pulls from (after ``open``): protocol.read_changes over the
        source's own read, or a compiled one that does the same."""
    def wait(self, timeout: float) -> None: ...
    def refill(self) -> None:
        """Take in what the connection already received, without waiting."""
    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None: ...
    def close(self) -> None: ...


class Decoder(Protocol):
    """Plugin payload bytes → Change (see decoding/). ``wal_start`` is the XLogData's
    position as a plain int: a compiled decoder makes the Lsn itself, for less."""

    def decode(self, payload: bytes | memoryview, wal_start: int) -> Change | None: ...
    def reset(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LoopTimings:
    """Intervals of the loop; defaults suit production, tests may shorten them.

    ``prompt_status`` is the least time between two status updates sent because the
    confirmed position advanced (so a crash replays little); ``status_interval`` is the
    periodic one that keeps the walsender's timeout at bay. ``healthy_after``: a stream
    that ran this long brings the reconnect backoff back to ``reconnect_min``.
    """

    status_interval: float = 1.0
    prompt_status: float = 0.05
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    healthy_after: float = 60.0
    slot_busy_retry: float = 2.0
    shutdown_timeout: float = 20.0  # + closing: exit well within 30 s with a frozen broker
    sink_warmup: float = 10.0
    # The watchdog: after a third of this without a byte from the server, ask it for a
    # keepalive; after all of it, the connection is taken for half-open and dropped.
    replication_timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class SessionParts:
    """What every session of one relay shares."""

    decoder: Decoder
    router: Router
    flow: FlowConfig
    timings: LoopTimings
    stats: RelayStats
    clock: Callable[[], float]
    mode: DeliveryMode = field(default_factory=AtLeastOnce)  # wal/stream/delivery.py
    capture: CaptureRouter | None = None  # run --capture: captured rows' messages
    snapshots: IncrementalSnapshots | None = None  # run --capture: incremental snapshots


class Session:
    """One replication connection's worth of state: tracker, engine, timers."""

    def __init__(self, parts: SessionParts, source: ReplicationSource, sink: Sink,
                 start: Lsn, stop: threading.Event) -> None:
        self.source = source
        self.sink = sink
        self.stop = stop
        self.mode = parts.mode
        self.tracker: AckTracker = parts.mode.start(sink, start)  # delivery mode
        self.skip = 0  # events of the current transaction still to skip (delivery mode)
        self._admit = parts.mode.admit if parts.mode.admits else None  # per event: bind once
        self.stats = parts.stats
        # The delivery engine: the events in flight, the dead letters, the failure rules.
        self.engine = Engine(sink, parts.router, parts.stats, self.tracker.delivered_all,
                             serve=self._serve, stop=stop, failed=parts.mode.delivery_failed)
        self.inflight = self.engine.inflight
        self._next_change = source.changes(parts.decoder.decode)
        self._route = parts.router.route  # per event: bound once, as the sink's produce
        self._capture = parts.capture
        self._snapshots = parts.snapshots
        if self._snapshots is not None:
            self._snapshots.resume()  # this session's tokens start afresh
        self._sink_produce = sink.produce
        self._clock = parts.clock
        self._max_events = parts.flow.max_inflight_events
        self._max_bytes = parts.flow.max_inflight_bytes
        self._timings = parts.timings
        self.next_status = 0.0  # the periodic status update is due
        self.next_prompt = 0.0  # a status update for an advance may go out
        self.sent = Lsn(start)
        self.heard = parts.clock()  # the last time the server sent anything (the watchdog)
        self.asked = False  # a keepalive was requested since

    def _serve(self) -> None:
        """While the producer's queue is full: keep the walsender's timeout at bay."""
        self._maybe_send_status(self._clock())

    # -- the loop ------------------------------------------------------------------
    def loop(self) -> None:
        """Stream until the stop request; raise what ends the session early."""
        source, sink, stop, tracker, clock = self.source, self.sink, self.stop, self.tracker, self._clock
        engine = self.engine
        try:
            while not stop.is_set():
                sink.poll(0)
                engine.check()
                wake = self.mode.tick(clock())  # delivery mode
                if engine.redo:
                    engine.produce_redo()
                if self._snapshots is not None:  # acked chunks recorded, the next one read
                    self._snapshots.tick(tracker.low, clock())
                self.stats.last_tick = clock()
                if tracker.inflight >= self._max_events or engine.inflight_bytes >= self._max_bytes:
                    # Backpressure: leave the WAL unread (libpq buffers nothing more), but
                    # keep telling the walsender we are alive. Unread is not unheard.
                    sink.poll(0.05)
                    self.heard = clock()
                elif self._read_batch() == 0:
                    timeout = min(0.005 if self.inflight else 0.1, wake)
                    if tracker.confirmed != self.sent:  # an advance waits only for its update
                        timeout = min(timeout, max(0.0, self.next_prompt - clock()))
                    self._watchdog(clock())
                    source.wait(timeout)
                else:
                    self.heard, self.asked = clock(), False
                self._maybe_send_status(clock())
        except Stopped:
            return

    def _watchdog(self, now: float) -> None:
        """Silence from the server: ask for a keepalive, then give the connection up.

        An idle walsender may legitimately say nothing for a while (our status updates
        keep its timeout at bay), so silence first earns a status update with a reply
        requested, which a live server answers at once; only silence past
        ``replication_timeout`` is a half-open connection (docs/design.md, continuity).
        """
        silent = now - self.heard
        limit = self._timings.replication_timeout
        if silent >= limit:
            raise SourceLost(f"nothing from the server for {silent:.0f}s, not even a requested "
                             "keepalive: the replication connection is half-open (a network "
                             "partition, a NAT or load-balancer timeout); reconnecting")
        if not self.asked and silent >= limit / 3:
            self.source.send_status(self.tracker.confirmed, reply=True)
            self.asked = True

    def _maybe_send_status(self, now: float, *, force: bool = False) -> None:
        """The periodic status update, or a prompt one when the confirmed LSN advanced."""
        confirmed = self.tracker.confirmed
        if force or now >= self.next_status or (confirmed != self.sent and now >= self.next_prompt):
            self.source.send_status(confirmed)
            self.next_status = now + self._timings.status_interval
            self.next_prompt = now + self._timings.prompt_status
            if confirmed != self.sent:
                self.sent = confirmed
                self.stats.confirmed_lsn = int(confirmed)
            self.stats.inflight = len(self.inflight)

    def _read_batch(self) -> int:
        next_change, tracker, engine = self._next_change, self.tracker, self.engine
        inflight, route, produce, admit = self.inflight, self._route, self._sink_produce, self._admit
        refill, max_bytes = self.source.refill, self._max_bytes
        # The span grows by at most one per message read (one token per event) and only
        # shrinks otherwise: capping the batch at the room left keeps it within the flow
        # limit without asking the tracker after every event.
        batch = min(_READ_BATCH, self._max_events - tracker.inflight)
        count = 0
        # Tokens are numbered here, from the tracker's next one, and registered with it in
        # runs (produced_many): a Python call per event costs ~700 instructions
        # (docs/design.md, WAL mode's hot path). A run is registered before anything can
        # report on it or ask the tracker (reports come only from the sink's poll or
        # flush): before every other message is handled, before the delivery mode's
        # admit (exactly-once may commit a Kafka transaction), before engine.produce
        # (it polls while the producer's queue is full), and when the batch ends.
        seq = registered = tracker.next_token
        try:
            while count < batch:
                change = next_change()
                if change is None:
                    # libpq's buffer holds no complete message: take in what the socket
                    # already has (never waits) and read on, rather than end the loop
                    # turn per socket read (~20 events) - but not past the bytes in
                    # flight: libpq buffers nothing more once they reach the flow limit.
                    if engine.inflight_bytes >= max_bytes:
                        break
                    refill()
                    change = next_change()
                    if change is None:
                        break
                count += 1
                if type(change) is OutboxEvent:
                    if self.skip:  # delivery mode: already delivered
                        self.skip -= 1
                        continue
                    # Engine.send, inlined - here, not in a method of its own (as above).
                    token = seq
                    seq += 1
                    inflight[token] = change
                    engine.inflight_bytes += len(change.payload)
                    try:
                        out = route(change)
                    except RoutingError as exc:
                        out = engine.dead_letter(token, DeliveryError(ErrorKind.PERMANENT, str(exc)))
                    if admit is not None:  # delivery mode
                        registered = tracker.produced_many(seq - registered)
                        refusal = admit(token, change, out)
                        if refusal is not None:
                            out = engine.dead_letter(token, refusal)
                    try:
                        produce(out, token)  # the common case, without the retry loop
                    except (QueueFull, ProduceRejected):
                        registered = tracker.produced_many(seq - registered)
                        engine.produce(token, out)
                    continue
                if seq != registered:
                    registered = tracker.produced_many(seq - registered)
                if type(change) is Commit:
                    self.skip = 0
                    tracker.commit(change.end_lsn)
                    self.mode.commit(change.end_lsn)  # delivery mode
                elif type(change) is Begin:
                    tracker.begin()
                    self.skip = self.mode.begin(change)  # delivery mode
                elif type(change) is IgnoredMessage:
                    self._ignored(change)
                elif type(change) is tuple:  # a keepalive: (KEEPALIVE, wal_end, reply requested)
                    tracker.idle_position(Lsn(change[1]))
                    if change[2]:
                        self._maybe_send_status(self._clock(), force=True)
                elif type(change) is CapturedRow:
                    seq = registered = self._captured(change, seq)
                elif type(change) is SnapshotMark or type(change) is SnapshotSignal:
                    seq = registered = self._incremental(change, seq)
        finally:
            tracker.produced_many(seq - registered)
        return count

    def _captured(self, row: CapturedRow, seq: int) -> int:
        """A captured table's row (docs/design.md, the capture room): each of its messages
        (an event, a tombstone; an unencodable row's dead letter) takes the next token, as
        an outbox event does, all registered with the tracker before the first is produced.
        Like an outbox event, each message counts for the delivery mode: skipped while
        ``skip`` says it is in Kafka already, admitted into the open Kafka transaction
        (exactly-once). Returns the next token."""
        assert self._capture is not None  # a CapturedRow comes only from the capture decoder
        if self._snapshots is not None:  # drops the row's keys from an open window
            self._snapshots.streamed(row)
        routed = self._capture.route(row)
        messages, problems = routed.messages, routed.problems
        if self.skip:  # delivery mode: the first ones (or all) are delivered already
            done = min(self.skip, len(messages))
            self.skip -= done
            messages = messages[done:]
            problems = None if problems is None else problems[done:]
            if not messages:
                return seq
            routed = Routed(messages, routed.problem, problems, routed.made_ns)
        if routed.problem is None:
            self._count_captured(routed, row)
        engine, first, admit = self.engine, seq, self._admit
        for message in messages:
            self.inflight[seq] = message
            engine.inflight_bytes += len(message.payload)
            seq += 1
        registered = self.tracker.produced_many(seq - first)
        for token, message in enumerate(messages, first):
            out: Message = message
            problem = routed.problem if problems is None else problems[token - first]
            if problem is not None:
                out = engine.dead_letter(token, DeliveryError(ErrorKind.PERMANENT, problem))
            if admit is not None:  # delivery mode
                refusal = admit(token, message, out)
                if refusal is not None:
                    out = engine.dead_letter(token, refusal)
            engine.produce(token, out)
        return registered

    def _incremental(self, change: SnapshotMark | SnapshotSignal, seq: int) -> int:
        """Incremental snapshots (capture/incremental.py): a signal is queued; at a high
        watermark the chunk's remaining rows are produced as ``op: r`` events, each
        taking the next token like a streamed row. Returns the next token."""
        snapshots = self._snapshots
        if snapshots is None:
            if type(change) is SnapshotSignal:
                log.warning("snapshot signal %r ignored: this relay takes no incremental "
                            "snapshots (--exactly-once; docs/table-cdc.md)", change.id)
            return seq
        if type(change) is SnapshotSignal:
            snapshots.signal(change)
            return seq
        assert type(change) is SnapshotMark
        for row in snapshots.mark(change):
            seq = self._captured(row, seq)
        snapshots.emitted(seq)
        return seq

    def _count_captured(self, routed: Routed, row: CapturedRow) -> None:
        """The per-table metrics: events by table and op, the table's lag (its commit to
        the event's making)."""
        counts, lag = self.stats.captured, self.stats.captured_lag
        problems = routed.problems
        for i, message in enumerate(routed.messages):
            if message.value is None or (problems is not None and problems[i] is not None):
                continue  # a tombstone; a truncated table's dead letter
            table = message.aggregate_id
            counts[(table, message.event_type)] = counts.get((table, message.event_type), 0) + 1
            lag[table] = routed.made_ns / 1e9 - row.commit_us / 1e6

    def _ignored(self, message: IgnoredMessage) -> None:
        self.stats.ignored_messages += 1
        if self.stats.ignored_messages == 1:  # then only counted (metrics)
            log.warning("ignored a non-transactional %r logical decoding message: only "
                        "pg_logical_emit_message(true, ...) is an outbox event (use "
                        "cdc_relay.outbox.emit_message); further ones are only counted",
                        message.prefix)

    def shutdown(self) -> None:
        """Stop reading; wait (bounded) for in-flight acks, confirm what was acked.

        Status updates keep flowing meanwhile, so a walsender with a short
        ``wal_sender_timeout`` does not drop us before the final confirmation.
        """
        clock, sink, engine = self._clock, self.sink, self.engine
        deadline = clock() + self._timings.shutdown_timeout
        try:
            while (engine.redo or sink.pending()) and clock() < deadline:
                if engine.failure is not None and not isinstance(engine.failure, DeadLetterRefused):
                    break  # a failed producer: its acks are not coming
                sink.poll(0.1)
                if engine.redo:
                    engine.produce_redo()
                self._maybe_send_status(clock())
        except (Stopped, ProducerFailed, DeadLetterRefused):
            pass  # what is unacked is not confirmed; it is replayed next time
        self.mode.finish()  # delivery mode
        self._maybe_send_status(clock(), force=True)
        log.info("stopped; confirmed %s, %d events unacknowledged", self.tracker.confirmed,
                 len(self.inflight))
