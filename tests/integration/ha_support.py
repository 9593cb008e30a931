"""Helpers of the high-availability tests: DSNs through a TcpProxy or naming several hosts,
and a slot invalidated on purpose.

The fixtures (tests/integration/conftest.py) start the servers and proxies; these spell
the connection strings the relay and the tests use to reach them, and drive a server of
the test's own into invalidating a slot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from cdc_relay.local.postgres import PostgresCluster
from tests.integration.tcp_proxy import TcpProxy


def proxied_dsn(proxy: TcpProxy, dbname: str = "postgres") -> str:
    """A DSN that reaches PostgreSQL through ``proxy`` (the address a virtual IP would be)."""
    return f"host=127.0.0.1 port={proxy.port} dbname={dbname} user=postgres"


def multi_host_dsn(clusters: Sequence[PostgresCluster], dbname: str = "postgres") -> str:
    """A libpq multi-host DSN over ``clusters`` that connects to whichever accepts writes."""
    hosts = ",".join(cluster.host for cluster in clusters)
    ports = ",".join(str(cluster.port) for cluster in clusters)
    return (f"host={hosts} port={ports} dbname={dbname} user=postgres"
            " target_session_attrs=read-write")


def invalidate_slot(cluster: PostgresCluster, slot: str, dbname: str = "postgres",
                    timeout: float = 60.0) -> None:
    """Make the server invalidate ``slot`` (``wal_status = 'lost'``), as a long outage would.

    Sets ``max_slot_wal_keep_size`` to 1 MB on ``cluster`` (a cluster of the test's own:
    it is server-wide) and writes WAL segments and checkpoints until the slot is lost.
    """
    cluster.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
    cluster.execute("SELECT pg_reload_conf()")
    cluster.execute("CREATE TABLE IF NOT EXISTS invalidate_filler (x int)", dbname=dbname)
    deadline = time.monotonic() + timeout
    status = f"SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{slot}'"
    while cluster.execute(status, dbname=dbname) != "lost":
        if time.monotonic() > deadline:
            raise AssertionError(f"slot {slot} still {cluster.execute(status)!r}")
        cluster.execute("INSERT INTO invalidate_filler VALUES (1); SELECT pg_switch_wal();"
                        " CHECKPOINT;", dbname=dbname)
