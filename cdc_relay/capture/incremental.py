"""Incremental snapshots: DBLog's watermark window, as Debezium's incremental snapshots.

Owns ``IncrementalSnapshots``, the session's partner for a table snapshotted while the
stream goes on (docs/table-cdc.md, incremental snapshots; docs/design.md, the capture
room). Its vocabulary is capture/chunks.py (``XidSnapshot``, ``Chunk``, the ``Window``,
the edge's Protocols), its signals capture/signals.py (``parse_signal``).

One table at a time, in primary-key order, ``size`` rows per chunk:

1. **Read** (``tick``, between two of the session's reads of the stream): the
   ``ChunkSource`` begins a REPEATABLE READ transaction, hands its snapshot to ``safe``,
   SELECTs the next chunk (keys after the last one, up to the table's largest key when
   the snapshot began) and writes the high watermark - a transactional logical decoding
   message naming the window - then commits. The chunk's rows go into the ``Window``,
   by message key. The window opens *at the stream position the session has reached*:
   every change read so far was already produced, every change read from now on is
   after it. That position precedes any low watermark the read could write, so the
   window is DBLog's or wider (a low watermark is not needed: the reader and the stream
   are one thread here).
2. **Stream** (``streamed``): a change of the table while the window is open drops its
   keys (old and new) from the window - the streamed event carries that key's state.
3. **High watermark** (``mark``): the window's remaining rows are returned, as ``op: r``
   CapturedRows at the watermark's LSN, for the session to produce now; the next chunk
   is read at the next ``tick``.

Why a row is never older than a streamed event before it: a remaining row's key had no
change in the window, and every transaction committed before the window opened is
visible to the chunk's snapshot - unless it was committed in the WAL but not yet visible
(a commit waiting for a synchronous standby): ``safe`` refuses a snapshot that does not
see a transaction of the table already streamed (``_recent``), and the chunk is read
again a moment later. Every change committed after the watermark comes after the rows.

**Progress** is the ``ProgressStore``'s (a table on the primary): a chunk's last key is
written once the AckTracker's low watermark passed the chunk's last token (``tick``'s
``low``), so a restart - the session's ``resume`` - reads on from the next chunk; a chunk
read or produced but not yet acknowledged is read again (at least once). Signals are
recorded with their id, so a signal replayed after a restart does not restart its table.

Must not: do I/O (the source and the store are the PostgreSQL edge's, wal/incremental/),
read the clock (``tick`` gets it), produce or confirm anything (the session does).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc_relay.capture.chunks import (
    Chunk,
    ChunkSource,
    Key,
    ProgressStore,
    TableGone,
    TableProgress,
    Window,
    XidSnapshot,
)
from cdc_relay.capture.jsonw import dumps
from cdc_relay.capture.signals import INCREMENTAL, Request, SignalRefused, parse_signal
from cdc_relay.model import CapturedRow, SnapshotMark, SnapshotSignal
from cdc_relay.stats import RelayStats

__all__ = ["RETRY_AFTER", "IncrementalSnapshots"]

log = logging.getLogger("cdc_relay.snapshot")

RETRY_AFTER = 0.2  # seconds before a chunk whose snapshot was not safe is read again


@dataclass(slots=True)
class _Emitted:
    """A chunk produced, waiting for its tokens' acknowledgements (``end``: past its last)."""

    end: int
    progress: TableProgress
    last_key: Key | None
    rows: int
    finished: bool


class IncrementalSnapshots:
    """See the module docstring. ``captured(schema, table)``: whether the table is captured."""

    def __init__(self, source: ChunkSource, store: ProgressStore, *, size: int,
                 captured: Callable[[str, str], bool], instance: str,
                 stats: RelayStats | None = None) -> None:
        self._source = source
        self._store = store
        self._size = size
        self._captured = captured
        self._instance = instance
        self._stats = stats or RelayStats()
        self._queue: deque[TableProgress] = deque()
        self._window: Window | None = None
        self._due = False  # a chunk is to be read at the next tick
        self._retry_at = 0.0
        self._counter = 0
        self._emitted: deque[_Emitted] = deque()
        self._pending: _Emitted | None = None  # returned by ``mark``, its end not yet known
        self._recent: set[int] = set()  # xids of the table's changes streamed lately

    @property
    def active(self) -> TableProgress | None:
        """The table being snapshotted."""
        return self._queue[0] if self._queue else None

    # -- the session's calls -----------------------------------------------------------
    def resume(self) -> None:
        """A new session (its tokens start again): forget what is in flight, read on from
        the store's progress."""
        self._window, self._pending = None, None
        self._emitted.clear()
        self._recent.clear()
        self._queue = deque(self._store.unfinished())
        self._due = bool(self._queue)
        self._count()

    def signal(self, signal: SnapshotSignal) -> None:
        """A row inserted into the signal table."""
        try:
            request = parse_signal(signal.id, signal.type, signal.data)
        except SignalRefused as exc:
            log.warning("snapshot signal refused: %s", exc)
            return
        if request is None:
            return
        if request.action == "stop":
            self._stop(request)
            return
        accepted = []
        for schema, table in request.tables:
            problem = (f"{schema}.{table} is not captured (add it to --capture first)"
                       if not self._captured(schema, table) else self._source.problem(schema, table))
            if problem is not None:
                log.warning("snapshot signal %r refused for %s.%s: %s", request.signal_id,
                            schema, table, problem)
            else:
                accepted.append((schema, table))
        if not accepted:
            return
        self._store.queue(request.signal_id, accepted)
        # a table asked for again under a new signal starts again from its first key
        self._drop([p for p in self._queue if (p.schema, p.table) in accepted
                    and p.signal_id != request.signal_id])
        known = {(p.schema, p.table, p.signal_id) for p in self._queue}
        for progress in self._store.unfinished():
            if (progress.schema, progress.table, progress.signal_id) not in known:
                self._queue.append(progress)
                log.info("incremental snapshot of %s queued (signal %s)", progress.qualified,
                         progress.signal_id)
        self._due = self._due or (self._window is None and bool(self._queue))
        self._count()

    def streamed(self, row: CapturedRow) -> None:
        """A streamed change of a captured table (before it is produced)."""
        active = self.active
        if active is None or row.op == "t" or row.op == "r":
            return
        shape = row.table.shape
        if shape.name != active.table or shape.schema != active.schema:
            return
        if row.xid is not None:
            self._recent.add(row.xid)
        window = self._window
        if window is None:
            return
        for image in (row.old, row.new):
            if image is not None:
                key = _message_key(row.table, image)
                if key is not None:
                    window.drop(key)

    def mark(self, mark: SnapshotMark) -> list[CapturedRow]:
        """A high watermark: the rows to produce now, as ``op: r`` (none when it is not
        this relay's open window's)."""
        window = self._window
        if window is None or mark.window != window.window:
            return []
        self._window = None
        chunk, progress = window.chunk, self.active
        assert progress is not None
        rows = [CapturedRow(chunk.codec, "r", values, None, mark.lsn, chunk.xid, chunk.read_us,
                            None, INCREMENTAL) for values in window.rows.values()]
        self._pending = _Emitted(-1, progress, chunk.last_key, len(rows), not chunk.more)
        self._advance(chunk)
        return rows

    def emitted(self, end: int) -> None:
        """The rows ``mark`` returned were given the tokens before ``end``."""
        if self._pending is not None:
            self._pending.end = end
            self._emitted.append(self._pending)
            self._pending = None

    def tick(self, low: int, now: float) -> None:
        """Between reads of the stream: record acknowledged chunks (every token below
        ``low`` is), read the next chunk when one is due."""
        while self._emitted and self._emitted[0].end <= low:
            done = self._emitted.popleft()
            done.progress.rows += done.rows
            self._stats.incremental_rows += done.rows
            if done.finished:
                self._store.finished(done.progress)
                log.info("incremental snapshot of %s finished: %d rows", done.progress.qualified,
                         done.progress.rows)
            else:
                self._store.progress(done.progress, done.last_key)
        if self._due and now >= self._retry_at:
            self._read(now)

    # -- inside --------------------------------------------------------------------------
    def _advance(self, chunk: Chunk) -> None:
        """After a chunk: the next one of its table, or the next table."""
        progress = self._queue[0]
        progress.last_key = chunk.last_key if chunk.last_key is not None else progress.last_key
        if not chunk.more:
            self._queue.popleft()
            self._recent.clear()
            self._count()
        self._due = bool(self._queue)

    def _read(self, now: float) -> None:
        progress = self._queue[0]
        if progress.upto is None and not self._begin(progress):
            return
        assert progress.upto is not None
        self._counter += 1
        name = f"{self._instance}:{self._counter}"
        try:
            chunk = self._source.read(progress.schema, progress.table, progress.last_key,
                                      progress.upto, self._size, name, self._safe)
        except TableGone as exc:
            self._end(progress, f"stopped: {exc}", stopped=True)
            return
        if chunk is None:
            self._retry_at = now + RETRY_AFTER
            return
        self._due = False
        window = Window(name, chunk)
        for values in chunk.rows:
            key = _message_key(chunk.codec, values)
            assert key is not None  # a snapshotted table has a primary key
            window.rows[key] = values
        self._window = window

    def _begin(self, progress: TableProgress) -> bool:
        """A table's first chunk is due: its largest key (False: it ended already)."""
        problem = None if self._captured(progress.schema, progress.table) else "no longer captured"
        problem = problem or self._source.problem(progress.schema, progress.table)
        if problem is not None:
            self._end(progress, f"stopped: {problem}", stopped=True)
            return False
        upto = self._source.upper_bound(progress.schema, progress.table)
        if upto is None:
            self._end(progress, "finished: the table is empty", stopped=False)
            return False
        progress.upto = upto
        self._store.started(progress)
        log.info("incremental snapshot of %s started (chunks of %d rows)", progress.qualified,
                 self._size)
        return True

    def _end(self, progress: TableProgress, why: str, *, stopped: bool) -> None:
        """The table's snapshot ends before a chunk of it was read."""
        if stopped:
            log.warning("incremental snapshot of %s %s", progress.qualified, why)
            self._store.stopped([(progress.schema, progress.table)])
        else:
            log.info("incremental snapshot of %s %s", progress.qualified, why)
            self._store.finished(progress)
        self._drop([progress])
        self._due = bool(self._queue)
        self._count()

    def _safe(self, snapshot: XidSnapshot) -> bool:
        """The chunk's snapshot sees every transaction of the table already streamed."""
        self._recent = {xid for xid in self._recent if not snapshot.settled(xid)}
        return all(snapshot.visible(xid) for xid in self._recent)

    def _stop(self, request: Request) -> None:
        names = set(request.tables)
        stopping = [p for p in self._queue if not names or (p.schema, p.table) in names]
        self._store.stopped(list(request.tables) or None)
        for progress in stopping:
            log.info("incremental snapshot of %s stopped (signal %s)", progress.qualified,
                     request.signal_id)
        self._drop(stopping)
        self._count()

    def _drop(self, leaving: list[TableProgress]) -> None:
        """Take tables out of the queue; the active one's open window is forgotten."""
        if not leaving:
            return
        active = self.active
        self._queue = deque(p for p in self._queue if all(p is not q for q in leaving))
        if active is not None and any(active is q for q in leaving):
            self._window, self._pending = None, None
            self._recent.clear()
            self._due = bool(self._queue)

    def _count(self) -> None:
        self._stats.incremental_tables = len(self._queue)


def _message_key(codec: Any, image: list[bytes | object | None]) -> bytes | None:
    """The row's message key payload (what consumers key on), or None (no key)."""
    try:
        key = codec.key(image)
    except ValueError:
        return None
    return None if key is None else dumps(key)
