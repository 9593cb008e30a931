"""The session with incremental snapshots (wal/stream/session.py + capture/incremental.py).

A scripted replication source: a transaction carrying a signal row, then - once the
session has read the chunk - the chunk's transaction carrying its high watermark. The
chunk's rows are produced as ``op: r`` events at the watermark, under tokens of that
transaction: its commit is confirmed only once every one of them is acknowledged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from cdc_relay.capture.chunks import Chunk, Key, XidSnapshot
from cdc_relay.capture.envelope import SourceInfo, TableCodec
from cdc_relay.capture.incremental import IncrementalSnapshots
from cdc_relay.capture.route import CaptureRouter
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.config import FlowConfig, RouterConfig, TableRef
from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.model import Begin, Change, Commit, Lsn, SnapshotMark, SnapshotSignal
from cdc_relay.routing import Router
from cdc_relay.stats import RelayStats
from cdc_relay.testing import FakeSink
from cdc_relay.wal.stream.protocol import XLOG_DATA, ChangeReader, ServerMessage, read_changes
from cdc_relay.wal.stream.session import LoopTimings, Session, SessionParts
from tests.unit.test_incremental_rules import _Store

SHAPE = TableShape("public", "items", (ColumnShape("id", 23, not_null=True),
                                       ColumnShape("v", 25)), ("id",))
CODEC = TableCodec(SHAPE, ("id", "v"), "shop", False, "__debezium_unavailable_value")


class _Chunks:
    """Three rows, read once; the watermark's window is what the source then sends."""

    def __init__(self) -> None:
        self.window: str | None = None

    def problem(self, schema: str, table: str) -> str | None:
        return None

    def upper_bound(self, schema: str, table: str) -> Key | None:
        return ("3",)

    def read(self, schema: str, table: str, after: Key | None, upto: Key, size: int,
             window: str, safe: Callable[[XidSnapshot], bool]) -> Chunk | None:
        assert safe(XidSnapshot(10, 10))
        self.window = window
        rows: list[list[bytes | object | None]] = [[str(k).encode(), b"x"] for k in (1, 2, 3)]
        return Chunk(CODEC, rows, ("3",), 0, 9, window, more=False)


class _Decoder:
    def __init__(self, chunks: _Chunks) -> None:
        self.chunks = chunks

    def decode(self, payload: bytes | memoryview, wal_start: int) -> Change | None:
        kind = bytes(payload)
        if kind == b"B":
            return Begin(xid=1)
        if kind == b"C":
            return Commit(Lsn(wal_start))
        if kind == b"S":
            return SnapshotSignal("s1", "execute-snapshot",
                                  json.dumps({"data-collections": ["public.items"]}), Lsn(wal_start))
        assert kind == b"M" and self.chunks.window is not None
        return SnapshotMark(self.chunks.window, Lsn(wal_start))

    def reset(self) -> None:
        pass


class _Source:
    """Phase one at once; phase two (the watermark's transaction) once the chunk was read."""

    def __init__(self, chunks: _Chunks, sink: FakeSink, stop: threading.Event) -> None:
        self.script: list[ServerMessage] = [(XLOG_DATA, 90, memoryview(b"B")),
                                             (XLOG_DATA, 95, memoryview(b"S")),
                                             (XLOG_DATA, 100, memoryview(b"C"))]
        self.chunks, self.sink, self.stop = chunks, sink, stop
        self.statuses: list[tuple[int, int]] = []  # (confirmed, r events acknowledged then)
        self.sent_mark = False

    def open(self) -> Lsn:
        return Lsn(0)

    def changes(self, decode: DecodeFunction) -> ChangeReader:
        return read_changes(lambda: self.script.pop(0) if self.script else None, decode)

    def wait(self, timeout: float) -> None:
        if self.chunks.window is not None and not self.sent_mark:
            self.sent_mark = True
            self.script += [(XLOG_DATA, 190, memoryview(b"B")), (XLOG_DATA, 195, memoryview(b"M")),
                            (XLOG_DATA, 200, memoryview(b"C"))]
        elif self.sent_mark and len(self._acked()) < 3:
            self.sink.release([min(t for t, _ in self.sink.produced if t not in self._acked())])
        elif self.sent_mark:
            self.stop.set()

    def _acked(self) -> set[int]:
        return {d.token for d in self.sink.delivered if d.error is None}

    def refill(self) -> None:
        pass

    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None:
        self.statuses.append((int(flushed), len(self._acked())))

    def close(self) -> None:
        pass


def test_a_chunks_rows_are_tokens_of_the_watermarks_transaction() -> None:
    chunks, store, stats = _Chunks(), _Store(), RelayStats()
    snapshots = IncrementalSnapshots(chunks, store, size=10, captured=lambda s, t: True,
                                     instance="i", stats=stats)
    table = TableRef("public", "outbox_events")
    stop = threading.Event()
    sink = FakeSink(lambda token, error: None, hold=True)  # the session's engine reports below
    source = _Source(chunks, sink, stop)
    parts = SessionParts(decoder=_Decoder(chunks), router=Router(RouterConfig(), table),
                         flow=FlowConfig(), timings=LoopTimings(status_interval=0.0), stats=stats,
                         clock=lambda: 0.0,
                         capture=CaptureRouter(SourceInfo("v", "shop", "db"), clock_ns=lambda: 0),
                         snapshots=snapshots)
    session = Session(parts, source, sink, Lsn(0), stop)
    sink.set_handler(session.engine.on_delivery, session.engine.on_delivered)
    session.loop()
    session.shutdown()
    events = [json.loads(m.value or b"") for m in sink.messages]
    assert [(e["op"], e["after"]["id"], e["source"]["snapshot"]) for e in events] == [
        ("r", 1, "incremental"), ("r", 2, "incremental"), ("r", 3, "incremental")]
    assert {e["source"]["lsn"] for e in events} == {195}
    assert (100, 0) in source.statuses  # the signal's transaction: nothing to wait for
    assert all(acked == 3 for confirmed, acked in source.statuses if confirmed >= 200)
    assert source.statuses[-1] == (200, 3)
    assert store.states[("public", "items")] == "done" and stats.incremental_rows == 3
