"""The logical replication stream over psycopg 3's low-level connection (docs/design.md, WAL mode).

psycopg 3 has no replication helper, so this module drives the protocol itself:
``START_REPLICATION SLOT … LOGICAL 0/0 (options)`` on a ``replication=database``
connection, then CopyData messages read with the **non-blocking** ``get_copy_data(1)``
(the blocking form holds the GIL) and Standby Status Updates written back.

The resume point that ``open`` returns is read *after* START_REPLICATION succeeded (on a
short ordinary connection): only then does this session hold the slot, so a relay
standing by cannot report a position older than what the previous holder confirmed
last (PostgreSQL 15 would move the slot back to it). The first session of ``cdc-relay
run`` reads it on the start-up checks' connection, handed over still open
(``position_conn``, used once and closed), instead of opening another (docs/design.md,
start-up); if that connection fails, a new one is opened as for any later session.

Every libpq call is wrapped: a connection error anywhere is ``SourceLost``, and
connecting gives up after ``connect_timeout`` (10 s unless the DSN says otherwise)
instead of libpq's default.

It owns the connection and nothing else: it does not decode payloads, decide what is
safe to confirm, or retry. Errors come out as ``SourceLost`` (reconnect and resume from
the slot), ``SlotBusy`` (another relay is streaming; wait) or ``DatabaseError``
(misconfiguration a retry will not fix).
"""

from __future__ import annotations

import logging
import re
import select
import struct
import time
from typing import Any, NoReturn

import psycopg
from psycopg import pq

from cdc_relay import accel
from cdc_relay.config import ReplicationConfig
from cdc_relay.decoding.compiled import DecodeFunction
from cdc_relay.errors import (
    AccessRefused,
    DatabaseError,
    RelayError,
    SlotBusy,
    SlotLost,
    SourceLost,
    mask_secrets,
)
from cdc_relay.model import Lsn, invalidation_cause
from cdc_relay.pg.db import connection_target, open_connection, plain_conninfo, refused, replication_conninfo
from cdc_relay.pg.endpoint import pooler_error, pooler_refusal, replication_fix
from cdc_relay.wal.stream.protocol import (
    NO_CHANGE,
    XLOG_DATA,
    XLOG_HEADER_SIZE,
    ChangeReader,
    ServerMessage,
    parse,
    read_changes,
    status_update,
)

log = logging.getLogger("cdc_relay.replication")

_WAL_START = struct.Struct("!Q")
# SQLSTATE classes a retry will not fix: bad credentials, missing database, privileges.
_PERMANENT_SQLSTATES = ("28", "3D", "42")


def quote_literal(value: str) -> str:
    """Quote a plugin option value for START_REPLICATION (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def _invalidated(sqlstate: str, message: str) -> bool:
    """START_REPLICATION's answer for a slot PostgreSQL invalidated (wal_status 'lost')."""
    return sqlstate == "55000" and ("invalidated" in message
                                    or "can no longer get changes" in message)


_DUE_TO = re.compile(r'invalidated due to "(\w+)"')


def _cause(message: str) -> str:
    """What PostgreSQL 17+'s 'invalidated due to "<reason>"' means, and its fix."""
    found = _DUE_TO.search(message)
    if found is None:
        return ""
    why, fix = invalidation_cause(found.group(1))
    return f" ({why}; to keep it from happening again, {fix})"


def _wrap_connect_error(exc: psycopg.Error, what: str, dsn: str) -> RelayError:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    message = mask_secrets(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
    if pooler_refusal(exc):
        return pooler_error(dsn, exc)
    if refused(exc):
        fix = (f"{replication_fix(connection_target(dsn).user or None)} (WAL mode streams "
               "over a replication connection)"
               if "replication" in str(exc).lower() else
               "fix the credentials (DSN, PGPASSFILE) or pg_hba.conf")
        return AccessRefused(f"{what}: {message}. Fix: {fix}; retrying cannot fix this")
    if sqlstate.startswith(_PERMANENT_SQLSTATES):
        return DatabaseError(f"{what}: {message}")
    return SourceLost(f"{what}: {message}")


class ReplicationStream:
    """One replication session: open, read messages, send status updates, close."""

    def __init__(self, config: ReplicationConfig, options: list[tuple[str, str]], *,
                 position_conn: psycopg.Connection[Any] | None = None) -> None:
        self._config = config
        self._options = options
        self._position_conn = position_conn  # an open plain connection this stream now owns
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._socket = -1

    def open(self) -> Lsn:
        """Connect and START_REPLICATION; return the slot's confirmed flush LSN (the resume point)."""
        try:
            conn = open_connection(replication_conninfo(self._config.dsn), autocommit=True)
        except psycopg.Error as exc:
            raise _wrap_connect_error(exc, "cannot open a replication connection",
                                      self._config.dsn) from exc
        self._conn = conn
        self._check_slot(conn)
        pgconn = conn.pgconn
        self._start_replication(pgconn)
        confirmed = self._held_position()
        pgconn.nonblocking = 1
        self._pgconn = pgconn
        self._socket = pgconn.socket
        return Lsn.parse(confirmed) if confirmed else Lsn(0)

    def _held_position(self) -> str | None:
        """The slot's confirmed flush LSN, read now that this session holds the slot."""
        borrowed, self._position_conn = self._position_conn, None
        if borrowed is not None:
            try:
                return self._read_position(borrowed)
            except psycopg.Error as exc:  # e.g. closed by the server meanwhile
                log.debug("the start-up connection could not read the slot's position (%s); "
                          "opening a new one", mask_secrets(str(exc).strip()))
            finally:
                borrowed.close()  # one query, then it is done
        try:
            with open_connection(plain_conninfo(self._config.dsn), autocommit=True) as conn:
                return self._read_position(conn)
        except psycopg.Error as exc:
            self.close()
            raise _wrap_connect_error(exc, "cannot read the replication slot's position",
                                      self._config.dsn) from exc

    def _read_position(self, conn: psycopg.Connection[Any]) -> str | None:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
            " WHERE slot_name = %s AND database = current_database()",
            (self._config.slot,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def _check_slot(self, conn: psycopg.Connection[tuple[object, ...]]) -> str | None:
        """The slot's confirmed flush LSN (text); closes and raises if the slot does not fit."""
        slot = self._config.slot
        try:
            # Replication connections speak only the simple query protocol: bind client-side.
            row = psycopg.ClientCursor(conn).execute(
                "SELECT plugin, confirmed_flush_lsn::text FROM pg_replication_slots"
                " WHERE slot_name = %s AND database = current_database()",
                (slot,),
            ).fetchone()
        except psycopg.Error as exc:
            self.close()
            raise _wrap_connect_error(exc, "cannot read the replication slot",
                                      self._config.dsn) from exc
        if row is None:
            # The start-up check found or created the slot: gone now, it is a slot loss
            # (a failover to a server without it, or a drop), never a reason to create one.
            self.close()
            raise SlotLost(f"replication slot {slot!r} no longer exists on this server "
                           "(a failover to a standby without a copy of the slot, or a "
                           "dropped slot)")
        plugin, confirmed = row
        if plugin != self._config.plugin:
            self.close()
            raise DatabaseError(
                f"slot {slot!r} uses plugin {plugin!r}, not {self._config.plugin!r}: pass "
                f"--plugin {plugin}, or drop it with 'cdc-relay slot drop --slot {slot}'"
            )
        return None if confirmed is None else str(confirmed)

    def _start_replication(self, pgconn: pq.abc.PGconn) -> None:
        """Send START_REPLICATION; closes and raises unless the server enters COPY BOTH."""
        slot = self._config.slot
        options = ", ".join(f'"{name}" {quote_literal(value)}' for name, value in self._options)
        command = f'START_REPLICATION SLOT "{slot}" LOGICAL 0/0'
        if options:
            command += f" ({options})"
        try:
            result = pgconn.exec_(command.encode())
        except psycopg.Error as exc:
            self.close()
            raise SourceLost(f"START_REPLICATION failed: {mask_secrets(str(exc))}") from exc
        if result.status != pq.ExecStatus.COPY_BOTH:
            sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
            message = (result.error_message or b"").decode(errors="replace").strip()
            self.close()
            if sqlstate == "55006":
                raise SlotBusy(f"replication slot {slot!r} is active for another process")
            if _invalidated(sqlstate, message):
                raise SlotLost(f"replication slot {slot!r} was invalidated by PostgreSQL: "
                               f"{mask_secrets(' '.join(message.split()))}{_cause(message)}")
            if sqlstate.startswith("28") or sqlstate == "42501":
                raise AccessRefused(f"START_REPLICATION refused: {mask_secrets(message)}. Fix: "
                                    "ALTER ROLE <user> REPLICATION, or connect as its owner")
            if sqlstate.startswith(_PERMANENT_SQLSTATES) or sqlstate.startswith("58"):
                raise DatabaseError(f"START_REPLICATION failed: {mask_secrets(message)}")
            raise SourceLost(f"START_REPLICATION failed: {mask_secrets(message)}")

    def read(self) -> ServerMessage | None:
        """The next buffered message, or None when none is complete yet (never blocks)."""
        pgconn = self._pgconn
        assert pgconn is not None, "read() before open()"
        try:
            nbytes, data = pgconn.get_copy_data(1)
        except psycopg.Error as exc:
            self._read_failed(exc)
        if nbytes > XLOG_HEADER_SIZE and data[0] == XLOG_DATA:
            # The per-row fast path: what parse() does for XLogData, without the call.
            return XLOG_DATA, _WAL_START.unpack_from(data, 1)[0], data[XLOG_HEADER_SIZE:]
        return self._message(nbytes, data)

    def changes(self, decode: DecodeFunction) -> ChangeReader:
        """The session's reader (protocol.read_changes over ``read``): compiled where built
        (wal/stream/_cstream.c), without a Python frame per row; per the process's choice (accel.py)."""
        pgconn = self._pgconn
        assert pgconn is not None, "changes() before open()"
        module = accel.extension("_cstream")
        if module is None:
            return read_changes(self.read, decode)
        reader: ChangeReader = module.Changes(pgconn.get_copy_data, decode, self._message,
                                              self._read_failed, NO_CHANGE)
        return reader

    def _message(self, nbytes: int, data: memoryview) -> ServerMessage | None:
        """What get_copy_data returned, when it is not a row: None (nothing complete yet),
        a parsed message, or SourceLost (the stream ended)."""
        if nbytes > 0:
            return parse(data)
        if nbytes == 0:
            return None
        pgconn = self._pgconn
        raise SourceLost(self._ended_reason(pgconn) if pgconn is not None
                         else "replication stream ended: connection closed")

    @staticmethod
    def _read_failed(exc: Exception) -> NoReturn:
        if isinstance(exc, psycopg.Error):
            raise SourceLost(f"replication connection lost: {mask_secrets(str(exc))}") from exc
        raise exc

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the socket to become readable, then take in what came.

        Not called while backpressured, so libpq never buffers an unread backlog.
        """
        pgconn = self._pgconn
        assert pgconn is not None, "wait() before open()"
        try:
            readable, _, _ = select.select([self._socket], [], [], timeout)
            if readable:
                pgconn.consume_input()
        except (OSError, psycopg.Error) as exc:
            raise SourceLost(f"replication connection lost: {mask_secrets(str(exc))}") from exc

    def refill(self) -> None:
        """Take in what the socket already holds (a non-blocking read), without waiting:
        ``read`` finds no complete message, yet the server may have sent more since.

        As ``wait``: not called while backpressured.
        """
        pgconn = self._pgconn
        assert pgconn is not None, "refill() before open()"
        try:
            pgconn.consume_input()
        except psycopg.Error as exc:
            self._read_failed(exc)

    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None:
        """Report ``flushed`` as written/flushed/applied; also resets the walsender's timeout."""
        pgconn = self._pgconn
        assert pgconn is not None, "send_status() before open()"
        try:
            if pgconn.put_copy_data(status_update(flushed, time.time(), reply=reply)) != 1:
                raise SourceLost(self._ended_reason(pgconn))
            while pgconn.flush() == 1:
                select.select([], [self._socket], [], 1.0)
        except (OSError, psycopg.Error) as exc:
            raise SourceLost(f"replication connection lost: {mask_secrets(str(exc))}") from exc

    def close(self) -> None:
        """Close the connection (the server then releases the slot), and an unused ``position_conn``."""
        borrowed, self._position_conn = self._position_conn, None
        if borrowed is not None:
            borrowed.close()
        conn, self._conn, self._pgconn = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as exc:  # closing a broken connection: nothing to save
                log.debug("error closing replication connection: %s", exc)

    @staticmethod
    def _ended_reason(pgconn: pq.abc.PGconn) -> str:
        message = (pgconn.error_message or b"").decode(errors="replace").strip()
        return "replication stream ended: " + (mask_secrets(message) or "server closed the stream")
