"""The tests' databases: made from a template and dropped over one driver connection.

A test's database (the ``db`` fixture) costs two statements on a connection the session
keeps open, where ``PostgresCluster.create_database``/``drop_database`` run a psql
process per statement (cdc_relay/local must not import the relay's driver; tests may).
Dropping does what ``drop_database`` does: end the database's backends and walsenders,
drop its slots, then ``DROP DATABASE ... WITH (FORCE)``.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc_relay.local.postgres import PostgresCluster
from tests.support import wait_for

_END_AND_COUNT_SLOTS = [
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
    " WHERE datname = %(name)s AND pid <> pg_backend_pid()",
    "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots"
    " WHERE database = %(name)s AND NOT active",
]
_SLOTS_LEFT = "SELECT count(*) FROM pg_replication_slots WHERE database = %(name)s"


class Databases:
    """Creates and drops databases of ``cluster``, copies of ``template``."""

    def __init__(self, cluster: PostgresCluster, template: str = "template1") -> None:
        self._cluster = cluster
        self._template = template
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        """The open connection; a new one if a restart or a test ended the old one."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self._cluster.dsn(), autocommit=True, connect_timeout=10)
        return self._conn

    def create(self, name: str) -> str:
        """Create ``name`` from the template; return its DSN."""
        self._connection().execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(self._template)))
        return self._cluster.dsn(name)

    def drop(self, name: str, timeout: float = 30.0) -> None:
        """Drop ``name`` after ending its backends and walsenders and dropping its slots."""
        wait_for(lambda: self._slots_gone(name), timeout=timeout,
                 message=f"the replication slots of {name} dropped")
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        self._connection().execute(drop)

    def _slots_gone(self, name: str) -> bool:
        """One round: end the backends, drop the inactive slots; whether none is left.

        A slot whose walsender has not exited yet is still active: its drop fails, and
        the next round tries again (as a failed psql statement did).
        """
        try:
            conn = self._connection()
            for step in _END_AND_COUNT_SLOTS:
                conn.execute(step, {"name": name})
            left = conn.execute(_SLOTS_LEFT, {"name": name}).fetchone()
        except psycopg.Error:
            return False
        return left is not None and left[0] == 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
