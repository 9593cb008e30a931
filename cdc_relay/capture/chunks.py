"""Incremental snapshots' vocabulary: what a chunk read returns and what the progress keeps.

Owns ``XidSnapshot`` (which transactions a chunk's read saw), ``Chunk``, the chunk
``Window`` (rows by message key until the high watermark), ``TableProgress`` and the two
Protocols the PostgreSQL edge implements (wal/incremental/): ``ChunkSource`` and
``ProgressStore``. Must not: decide anything (capture/incremental.py) or do I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Chunk", "ChunkSource", "Key", "ProgressStore", "TableGone", "TableProgress",
           "Window", "XidSnapshot"]

Key = tuple[str | None, ...]  # a primary key's values as text, in the key's column order


class TableGone(Exception):
    """The table was dropped or lost its primary key during its snapshot (the message
    says which): its snapshot stops."""


@dataclass(frozen=True, slots=True)
class XidSnapshot:
    """A transaction snapshot (``pg_current_snapshot()``): which transactions it sees."""

    xmin: int
    xmax: int
    xip: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> XidSnapshot:
        """``xmin:xmax:xip,xip`` as PostgreSQL writes it."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def visible(self, xid: int) -> bool:
        """Whether a committed transaction ``xid`` is visible to this snapshot. The stream
        names transactions by their 32-bit xid, the snapshot by 64-bit ones (epoch and
        xid): a committed transaction began before the snapshot, so its epoch is the one
        that puts it below ``xmax``."""
        full = self._full(xid)
        return full < self.xmin or (full < self.xmax and full not in self.xip)

    def settled(self, xid: int) -> bool:
        """Whether ``xid`` ended before every transaction this snapshot saw running (every
        later snapshot sees it too)."""
        return self._full(xid) < self.xmin

    def _full(self, xid: int) -> int:
        full = (self.xmax & ~0xFFFFFFFF) | (xid & 0xFFFFFFFF)
        return full - (1 << 32) if full >= self.xmax else full


@dataclass(slots=True)
class Chunk:
    """What a chunk read returns: the rows (text values, in ``codec``'s column order and
    primary-key order), the last one's key, when and in which transaction it was read,
    the window its high watermark names, and whether the table has rows after it."""

    codec: Any
    rows: list[list[bytes | object | None]]
    last_key: Key | None
    read_us: int
    xid: int | None
    window: str
    more: bool


class ChunkSource(Protocol):
    """The PostgreSQL edge that reads chunks (wal/incremental/chunks.py)."""

    def problem(self, schema: str, table: str) -> str | None:
        """Why the table cannot be snapshotted (missing, no primary key), or None."""

    def upper_bound(self, schema: str, table: str) -> Key | None:
        """The table's largest primary key now (None: the table is empty)."""

    def read(self, schema: str, table: str, after: Key | None, upto: Key, size: int,
             window: str, safe: Callable[[XidSnapshot], bool]) -> Chunk | None:
        """The next chunk and its high watermark; None when ``safe`` refused the snapshot
        (nothing read, no watermark written)."""


@dataclass(slots=True)
class TableProgress:
    """A table's snapshot as the store keeps it: None as ``upto`` until its first chunk."""

    schema: str
    table: str
    signal_id: str
    last_key: Key | None = None
    upto: Key | None = None
    rows: int = 0

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


class ProgressStore(Protocol):
    """The snapshots' durable state on the primary (wal/incremental/state.py)."""

    def unfinished(self) -> list[TableProgress]:
        """The queued and running tables, in the order they were asked for."""

    def queue(self, signal_id: str, tables: list[tuple[str, str]]) -> None:
        """Queue the tables under the signal (a table already queued under that signal
        stays as it is: a replayed signal)."""

    def started(self, progress: TableProgress) -> None:
        """The table's first chunk is about to be read (``upto`` is set)."""

    def progress(self, progress: TableProgress, last_key: Key | None) -> None:
        """Every row up to ``last_key`` is acknowledged (``rows`` in all)."""

    def finished(self, progress: TableProgress) -> None:
        """Every row of the table is acknowledged."""

    def stopped(self, tables: list[tuple[str, str]] | None) -> None:
        """Stop these tables' snapshots (all of them with None)."""


@dataclass(slots=True)
class Window:
    """One chunk between its read and its high watermark: the rows by message key."""

    window: str
    chunk: Chunk
    rows: dict[bytes, list[bytes | object | None]] = field(default_factory=dict)

    def drop(self, key: bytes) -> None:
        """A streamed change touched ``key``: its row is not emitted."""
        self.rows.pop(key, None)
