"""The ExactlyOnce delivery mode against a fake transactional sink (no broker, no loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cdc_relay.config import TxnLimits
from cdc_relay.delivery.engine import ProducerFailed
from cdc_relay.model import Begin, CapturedMessage, Lsn, Message, OutboxEvent
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.sink.transactions import CheckpointViews, TxnError, TxnErrorKind
from cdc_relay.wal.exactly_once.checkpoint import SKIP_ALL, Checkpoint, checkpoint_key
from cdc_relay.wal.exactly_once.mode import ExactlyOnce, ExactlyOnceSettings, KafkaTransactionAborted

SYS, SLOT = "7301", "cdc_relay"


@dataclass
class FakeTxnSink:
    """Records the transaction calls; ``fail`` scripts errors per call name."""

    records: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)
    aborted: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)  # after them
    initialized: bool = False
    in_transaction: bool = False
    doubt: str | None = None
    calls: list[str] = field(default_factory=list)
    committed: list[Checkpoint] = field(default_factory=list)
    fail: dict[str, list[TxnErrorKind]] = field(default_factory=dict)
    fatal_error: DeliveryError | None = None

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        kinds = self.fail.get(name)
        if kinds:
            raise TxnError(kinds.pop(0), f"scripted {name} failure")

    def init_transactions(self, timeout: float) -> None:
        self._maybe_fail("init")
        self.initialized = True

    def read_checkpoint_views(self, timeout: float) -> CheckpointViews:
        self.calls.append("read")
        committed = [(offset, key, value) for offset, (key, value) in enumerate(self.records)]
        logged = [*committed, *((len(committed) + i, key, value)
                                for i, (key, value) in enumerate(self.aborted))]
        return CheckpointViews(committed, logged, stable_offset=len(logged))

    def begin_transaction(self) -> None:
        self._maybe_fail("begin")
        self.in_transaction = True
        self.doubt = None

    def commit_transaction(self, key: bytes, checkpoint: bytes, timeout: float) -> None:
        self._maybe_fail("commit")
        self.in_transaction = False
        self.records.append((key, checkpoint))
        self.committed.append(Checkpoint.decode(checkpoint))

    def abort_transaction(self, timeout: float) -> None:
        self._maybe_fail("abort")
        self.in_transaction = False

    def produce(self, message: Message, token: int) -> None: ...
    def poll(self, timeout: float) -> int:
        return 0
    def flush(self, timeout: float) -> int:
        return 0
    def pending(self) -> int:
        return 0
    def close(self, timeout: float) -> None: ...
    def warm_up(self, timeout: float) -> None: ...


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _mode(clock: Clock, **limits: object) -> ExactlyOnce:
    config = ExactlyOnceSettings(system_id=SYS, slot=SLOT, max_message_bytes=1000,
                               limits=TxnLimits(**{"interval": 0.1, **limits}))  # type: ignore[arg-type]
    return ExactlyOnce(config, clock=clock)


def _event(n: int, size: int = 10) -> tuple[OutboxEvent, Message]:
    event = OutboxEvent(f"e{n}", "order", f"o-{n}", "Placed", b"x" * size)
    return event, Message("outbox.event.order", b"k", event.payload, [("id", event.id.encode())])


class Stream:
    """Feeds the mode like the loop would: tokens from the tracker, hooks in order."""

    def __init__(self, mode: ExactlyOnce, sink: FakeTxnSink, start: int = 100) -> None:
        self.mode = mode
        self.tracker = mode.start(sink, Lsn(start))  # type: ignore[arg-type]
        self.produced: list[str] = []
        self.dead: dict[str, str] = {}  # event id -> why it was dead-lettered
        self.dead_ops: list[str] = []  # their event types, in order

    def txn(self, commit_lsn: int, events: list[tuple[OutboxEvent, Message]], end: int) -> None:
        self.tracker.begin()
        skip = self.mode.begin(Begin(1, Lsn(commit_lsn)))
        for event, message in events:
            if skip:
                skip -= 1
                continue
            token = self.tracker.produced()
            refusal = self.mode.admit(token, event, message)
            self.produced.append(event.id)
            if refusal is not None:
                self.dead[event.id] = refusal.reason
                self.dead_ops.append(event.event_type)
            self.tracker.delivered(token)  # the broker acked it inside the transaction
        self.tracker.commit(Lsn(end))
        self.mode.commit(Lsn(end))


def test_start_fences_then_reads_and_commits_only_at_boundaries_after_the_interval() -> None:
    clock, sink = Clock(), FakeTxnSink()
    stream = Stream(_mode(clock), sink)
    assert sink.calls == ["init", "read"]
    stream.txn(200, [_event(1), _event(2)], end=210)
    assert not sink.committed and stream.tracker.confirmed == Lsn(100)  # interval not over
    clock.now = 0.2
    stream.txn(300, [_event(3)], end=310)  # a boundary after the interval: commit
    assert [cp.lsn for cp in sink.committed] == [Lsn(310)]
    assert stream.tracker.confirmed == Lsn(310)
    assert sink.records[-1][0] == checkpoint_key(SYS, SLOT)


def test_start_up_says_so_when_read_committed_readers_miss_what_the_slot_confirmed(
        caplog: pytest.LogCaptureFixture) -> None:
    hidden = (checkpoint_key(SYS, SLOT), Checkpoint(SYS, SLOT, Lsn(90)).encode())
    with caplog.at_level("ERROR", logger="cdc_relay.exactly_once"):
        Stream(_mode(Clock()), FakeTxnSink(aborted=[hidden]))  # the slot is at 0/64
    [line] = [r.getMessage() for r in caplog.records]
    assert "committed view of the checkpoint topic is behind" in line
    assert "confirmed at 0/64, past checkpoint 0/5A" in line
    caplog.clear()
    with caplog.at_level("ERROR", logger="cdc_relay.exactly_once"):
        hidden = (checkpoint_key(SYS, SLOT), Checkpoint(SYS, SLOT, Lsn(900)).encode())
        Stream(_mode(Clock()), FakeTxnSink(aborted=[hidden]))  # ahead of the slot: a replay
    assert not caplog.records


def test_a_tick_commits_an_idle_transaction_but_never_inside_a_postgres_transaction() -> None:
    clock, sink = Clock(), FakeTxnSink()
    mode = _mode(clock)
    stream = Stream(mode, sink)
    stream.txn(200, [_event(1)], end=210)
    stream.tracker.begin()
    mode.begin(Begin(2, Lsn(300)))
    mode.admit(stream.tracker.produced(), *_event(2))
    clock.now = 5.0
    mode.tick(clock.now)
    assert not sink.committed  # mid PostgreSQL transaction
    stream.tracker.commit(Lsn(310))
    mode.commit(Lsn(310))
    assert [cp.lsn for cp in sink.committed] == [Lsn(310)]


def test_a_restart_skips_whole_transactions_covered_by_the_checkpoint() -> None:
    clock, sink = Clock(), FakeTxnSink()
    sink.records = [(checkpoint_key(SYS, SLOT), Checkpoint(SYS, SLOT, Lsn(310)).encode())]
    stream = Stream(_mode(clock), sink, start=100)  # the slot lags the checkpoint
    stream.txn(200, [_event(1)], end=210)
    stream.txn(300, [_event(2)], end=310)
    assert stream.produced == []
    assert stream.tracker.confirmed == Lsn(310)  # skipped transactions are confirmed at once
    stream.txn(400, [_event(3)], end=410)
    assert stream.produced == ["e3"]


def test_split_events_commit_mid_transaction_and_a_replay_skips_exactly_those() -> None:
    clock, sink = Clock(), FakeTxnSink()
    stream = Stream(_mode(clock, interval=60.0, split_events=2), sink)
    big = [_event(n) for n in range(5)]
    stream.tracker.begin()
    stream.mode.begin(Begin(9, Lsn(500)))
    for event, message in big[:3]:
        stream.mode.admit(stream.tracker.produced(), event, message)
    # the third event closed a Kafka transaction holding the first two
    assert sink.committed == [Checkpoint(SYS, SLOT, Lsn(100), Lsn(500), 2)]
    assert stream.tracker.confirmed == Lsn(100)  # the PostgreSQL transaction is not over
    # crash; a new producer replays the transaction from its start
    replay = Stream(_mode(clock, interval=60.0, split_events=2), FakeTxnSink(records=sink.records))
    replay.txn(500, big, end=510)
    assert replay.produced == ["e2", "e3", "e4"]


def test_a_refused_event_aborts_and_is_dead_lettered_in_the_replay() -> None:
    clock, sink = Clock(), FakeTxnSink()
    mode = _mode(clock)
    stream = Stream(mode, sink)
    small, large = _event(1, size=10), _event(2, size=500)
    stream.txn(200, [small, large], end=210)
    error = DeliveryError(ErrorKind.PERMANENT, "MSG_SIZE_TOO_LARGE: Broker: Message size too large",
                          Cause.TOO_LARGE)
    assert mode.delivery_failed(small[0], error) and mode.delivery_failed(large[0], error)
    with pytest.raises(ProducerFailed):
        mode.tick(clock.now)
    assert sink.calls[-1] == "abort" and mode.stats.aborted == 1
    replay = Stream(mode, FakeTxnSink())
    replay.txn(200, [small, large], end=210)
    assert list(replay.dead) == ["e2"]  # the largest of a too-large round is the culprit


def test_a_refused_captured_delete_is_dead_lettered_in_the_replay_without_its_tombstone() -> None:
    """A primary-key change's ``d``, tombstone and ``c`` share the row's id: only the
    refused one of them goes to the dead-letter topic in the replay."""
    clock, sink = Clock(), FakeTxnSink()
    mode = _mode(clock)
    stream = Stream(mode, sink)
    name = "public.items@0/C8"
    row = [(CapturedMessage("shop.public.items", b"k", value, id=name, event_type=op),
            Message("shop.public.items", b"k", value)) for op, value in
           (("d", b"x" * 500), ("tombstone", None), ("c", b"y" * 10))]
    stream.txn(200, row, end=210)  # type: ignore[arg-type]
    error = DeliveryError(ErrorKind.PERMANENT, "RECORD_LIST_TOO_LARGE: refused")
    assert mode.delivery_failed(row[0][0], error)
    with pytest.raises(ProducerFailed):
        mode.tick(clock.now)
    replay = Stream(mode, FakeTxnSink())
    replay.txn(200, row, end=210)  # type: ignore[arg-type]
    assert replay.produced == [name] * 3 and list(replay.dead) == [name]
    assert replay.dead_ops == ["d"]


def test_messages_the_broker_would_refuse_are_dead_lettered_before_producing() -> None:
    clock, sink = Clock(), FakeTxnSink()
    mode = _mode(clock)
    stream = Stream(mode, sink)
    event, message = _event(1)
    bad_topic = Message("outbox.event.no spaces", message.key, message.value, message.headers)
    too_big = Message(message.topic, message.key, b"x" * 2000, message.headers)
    assert mode.admit(stream.tracker.produced(), event, bad_topic) is not None
    refusal = mode.admit(stream.tracker.produced(), event, too_big)
    assert refusal is not None and refusal.cause is Cause.TOO_LARGE and "too large" in refusal.reason
    assert mode.admit(stream.tracker.produced(), event, message) is None


@pytest.mark.parametrize(("kind", "raised"), [
    (TxnErrorKind.ABORTABLE, KafkaTransactionAborted),
    (TxnErrorKind.FATAL, ProducerFailed),
    (TxnErrorKind.FENCED, ProducerFailed),
])
def test_commit_errors_abort_replace_or_stand_by(kind: TxnErrorKind, raised: type[Exception]) -> None:
    clock, sink = Clock(), FakeTxnSink(fail={"commit": [kind]})
    stream = Stream(_mode(clock, max_events=1), sink)
    with pytest.raises(raised) as info:
        stream.txn(200, [_event(1)], end=210)
    assert stream.tracker.confirmed == Lsn(100)
    assert ("abort" in sink.calls) == (kind is TxnErrorKind.ABORTABLE)
    if kind is TxnErrorKind.FENCED:
        assert "fenced" in str(info.value)


def test_retriable_commit_errors_are_retried() -> None:
    clock, sink = Clock(), FakeTxnSink(fail={"commit": [TxnErrorKind.RETRIABLE] * 2})
    stream = Stream(_mode(clock, max_events=1), sink)
    stream.txn(200, [_event(1)], end=210)
    assert sink.calls.count("commit") == 3 and stream.tracker.confirmed == Lsn(210)


def test_a_doubtful_transaction_is_aborted_not_committed() -> None:
    clock, sink = Clock(), FakeTxnSink()
    mode = _mode(clock)
    stream = Stream(mode, sink)
    stream.txn(200, [_event(1)], end=210)
    sink.doubt = "broker connection lost"
    clock.now = 1.0
    with pytest.raises(ProducerFailed):
        mode.tick(clock.now)
    assert not sink.committed and stream.tracker.confirmed == Lsn(100)


def test_a_kept_producer_aborts_what_the_last_session_left_open() -> None:
    clock, sink = Clock(), FakeTxnSink()
    mode = _mode(clock)
    stream = Stream(mode, sink)
    stream.tracker.begin()
    mode.begin(Begin(1, Lsn(200)))
    mode.admit(stream.tracker.produced(), *_event(1))
    # the replication connection dropped; the producer is kept
    Stream(mode, sink)
    assert sink.calls == ["init", "read", "begin", "abort"]


def test_shutdown_commits_at_a_boundary_and_aborts_mid_transaction() -> None:
    clock, sink = Clock(), FakeTxnSink()
    mode = _mode(clock, interval=60.0)
    stream = Stream(mode, sink)
    stream.txn(200, [_event(1)], end=210)
    mode.finish()
    assert [cp.lsn for cp in sink.committed] == [Lsn(210)]
    stream.tracker.begin()
    mode.begin(Begin(2, Lsn(300)))
    mode.admit(stream.tracker.produced(), *_event(2))
    mode.finish()
    assert sink.calls[-1] == "abort" and len(sink.committed) == 1


def test_skip_all_is_what_a_covered_transaction_gets() -> None:
    clock, sink = Clock(), FakeTxnSink()
    sink.records = [(checkpoint_key(SYS, SLOT), Checkpoint(SYS, SLOT, Lsn(310)).encode())]
    mode = _mode(clock)
    Stream(mode, sink)
    assert mode.begin(Begin(1, Lsn(309))) == SKIP_ALL
