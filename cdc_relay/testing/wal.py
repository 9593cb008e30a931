"""WAL mode's fake source: ``FakeSlot`` / ``FakeSource`` (``ReplicationSource``), a scripted
slot that replays, like PostgreSQL, every transaction ending after its confirmed position.

For unit tests of the WAL loop: no server, thread or sleep; the test's script (``on_idle``)
decides when time passes. Must stay small and obvious, and import no driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.errors import SlotBusy
from cdc_relay.model import Lsn
from cdc_relay.wal.stream.protocol import KEEPALIVE, XLOG_DATA, ChangeReader, ServerMessage, read_changes


def wal2json_insert(event_id: str, aggregate_type: str = "order") -> bytes:
    """A wal2json v2 ``I`` message of one outbox row (aggregate ``a-<last char of id>``)."""
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
    """One committed transaction of the FakeSlot: its commit end LSN and its events."""

    end_lsn: int
    event_ids: list[str]


@dataclass
class FakeSlot:
    """The server side: transactions in WAL order (wal2json v2) and the confirmed position."""

    txns: list[Txn]
    confirmed: int = 0
    busy_opens: int = 0  # the next N opens fail with SlotBusy
    opens: int = 0
    statuses: list[int] = field(default_factory=list)
    # ("wait", timeout) and ("status", lsn) in the order the loop did them
    calls: list[tuple[str, float]] = field(default_factory=list)
    row: Callable[[str], bytes] = wal2json_insert  # event id -> the I message's payload
    half_open: bool = False  # the connection went silent: nothing answers a status update

    def messages(self) -> list[ServerMessage]:
        """What START_REPLICATION from the confirmed position streams."""
        out: list[ServerMessage] = []
        for txn in self.txns:
            if txn.end_lsn <= self.confirmed:
                continue  # PostgreSQL skips transactions that end before the slot position
            out.append((XLOG_DATA, txn.end_lsn - 50, memoryview(b'{"action":"B","xid":1}')))
            for i, event_id in enumerate(txn.event_ids):
                out.append((XLOG_DATA, txn.end_lsn - 40 + i, memoryview(self.row(event_id))))
            commit = orjson.dumps({"action": "C", "xid": 1, "nextlsn": str(Lsn(txn.end_lsn))})
            out.append((XLOG_DATA, txn.end_lsn, memoryview(commit)))
        return out


class FakeSource:
    """A ReplicationSource on a FakeSlot.

    ``on_idle`` runs when the loop waits (the script may be drained); ``check(flushed)``
    sees every status update before the slot takes it, e.g. to assert the invariant.
    """

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

    def changes(self, decode: DecodeFunction) -> ChangeReader:
        return read_changes(self.read, decode)

    def wait(self, timeout: float) -> None:
        self.slot.calls.append(("wait", timeout))
        self.on_idle()

    def refill(self) -> None:
        """Nothing arrives but while the loop waits (``on_idle``)."""

    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None:
        assert flushed >= self.slot.confirmed, "confirmed LSN went backwards"
        self.check(flushed)
        self.slot.confirmed = int(flushed)
        self.slot.statuses.append(int(flushed))
        self.slot.calls.append(("status", int(flushed)))
        if reply:
            self.slot.calls.append(("reply requested", int(flushed)))
            if not self.slot.half_open:  # a live server answers with a keepalive at once
                self.script.append((KEEPALIVE, int(flushed), False))

    def close(self) -> None:
        pass
