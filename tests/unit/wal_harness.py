"""A scripted replication slot and source for driving WalRelay with fakes (unit tests).

The fake slot behaves like PostgreSQL's: opening it replays every transaction whose
commit end is after the confirmed position. Each status update is checked against the
acknowledgement invariant at the moment it is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from cdc_relay.config import FlowConfig, RouterConfig, TableRef
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import SlotBusy
from cdc_relay.model import Lsn, OutboxColumns
from cdc_relay.routing import Router
from cdc_relay.testing import FakeSinkFactory
from cdc_relay.wal.loop import LoopTimings, WalRelay
from cdc_relay.wal.protocol import XLOG_DATA, ServerMessage

TABLE = TableRef("public", "outbox_events")
FAST = LoopTimings(status_interval=0.05, reconnect_min=0, reconnect_max=0, slot_busy_retry=0,
                   shutdown_timeout=1.0)


def _row(event_id: str) -> bytes:
    aggregate_type = "no spaces allowed" if event_id.startswith("bad") else "order"
    columns = [
        {"name": "id", "value": event_id},
        {"name": "aggregate_type", "value": aggregate_type},
        {"name": "aggregate_id", "value": f"a-{event_id[-1]}"},
        {"name": "event_type", "value": "Changed"},
        {"name": "payload", "value": orjson.dumps({"id": event_id}).decode()},
        {"name": "created_at", "value": "2026-11-30 10:00:00.123+00"},
    ]
    return orjson.dumps({"action": "I", "schema": "public", "table": "outbox_events",
                         "columns": columns})


@dataclass
class Txn:
    end_lsn: int
    event_ids: list[str]


@dataclass
class FakeSlot:
    """The server side: transactions in WAL order and the confirmed position."""

    txns: list[Txn]
    confirmed: int = 0
    busy_opens: int = 0  # the next N opens fail with SlotBusy
    opens: int = 0
    statuses: list[int] = field(default_factory=list)

    def messages(self) -> list[ServerMessage]:
        out: list[ServerMessage] = []
        for txn in self.txns:
            if txn.end_lsn <= self.confirmed:
                continue  # PostgreSQL skips transactions that end before the slot position
            out.append((XLOG_DATA, txn.end_lsn - 50, memoryview(b'{"action":"B","xid":1}')))
            for i, event_id in enumerate(txn.event_ids):
                out.append((XLOG_DATA, txn.end_lsn - 40 + i, memoryview(_row(event_id))))
            commit = orjson.dumps({"action": "C", "xid": 1, "nextlsn": str(Lsn(txn.end_lsn))})
            out.append((XLOG_DATA, txn.end_lsn, memoryview(commit)))
        return out


class FakeSource:
    """A replication connection to the FakeSlot; ``on_idle`` runs when the script is drained."""

    def __init__(self, slot: FakeSlot, on_idle: Callable[[], None],
                 check: Callable[[int], None]) -> None:
        self.slot = slot
        self.on_idle = on_idle
        self.check = check
        self.script: list[ServerMessage] = []
        self.reads = 0

    def open(self) -> Lsn:
        self.slot.opens += 1
        if self.slot.busy_opens:
            self.slot.busy_opens -= 1
            raise SlotBusy("slot busy (fake)")
        self.script = self.slot.messages()
        return Lsn(self.slot.confirmed)

    def read(self) -> ServerMessage | None:
        if not self.script:
            return None
        self.reads += 1
        return self.script.pop(0)

    def wait(self, timeout: float) -> None:
        self.on_idle()

    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None:
        assert flushed >= self.slot.confirmed, "confirmed LSN went backwards"
        self.check(flushed)
        self.slot.confirmed = int(flushed)
        self.slot.statuses.append(int(flushed))

    def close(self) -> None:
        pass


class Harness:
    """A WalRelay over a FakeSlot and a FakeSinkFactory; ``run`` stops once all is confirmed."""

    def __init__(self, txns: list[Txn], factory: FakeSinkFactory, *,
                 flow: FlowConfig | None = None, router: RouterConfig | None = None,
                 timings: LoopTimings = FAST) -> None:
        self.slot = FakeSlot(txns)
        self.factory = factory
        self.stop = threading.Event()
        self.idle_hook: Callable[[], None] = self._stop_when_done
        self.sources: list[FakeSource] = []
        self.relay = WalRelay(
            source_factory=self._source, decoder=Wal2JsonDecoder(TABLE, OutboxColumns()),
            router=Router(router or RouterConfig(topic_pattern="t.{aggregate_type}"), TABLE),
            sink_factory=factory, flow=flow or FlowConfig(), timings=timings)

    def _source(self) -> FakeSource:
        source = FakeSource(self.slot, lambda: self.idle_hook(), self._check_invariant)
        self.sources.append(source)
        return source

    def acked_ids(self) -> set[str]:
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
        self.relay.run(self.stop)


def txns(count: int, size: int) -> list[Txn]:
    """``count`` transactions of ``size`` events, ending at LSN 1000, 2000, ..."""
    return [Txn(1000 * (t + 1), [f"e{t}-{i}" for i in range(size)]) for t in range(count)]
