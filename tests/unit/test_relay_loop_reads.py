"""How much one turn of the WAL relay loop reads: on across socket reads, never past the
flow limits, and a run of tokens the tracker knows before any report on it can come."""

from __future__ import annotations

from typing import Any

from cdc_relay.config import FlowConfig
from cdc_relay.testing import FakeSinkFactory, FakeSource
from cdc_relay.wal.stream.protocol import ServerMessage
from tests.unit.wal_harness import Harness, report_styles, txns

__all__ = ["report_styles"]  # the autouse fixture: every test with both report styles


class SocketSource(FakeSource):
    """A FakeSource whose messages arrive in socket reads of ``CHUNK``: ``read`` serves
    only what a ``refill`` or a ``wait`` took in (libpq's buffer)."""

    CHUNK = 4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffered: list[ServerMessage] = []
        self.refills = 0
        self.unread_at_waits: list[int] = []  # messages still in the socket at each wait

    def read(self) -> ServerMessage | None:
        if not self.buffered:
            return None
        self.reads += 1
        return self.buffered.pop(0)

    def _take_in(self) -> None:
        self.buffered += self.script[:self.CHUNK]
        del self.script[:self.CHUNK]

    def refill(self) -> None:
        self.refills += 1
        self._take_in()

    def wait(self, timeout: float) -> None:
        self.unread_at_waits.append(len(self.script))
        super().wait(timeout)
        self._take_in()


def test_a_loop_turn_reads_on_while_the_socket_holds_more() -> None:
    harness = Harness(txns(10, 5), FakeSinkFactory(), source=SocketSource)
    harness.run()
    source = harness.sources[-1]
    assert isinstance(source, SocketSource)
    # 70 messages, 18 socket reads: all of them in the first turn, before any wait.
    assert source.unread_at_waits[0] == 0
    assert source.refills >= 18
    assert harness.slot.confirmed == 10_000


def test_no_socket_read_once_the_bytes_in_flight_reach_the_flow_limit() -> None:
    factory = FakeSinkFactory(hold=True)
    harness = Harness(txns(10, 5), factory, flow=FlowConfig(max_inflight_bytes=1),
                      source=SocketSource)
    harness.idle_hook = lambda: None  # acks stay held until the clock says otherwise
    seen: dict[str, int] = {}
    ticks = {"n": 0}

    def fake_clock() -> float:
        ticks["n"] += 1
        if ticks["n"] == 1000:
            seen["unread"] = len(harness.sources[-1].script)
            factory.current.hold = False
            harness.idle_hook = harness._stop_when_done
        return ticks["n"] / 1000

    harness.relay._clock = fake_clock
    harness.run()
    # One socket read (begin and three events), then the first event's bytes filled the limit.
    assert seen["unread"] == 70 - SocketSource.CHUNK
    assert harness.slot.confirmed == 10_000


def test_reports_served_mid_batch_for_a_full_queue_count() -> None:
    # The third event of the batch finds the producer's queue full: the engine polls, and
    # the reports for the batch's first events must find their tokens known to the tracker.
    factory = FakeSinkFactory(queue_limit=2)
    harness = Harness(txns(3, 10), factory)
    waits = {"n": 0}

    def stop_when_done_or_stuck() -> None:
        waits["n"] += 1
        harness._stop_when_done()
        if waits["n"] > 200:
            harness.stop.set()

    harness.idle_hook = stop_when_done_or_stuck
    harness.run()
    assert harness.slot.confirmed == 3000
    assert harness.relay.stats.published == 30
