"""Which tables' rows belong to a partitioned outbox: the catalog half of wal2json's filter.

Rows of a partitioned table are logged under their partition's name. pgoutput can
publish them under the root (``publish_via_partition_root``, wal/slot/publication.py); wal2json
cannot, so its decoder (decoding/wal2json.py) asks ``PartitionTree.refresh`` the first
time an outbox-shaped table name shows up in the stream: is that table in the outbox's
partition tree (``pg_partition_ancestors``)?

The catalog is read now, while the row was written earlier. A table that no longer
exists (a partition dropped before the relay read its rows) therefore cannot be looked
up; its rows have the outbox's columns (the decoder checked), so they are taken as
outbox rows - a duplicate is recoverable, a lost event is not - and a warning names it.
A table that exists and is not in the tree is not the outbox's (another outbox table,
or a partition detached before its first row was read: see docs/partitioned-outbox.md).

Owns one ordinary autocommit connection, opened on first use and reopened after a
failure. Must not write anything or decide about rows itself. A failed lookup raises
SourceLost: the relay reconnects and replays from the slot, nothing is confirmed past
a row it could not decide.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from cdc_relay.config import TableRef
from cdc_relay.errors import RelayError, SourceLost, mask_secrets
from cdc_relay.pg.db import connect

log = logging.getLogger("cdc_relay.partitions")

_TREE_SQL = """
SELECT n.nspname::text, c.relname::text
FROM pg_partition_tree(%(root)s::regclass) AS t
JOIN pg_class AS c ON c.oid = t.relid JOIN pg_namespace AS n ON n.oid = c.relnamespace
"""
_TABLE_SQL = """
SELECT EXISTS (SELECT 1 FROM pg_partition_ancestors(c.oid) AS a
               WHERE a.relid = %(root)s::regclass)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = %(table)s
"""


class PartitionTree:
    """Looks up the outbox's partition tree (see the module docstring)."""

    def __init__(self, dsn: str, table: TableRef) -> None:
        self._dsn = dsn
        self._table = table
        self._root = sql.Identifier(table.schema, table.name)
        self._conn: psycopg.Connection[Any] | None = None

    def refresh(self, schema: str, table: str) -> tuple[frozenset[tuple[str, str]], bool]:
        """(every table now in the outbox's tree, whether ``schema.table`` holds outbox rows)."""
        try:
            conn = self._connection()
            root = self._root.as_string(conn)
            members = frozenset((row[0], row[1]) for row in conn.execute(_TREE_SQL, {"root": root}))
            found = conn.execute(_TABLE_SQL, {"root": root, "schema": schema,
                                              "table": table}).fetchone()
        except (psycopg.Error, RelayError) as exc:
            self.close()
            raise SourceLost(f"cannot look up the partitions of {self._table}: "
                             f"{mask_secrets(str(exc).strip())}") from exc
        name = f"{schema}.{table}"
        if found is None:
            log.warning("rows of %s, which no longer exists, have the outbox's columns: relayed "
                        "as events of %s (a partition dropped before its rows were read)",
                        name, self._table, extra={"table": name})
            return members, True
        if found[0]:
            log.info("partition %s of %s found", name, self._table, extra={"table": name})
        else:
            log.info("table %s has the outbox's columns but is not a partition of %s: its rows "
                     "are ignored", name, self._table, extra={"table": name})
        return members, bool(found[0])

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, autocommit=True, connect_timeout=10,
                                 application_name="cdc-relay partitions")
        return self._conn

    def close(self) -> None:
        """Close the lookup connection (reopened on the next lookup)."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
