"""WAL mode's publications: the outbox's pgoutput publication and table CDC's.

Owns creating a publication if missing and bringing an existing one in line (publishes
inserts - for table CDC updates and deletes too -, includes the tables, publishes a
partitioned outbox via its root), first read-only and then, only if something has to
change, in a transaction under the advisory lock every ``init`` and start-up check takes
(``ADVISORY_LOCK_KEY``, pg/schema.py), so concurrent starts are safe.

Must not: create or drop slots (wal/slot/lifecycle.py), touch the outbox table or its
rows, interpolate user text into SQL, or change server settings.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import TableRef, validate_identifier
from cdc_relay.errors import ConfigError
from cdc_relay.pg.db import translate_error, validated_table
from cdc_relay.pg.schema import ADVISORY_LOCK_KEY, Outcome


def table_identifier(table: TableRef) -> sql.Identifier:
    """The table as a qualified SQL identifier."""
    return sql.Identifier(table.schema, table.name)


def publication_in_place(conn: psycopg.Connection[Any], publication: str, table: TableRef,
                         partitioned: bool) -> Outcome:
    """``_ensure_publication``, on an autocommit connection: first read-only, without a
    transaction or the lock - what every restart finds, a publication already in place,
    costs two queries instead of six (docs/design.md, start-up) - then, only if something
    has to change, again under the advisory lock that init and other relays take.
    """
    try:
        outcome = _ensure_publication(conn, publication, table, partitioned, may_change=False)
        if outcome is not None:
            return outcome
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            outcome = _ensure_publication(conn, publication, table, partitioned)
    except psycopg.Error as exc:
        raise translate_error(exc, f"creating publication {publication!r}") from exc
    assert outcome is not None
    return outcome


def _ensure_publication(
    conn: psycopg.Connection[Any],
    publication: str,
    table: TableRef,
    partitioned: bool,
    *,
    may_change: bool = True,
) -> Outcome | None:
    """The publication exists, publishes inserts, includes the table, and - for a
    partitioned outbox - publishes via the partition root.

    Rows of a partitioned table are logged under their partition; without
    ``publish_via_partition_root`` pgoutput sends them under the partition's name and
    the decoder (which knows only the outbox's name) would never see an event. With
    ``may_change`` False it only reads: None when something would have to change.
    """
    ident = table_identifier(table).as_string(conn)
    row = conn.execute(
        "SELECT oid, puballtables, pubinsert, pubviaroot FROM pg_publication WHERE pubname = %s",
        (publication,),
    ).fetchone()
    pub = sql.Identifier(publication)
    if row is None:
        if not may_change:
            return None
        options = "publish = 'insert'" + (", publish_via_partition_root = true" if partitioned else "")
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (" + options + ")").format(
                pub, table_identifier(table)
            )
        )
        return Outcome.CREATED
    pub_oid, all_tables, publishes_inserts, via_root = row
    if not publishes_inserts:
        raise ConfigError(
            f"publication {publication!r} does not publish inserts: run ALTER PUBLICATION "
            f"{publication} SET (publish = 'insert'), or pass another --publication"
        )
    outcome = Outcome.EXISTED
    if partitioned and not via_root:
        if not may_change:
            return None
        # Only the named parameter changes; the publish list stays as it was.
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(pub)
        )
        outcome = Outcome.UPDATED
    if all_tables or _publication_includes(conn, pub_oid, publication, table, ident):
        return outcome
    if not may_change:
        return None
    conn.execute(
        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, table_identifier(table))
    )
    return Outcome.UPDATED


def is_partitioned(conn: psycopg.Connection[Any], table_ident: str) -> bool:
    """True if the (quoted, qualified) table is a partitioned table (relkind 'p')."""
    row = conn.execute(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass", (table_ident,)
    ).fetchone()
    return bool(row and row[0])


def _publication_includes(conn: psycopg.Connection[Any], pub_oid: int, publication: str,
                          table: TableRef, table_ident: str) -> bool:
    # pg_publication_rel: the table itself was added (for a partitioned table without
    # publish_via_partition_root, pg_publication_tables lists only its partitions, and
    # adding it again fails with "already member of publication").
    # pg_publication_tables: it is included some other way (FOR TABLES IN SCHEMA).
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_publication_rel WHERE prpubid = %s"
        " AND prrelid = %s::regclass) OR EXISTS (SELECT 1 FROM pg_publication_tables"
        " WHERE pubname = %s AND schemaname = %s AND tablename = %s)",
        (pub_oid, table_ident, publication, table.schema, table.name),
    ).fetchone()
    return bool(row and row[0])

def ensure_publication(conn: psycopg.Connection[Any], table: TableRef, publication: str) -> Outcome:
    """The pgoutput publication alone, on an autocommit connection (the backfill's start).

    ``run --snapshot initial`` creates the slot itself (with an exported snapshot), and
    pgoutput needs the publication to exist before the slot does.
    """
    table = validated_table(table)
    validate_identifier(publication, "publication name")
    try:
        partitioned = is_partitioned(conn, table_identifier(table).as_string(conn))
    except psycopg.Error as exc:
        raise translate_error(exc, f"looking up {table}") from exc
    return publication_in_place(conn, publication, table, partitioned)


_CAPTURE_PUBLISH = "insert, update, delete"


def ensure_capture_publication(conn: psycopg.Connection[Any], publication: str,
                               tables: list[tuple[str, str]], *, truncate: bool = False) -> Outcome:
    """``run --capture`` / ``init --capture``: the publication publishes inserts, updates and
    deletes (and truncates with ``truncate``: ``run --capture-truncate``; one that already
    publishes them keeps doing so) and includes every captured table (created with them if
    missing), on an autocommit connection, under the advisory lock ``init`` takes. Call it
    before the slot is created: pgoutput needs the publication at the slot's start.

    Publishing updates and deletes applies to the whole publication, so the outbox's own
    deletes (a retention job's) arrive too; the decoder ignores them (docs/table-cdc.md).
    """
    validate_identifier(publication, "publication name")
    pub = sql.Identifier(publication)
    idents = [sql.Identifier(schema, table) for schema, table in tables]
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
            row = conn.execute("SELECT oid, puballtables, pubinsert AND pubupdate AND pubdelete,"
                               " pubtruncate FROM pg_publication WHERE pubname = %s",
                               (publication,)).fetchone()
            publish = _CAPTURE_PUBLISH + (", truncate" if truncate or (row and row[3]) else "")
            if row is None:
                conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = '"
                                     + publish + "')").format(pub, sql.SQL(", ").join(idents)))
                return Outcome.CREATED
            outcome = Outcome.EXISTED
            if not row[2] or (truncate and not row[3]):
                conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish = '" + publish
                                     + "')").format(pub))
                outcome = Outcome.UPDATED
            for (schema, table), ident in zip(tables, idents, strict=True):
                if row[1] or _publication_includes(conn, row[0], publication,
                                                   TableRef(schema, table), ident.as_string(conn)):
                    continue
                conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, ident))
                outcome = Outcome.UPDATED
            return outcome
    except psycopg.Error as exc:
        raise translate_error(exc, f"adding the captured tables to publication {publication!r}") from exc
