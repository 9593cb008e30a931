"""A WalRelay over cdc_relay.testing's FakeSlot and a FakeSinkFactory, for unit tests.

Each status update is checked against the acknowledgement invariant at the moment it is
sent; ``run`` stops once the slot confirmed the last transaction (``idle_hook``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from cdc_relay.config import FlowConfig, RouterConfig, TableRef
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.model import OutboxColumns
from cdc_relay.routing import Router
from cdc_relay.testing import FakeSink, FakeSinkFactory, FakeSlot, FakeSource, Txn, wal2json_insert
from cdc_relay.wal.stream.loop import SinkWarmUp, WalRelay
from cdc_relay.wal.stream.session import LoopTimings

__all__ = ["FAST", "TABLE", "Harness", "Txn", "report_styles", "txns"]

TABLE = TableRef("public", "outbox_events")


@pytest.fixture(params=[False, True], ids=["per-report", "batched"], autouse=True)
def report_styles(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test of a module that imports this runs twice: the fake sinks hand successes to
    the session one at a time (``on_delivery``), then a poll's at once (``on_delivered``)."""
    saved = FakeSink.batch_reports_default
    FakeSink.batch_reports_default = request.param
    try:
        yield
    finally:
        FakeSink.batch_reports_default = saved
FAST = LoopTimings(status_interval=0.05, reconnect_min=0, reconnect_max=0, slot_busy_retry=0,
                   shutdown_timeout=1.0)


def _row(event_id: str) -> bytes:
    """Events whose id starts with "bad" get an aggregate type no topic name allows."""
    return wal2json_insert(event_id, "no spaces allowed" if event_id.startswith("bad") else "order")


class Harness:
    """A WalRelay over a FakeSlot and a FakeSinkFactory; ``run`` stops once all is confirmed."""

    def __init__(self, txns: list[Txn], factory: FakeSinkFactory, *,
                 flow: FlowConfig | None = None, router: RouterConfig | None = None,
                 timings: LoopTimings = FAST,
                 first_sink: SinkWarmUp | None = None,
                 source: type[FakeSource] = FakeSource) -> None:
        self.slot = FakeSlot(txns, row=_row)
        self.factory = factory
        self.stop = threading.Event()
        self.idle_hook: Callable[[], None] = self._stop_when_done
        self.sources: list[FakeSource] = []
        self._source_type = source
        self.relay = WalRelay(
            source_factory=self._source, decoder=Wal2JsonDecoder(TABLE, OutboxColumns()),
            router=Router(router or RouterConfig(topic_pattern="t.{aggregate_type}"), TABLE),
            sink_factory=factory, flow=flow or FlowConfig(), timings=timings,
            first_sink=first_sink)

    def _source(self) -> FakeSource:
        source = self._source_type(self.slot, lambda: self.idle_hook(), self._check_invariant)
        self.sources.append(source)
        return source

    def acked_ids(self) -> set[str]:
        """Ids of every event some sink reported delivered."""
        ids: set[str] = set()
        for sink in self.factory.sinks:
            by_token = dict(sink.produced)
            for delivery in sink.delivered:
                if delivery.error is None:
                    ids.add(dict(by_token[delivery.token].headers)["id"].decode())
        return ids

    def _check_invariant(self, flushed: int) -> None:
        acked = self.acked_ids()
        for txn in self.slot.txns:
            if txn.end_lsn <= flushed:
                missing = set(txn.event_ids) - acked
                assert not missing, f"confirmed {flushed} past unacked events {missing}"

    def _stop_when_done(self) -> None:
        for sink in self.factory.sinks:
            sink.release()
        if self.slot.confirmed >= self.slot.txns[-1].end_lsn:
            self.stop.set()

    def run(self) -> None:
        """Run the relay until ``stop`` is set."""
        self.relay.run(self.stop)


def txns(count: int, size: int) -> list[Txn]:
    """``count`` transactions of ``size`` events, ending at LSN 1000, 2000, ..."""
    return [Txn(1000 * (t + 1), [f"e{t}-{i}" for i in range(size)]) for t in range(count)]
