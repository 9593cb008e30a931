"""Creating the slot with an exported snapshot, on a replication connection (docs/design.md, backfill).

``CREATE_REPLICATION_SLOT name LOGICAL plugin (SNAPSHOT 'export')`` on a
``replication=database`` connection returns the slot's consistent point and the name of
a snapshot that sees exactly the transactions committed before that point; the slot
streams exactly those committed after it. The snapshot can be imported by another
session (``SET TRANSACTION SNAPSHOT``) only while the creating connection stays idle:
running any other command on it, or closing it, ends the export. So ``ExportedSlot``
holds that connection, runs nothing more on it, and closes it when the backfill is done.
(``pg_create_logical_replication_slot()``, which wal/slot/lifecycle.py uses, exports nothing.)

Must not: read outbox rows, decide whether a backfill is needed (loop.py), or stream
(wal/stream/). Errors leave as DatabaseError (fix named) or ServiceUnavailable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import pq

from cdc_relay.config import ReplicationConfig, validate_slot_name
from cdc_relay.errors import DatabaseError, ServiceUnavailable, SlotBusy, mask_secrets
from cdc_relay.model import Lsn
from cdc_relay.pg.db import open_connection, replication_conninfo

log = logging.getLogger("cdc_relay.replication")


@dataclass(frozen=True, slots=True)
class SlotSnapshot:
    """What CREATE_REPLICATION_SLOT … (SNAPSHOT 'export') returned."""

    slot: str
    consistent_point: Lsn
    snapshot_name: str
    plugin: str
    failover: bool = False  # created as a failover slot (PostgreSQL 17+)


class ExportedSlot:
    """A slot just created with an exported snapshot; the snapshot lives until ``close``."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]], snapshot: SlotSnapshot):
        self._conn: psycopg.Connection[tuple[object, ...]] | None = conn
        self.snapshot = snapshot

    def close(self) -> None:
        """End the export (the slot stays). Idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as exc:  # closing a broken connection: nothing to save
                log.debug("error closing the snapshot's replication connection: %s", exc)

    def __enter__(self) -> ExportedSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_slot_exporting_snapshot(config: ReplicationConfig) -> ExportedSlot:
    """Create ``config.slot`` with ``config.plugin`` and export its snapshot.

    Waits, like any logical slot creation, for transactions running at that moment to
    finish. Raises SlotBusy if the slot already exists (someone else just created it),
    DatabaseError for what a retry will not fix (wal_level, plugin, privileges).
    """
    slot = validate_slot_name(config.slot)
    try:
        conn = open_connection(replication_conninfo(config.dsn), autocommit=True)
    except psycopg.Error as exc:
        raise ServiceUnavailable("cannot open a replication connection to create slot "
                                 f"{slot!r}: {_first_line(exc)}") from exc
    failover = config.failover_slot and conn.info.server_version >= 170000
    options = "SNAPSHOT 'export'" + (", FAILOVER" if failover else "")
    command = f'CREATE_REPLICATION_SLOT "{slot}" LOGICAL "{config.plugin}" ({options})'
    result = conn.pgconn.exec_(command.encode())
    if result.status != pq.ExecStatus.TUPLES_OK:
        sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
        message = mask_secrets((result.error_message or b"").decode(errors="replace").strip())
        conn.close()
        raise _creation_error(sqlstate, message, slot, config.plugin)
    row = [(result.get_value(0, i) or b"").decode() for i in range(result.nfields)]
    # slot_name, consistent_point, snapshot_name, output_plugin
    snapshot = SlotSnapshot(row[0], Lsn.parse(row[1]), row[2], row[3], failover)
    log.info("created slot %s with an exported snapshot at %s", slot, snapshot.consistent_point,
             extra={"slot": slot, "consistent_point": str(snapshot.consistent_point)})
    return ExportedSlot(conn, snapshot)


def _creation_error(sqlstate: str, message: str, slot: str, plugin: str) -> DatabaseError:
    message = " ".join(message.removeprefix("ERROR:").split())
    if sqlstate == "42710":
        return SlotBusy(f"replication slot {slot!r} was created by another process meanwhile")
    if "wal_level" in message:
        return DatabaseError(f"cannot create slot {slot!r}: {message}. Fix: ALTER SYSTEM SET "
                             "wal_level = logical; then restart PostgreSQL")
    if "may not be used as an output plugin" in message or "could not access file" in message:
        return DatabaseError(
            f"cannot create slot {slot!r} with plugin {plugin!r}: {message}. Fix: install and "
            "allow the plugin (cdc-relay doctor shows how), or use --plugin pgoutput")
    if sqlstate == "42501" or "permission" in message:
        return DatabaseError(f"cannot create slot {slot!r}: {message}. Fix: ALTER ROLE <user> "
                             "REPLICATION (or connect as a superuser)")
    return DatabaseError(f"cannot create slot {slot!r}: {message} (SQLSTATE {sqlstate or '?'})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return mask_secrets(text.splitlines()[0] if text else repr(exc))
