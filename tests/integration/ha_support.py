"""DSNs for the high-availability tests: through a TcpProxy, or naming several hosts.

The fixtures (tests/integration/conftest.py) start the servers and proxies; these only
spell the connection strings the relay and the tests use to reach them.
"""

from __future__ import annotations

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
