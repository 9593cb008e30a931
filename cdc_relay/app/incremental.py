"""Incremental snapshots' part of ``run --capture`` and the ``snapshot`` command.

Owns where the signal table is (``signal_table``), making it and adding it to the
publication at start-up (``ensure_signal``: a role that may not is one warning, and the
relay streams without incremental snapshots), the session's ``IncrementalSnapshots`` over
the PostgreSQL edge (``build_snapshots``), and ``cdc-relay snapshot``'s signal row
(``request_snapshot``). docs/table-cdc.md, incremental snapshots. Like run.py, it imports
PostgreSQL-side modules inside its functions only.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from cdc_relay.capture.incremental import IncrementalSnapshots
from cdc_relay.capture.modes import TypeModes
from cdc_relay.capture.qualified import data_collection
from cdc_relay.capture.selection import Selection
from cdc_relay.config import CaptureConfig, TableRef
from cdc_relay.errors import RelayError
from cdc_relay.stats import RelayStats

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("cdc_relay")

def signal_table(capture: CaptureConfig | None, outbox: TableRef) -> TableRef:
    """``--signal-table``, or ``cdc_relay_signal`` in the outbox table's schema."""
    from cdc_relay.wal.incremental.state import signal_ref

    return signal_ref(None if capture is None else capture.signal_table, outbox)


def ensure_signal(conn: psycopg.Connection[Any], signal: TableRef, publication: str) -> bool:
    """The signal and progress tables exist and the publication publishes the signal
    table; False (after one warning) when the role may not make them so."""
    from cdc_relay.wal.incremental.state import ensure_tables
    from cdc_relay.wal.slot.setup import ensure_capture_publication

    try:
        ensure_tables(conn, signal)
        ensure_capture_publication(conn, publication, [(signal.schema, signal.name)])
    except RelayError as exc:
        log.warning("incremental snapshots are off: %s", exc)
        return False
    return True


def build_snapshots(capture: CaptureConfig, *, dsn: str, slot: str, signal: TableRef,
                    schemas: bool, modes: TypeModes, stats: RelayStats,
                    primary_dsn: str | None = None) -> IncrementalSnapshots:
    """The sessions' IncrementalSnapshots (no I/O until the first session); ``modes``: the
    relay's type modes, so that an ``r`` row is written as its streamed rows are.

    Decoding on a standby (``primary_dsn``): chunks are read on the standby (``dsn``), the
    watermarks and the progress written on the primary (wal/incremental/chunks.py)."""
    from cdc_relay.wal.incremental.chunks import ChunkReader, EdgeConnection
    from cdc_relay.wal.incremental.state import ProgressTable

    connection = EdgeConnection(dsn)
    writer = None if primary_dsn is None else EdgeConnection(primary_dsn)
    reader = ChunkReader(connection, marker=writer, prefix=capture.prefix, schemas=schemas,
                         placeholder=capture.placeholder, modes=modes,
                         names=(capture.schema_name_adjustment, capture.field_name_adjustment))
    selection = Selection.parse(capture.tables)
    return IncrementalSnapshots(reader, ProgressTable(writer or connection, signal, slot),
                                size=capture.chunk_size, captured=selection.matches,
                                instance=uuid.uuid4().hex[:12], stats=stats)


def request_snapshot(dsn: str, signal: TableRef, tables: list[str], *, stop: bool) -> str:
    """``cdc-relay snapshot``: write the signal row; the line to print."""
    from cdc_relay.pg.db import connect
    from cdc_relay.wal.incremental.state import write_signal

    names = [data_collection(name) for name in tables]  # ConfigError for a malformed name
    with connect(dsn, autocommit=True, application_name="cdc-relay snapshot") as conn:
        ident = write_signal(conn, signal, names, stop=stop)
    what = "stop-snapshot" if stop else "execute-snapshot"
    return f"wrote {what} signal {ident} for {', '.join(names) or 'every table'} into {signal}"
