"""The WAL relay loop under trouble, against fakes: stop requests, shutdown, backoff,
topic trouble, a refusing dead-letter topic, one stuck event, prompt confirmation.

Time is a fake clock here (the loop reads it every turn), so "how long" is counted in
loop turns and fake seconds, never measured.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from cdc_relay.config import FlowConfig, RouterConfig
from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.errors import DeadLetterRefused, ExitCode, SourceLost
from cdc_relay.model import Lsn
from cdc_relay.routing import Router
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.testing import FakeSink, FakeSinkFactory
from cdc_relay.wal.stream.loop import WalRelay
from cdc_relay.wal.stream.protocol import KEEPALIVE, ChangeReader, ServerMessage, read_changes
from cdc_relay.wal.stream.session import LoopTimings
from tests.unit.wal_harness import FAST, TABLE, Harness, Txn, report_styles, txns

__all__ = ["report_styles"]  # the autouse fixture: every test with both report styles

DLQ_ROUTER = RouterConfig(topic_pattern="t.{aggregate_type}", dead_letter_topic="dlq")


class TickClock:
    """1 ms of fake time per read; runs ``at[n]`` on the n-th read; guards against hangs."""

    def __init__(self, limit: int = 200_000) -> None:
        self.ticks = 0
        self.limit = limit
        self.at: dict[int, list[object]] = {}

    def __call__(self) -> float:
        self.ticks += 1
        for action in self.at.pop(self.ticks, []):
            action()  # type: ignore[operator]
        if self.ticks > self.limit:
            raise AssertionError(f"still running after {self.limit} loop clock reads")
        return self.ticks / 1000


def test_a_stop_request_ends_the_wait_for_room_in_a_full_producer_queue() -> None:
    factory = FakeSinkFactory(hold=True, queue_limit=2)
    harness = Harness(txns(1, 5), factory)
    harness.idle_hook = lambda: None
    clock = TickClock()
    clock.at[50] = [harness.stop.set]
    harness.relay._clock = clock
    harness.run()
    assert len(factory.current.produced) == 2  # the rest was never sent
    assert harness.slot.confirmed == 0


def test_shutdown_keeps_sending_status_updates_while_it_waits_for_acks() -> None:
    factory = FakeSinkFactory(hold=True)  # the acks never come: the broker is frozen
    harness = Harness(txns(2, 3), factory,
                      timings=replace(FAST, status_interval=0.1, shutdown_timeout=2.0))
    at_stop: list[int] = []

    def stop_once_read() -> None:
        if not at_stop:
            at_stop.append(len(harness.slot.statuses))
        harness.stop.set()

    harness.idle_hook = stop_once_read
    harness.relay._clock = TickClock()
    harness.run()
    during_shutdown = len(harness.slot.statuses) - at_stop[0]
    assert during_shutdown >= 10, f"{during_shutdown} status updates in 2 s of shutdown"
    assert harness.slot.confirmed == 0


def test_an_advance_is_confirmed_promptly_not_at_the_next_periodic_update() -> None:
    factory = FakeSinkFactory()
    harness = Harness(txns(3, 2), factory,
                      timings=replace(FAST, status_interval=1000.0, prompt_status=0.05))
    clock = TickClock(limit=10_000)  # 10 fake seconds, far below the periodic 1000 s
    harness.relay._clock = clock
    harness.run()
    assert harness.slot.confirmed == 3000


def test_an_advance_waits_no_longer_than_the_prompt_interval_for_its_status_update() -> None:
    harness = Harness(txns(3, 2), FakeSinkFactory(),
                      timings=replace(FAST, status_interval=1000.0, prompt_status=0.05))
    harness.relay._clock = TickClock(limit=10_000)
    harness.run()
    calls = harness.slot.calls
    final = calls.index(("status", 3000))
    previous = max(i for i, (kind, _) in enumerate(calls[:final]) if kind == "status")
    waits = [timeout for kind, timeout in calls[previous + 1:final] if kind == "wait"]
    assert waits and max(waits) <= 0.05, waits


def test_one_stuck_event_stops_reading_once_the_span_reaches_the_limit() -> None:
    factory = FakeSinkFactory(reorder=lambda ready: [t for t in ready if t != 0])
    harness = Harness(txns(100, 1), factory, flow=FlowConfig(max_inflight_events=10))
    harness.idle_hook = lambda: None
    seen: dict[str, int] = {}

    def look() -> None:
        seen["produced"] = len(factory.current.produced)
        seen["delivered"] = len(factory.current.delivered)

    def unstick() -> None:
        factory.current.reorder = None
        harness.idle_hook = harness._stop_when_done

    clock = TickClock()
    clock.at[2000] = [look]
    clock.at[3000] = [unstick]
    harness.relay._clock = clock
    harness.run()
    assert seen["produced"] <= 10, "read on while one event held the watermark"
    assert seen["delivered"] == seen["produced"] - 1
    assert harness.slot.confirmed == 100_000


@pytest.mark.parametrize("where", ["delivery", "produce"])
@pytest.mark.parametrize("cause", [Cause.TOPIC_MISSING, Cause.TOPIC_FORBIDDEN])
def test_topic_trouble_is_retried_with_a_new_producer_and_never_dead_lettered(
    where: str, cause: Cause
) -> None:
    error = DeliveryError(ErrorKind.RETRIABLE, f"fake {cause.value}", cause)

    def first_two_fail(sink: FakeSink) -> None:
        if sink.generation <= 2:
            (sink.fail_topics if where == "delivery" else sink.reject_topics)["t.order"] = error

    factory = FakeSinkFactory(configure=first_two_fail)
    harness = Harness(txns(3, 2), factory, router=DLQ_ROUTER)
    harness.run()
    assert not [m for sink in factory.sinks for m in sink.messages if m.topic == "dlq"]
    assert harness.relay.stats.dead_lettered == 0
    assert harness.relay.stats.retries_by_reason == {cause.value: 2}
    assert factory.generations == 3
    assert harness.slot.confirmed == 3000
    assert harness.acked_ids() == {e for t in harness.slot.txns for e in t.event_ids}


def test_a_refusing_dead_letter_topic_stops_the_relay_with_its_exit_code() -> None:
    def refuse_dead_letters(sink: FakeSink) -> None:
        assert sink.generation < 5, "replaying the refused dead letter again and again"
        sink.fail_topics["dlq"] = ErrorKind.PERMANENT

    factory = FakeSinkFactory(configure=refuse_dead_letters)
    # "bad-1" has an illegal topic, so it goes to the dead-letter topic, which refuses it.
    harness = Harness([Txn(1000, ["e0-0"]), Txn(2000, ["bad-1"]), Txn(3000, ["e2-0"])],
                      factory, router=DLQ_ROUTER)
    with pytest.raises(DeadLetterRefused, match="dead-letter topic 'dlq' refused") as caught:
        harness.run()
    assert caught.value.exit_code is ExitCode.DEAD_LETTER_REFUSED == 5
    assert factory.generations == 1
    assert harness.slot.confirmed == 1000  # what was acked before it, never past it


class FlakySource:
    """A replication connection that is lost ``lifetime`` fake seconds after it opens."""

    def __init__(self, now: list[float], lifetime: float) -> None:
        self.now = now
        self.lifetime = lifetime
        self.opened = 0.0
        self.answer: ServerMessage | None = None

    def open(self) -> Lsn:
        self.opened = self.now[0]
        return Lsn(0)

    def read(self) -> ServerMessage | None:
        self.now[0] += 1.0
        if self.now[0] - self.opened >= self.lifetime:
            raise SourceLost("fake: connection lost")
        answer, self.answer = self.answer, None
        return answer

    def changes(self, decode: DecodeFunction) -> ChangeReader:
        return read_changes(self.read, decode)

    def wait(self, timeout: float) -> None:
        self.now[0] += timeout

    def refill(self) -> None:
        pass

    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None:
        if reply:  # a live server answers a requested reply with a keepalive
            self.answer = (KEEPALIVE, int(flushed), False)

    def close(self) -> None:
        pass


class RecordingStop(threading.Event):
    """A stop event whose waits return at once and are recorded; set after ``count`` waits."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self.count:
            self.set()
        return self.is_set()


def test_reconnect_backoff_comes_back_down_after_a_healthy_stream() -> None:
    now = [0.0]
    lifetimes = iter([1, 1, 1, 1, 120, 1, 1])
    relay = WalRelay(
        source_factory=lambda: FlakySource(now, next(lifetimes)),
        decoder=_NullDecoder(), router=Router(DLQ_ROUTER, TABLE),
        sink_factory=FakeSinkFactory(), flow=FlowConfig(),
        timings=LoopTimings(reconnect_min=1, reconnect_max=8, healthy_after=60),
        clock=lambda: now[0])
    stop = RecordingStop(count=7)
    relay.run(stop)
    assert stop.waits == [1, 2, 4, 8, 1, 2, 4]


class _NullDecoder:
    def decode(self, payload: bytes | memoryview, wal_start: int) -> None:
        return None

    def reset(self) -> None:
        pass


def test_a_producer_kept_across_a_reconnect_reports_to_the_new_session() -> None:
    factory = FakeSinkFactory()
    harness = Harness(txns(2, 2), factory)
    first_source = harness._source

    def source() -> object:
        made = first_source()
        if len(harness.sources) == 1:  # lost after the first transaction (B, I, I, C)
            read = made.read

            def read_then_lose() -> ServerMessage | None:
                if made.reads == 4:
                    raise SourceLost("fake: connection lost")
                return read()

            made.read = read_then_lose  # type: ignore[method-assign]
        return made

    harness.relay._source_factory = source  # type: ignore[assignment]
    harness.run()
    [sink] = factory.sinks  # drained after the loss, then kept for the second session
    assert len(harness.sources) == 2
    # The first session's two reports were served after it ended (to no session); the
    # second session's four reached it, or nothing would be confirmed.
    assert len(sink.delivered) == 6
    assert harness.slot.confirmed == harness.slot.txns[-1].end_lsn
