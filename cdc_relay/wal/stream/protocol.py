"""Streaming-replication message framing (pure; no I/O).

Inside the CopyBoth stream that START_REPLICATION opens, the server sends
XLogData (``w``: wal_start, wal_end, send_time, payload) and Primary Keepalive
(``k``: wal_end, send_time, reply-requested) messages; the client answers with Standby
Status Updates (``r``: written, flushed, applied positions, client time, reply flag).
See PostgreSQL's "Streaming Replication Protocol" documentation.

``parse`` returns plain tuples because it runs once per replicated row on the hot path.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.errors import DecodeError
from cdc_relay.model import Change, Lsn

XLOG_DATA = 0x77  # 'w'
KEEPALIVE = 0x6B  # 'k'

# Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
_PG_EPOCH_OFFSET_US = 946_684_800_000_000
_WAL_START = struct.Struct("!Q")
_KEEPALIVE = struct.Struct("!QqB")
_STATUS = struct.Struct("!cQQQqB")
XLOG_HEADER_SIZE = 25  # 'w' + wal_start + wal_end + send_time

# One parsed server message: (XLOG_DATA, wal_start, payload) or (KEEPALIVE, wal_end, reply).
ServerMessage = tuple[int, int, "memoryview | bool"]


class _NoChange:
    def __repr__(self) -> str:
        return "NO_CHANGE"


# What a reader of changes returns for a message that decodes to nothing (None means
# that nothing is buffered).
NO_CHANGE: Final = _NoChange()
# A session's reader: the next change, a keepalive (its ServerMessage), NO_CHANGE, or
# None when no message is complete yet.
ChangeReader = Callable[[], "Change | ServerMessage | _NoChange | None"]


def read_changes(read: Callable[[], ServerMessage | None], decode: DecodeFunction) -> ChangeReader:
    """The reader over ``read`` (a source's next ServerMessage) and ``decode``: each
    XLogData's payload decoded, a keepalive as it came. The pure twin of the compiled
    reader (wal/stream/_cstream.c), and the reader of every source without one."""

    def next_change() -> Change | ServerMessage | _NoChange | None:
        message = read()
        if message is None:
            return None
        kind, position, data = message
        if kind != XLOG_DATA:
            return message
        change = decode(data, position)  # type: ignore[arg-type]  # XLogData: a payload
        return NO_CHANGE if change is None else change

    return next_change


def parse(buf: bytes | memoryview) -> ServerMessage:
    """Split one CopyData message from the server into (kind, position, payload-or-reply)."""
    if not buf:
        raise DecodeError("empty CopyData message from the server")
    kind = buf[0]
    if kind == XLOG_DATA:
        if len(buf) < XLOG_HEADER_SIZE:
            raise DecodeError(f"truncated XLogData message ({len(buf)} bytes)")
        return XLOG_DATA, _WAL_START.unpack_from(buf, 1)[0], memoryview(buf)[XLOG_HEADER_SIZE:]
    if kind == KEEPALIVE:
        if len(buf) < 1 + _KEEPALIVE.size:
            raise DecodeError(f"truncated keepalive message ({len(buf)} bytes)")
        wal_end, _send_time, reply = _KEEPALIVE.unpack_from(buf, 1)
        return KEEPALIVE, wal_end, bool(reply)
    raise DecodeError(f"unknown replication message type {chr(kind)!r}")


def pg_time_us(unix_seconds: float) -> int:
    """Unix time in seconds -> microseconds since 2000-01-01 (the protocol's clock)."""
    return int(unix_seconds * 1_000_000) - _PG_EPOCH_OFFSET_US


def status_update(flushed: Lsn, unix_seconds: float, *, reply: bool = False) -> bytes:
    """A Standby Status Update reporting ``flushed`` as written, flushed and applied.

    Reporting write = flush = apply = the confirmed position keeps the walsender's view
    simple: everything before it is durable downstream, nothing after it is claimed.
    """
    return _STATUS.pack(b"r", flushed, flushed, flushed, pg_time_us(unix_seconds), int(reply))

