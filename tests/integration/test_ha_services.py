"""The high-availability test services work as the failover tests assume (docs/high-availability.md).

A primary + synchronous standby on Debian's PostgreSQL and on PostgreSQL 18 from PyPI
(with failover slots), promotion, and the proxy that moves to the promoted standby or
goes half-open.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import psycopg
import pytest

from cdc_relay.local.pair import PostgresPair
from cdc_relay.local.postgres import PostgresCluster
from tests.integration.ha_support import multi_host_dsn, proxied_dsn
from tests.integration.tcp_proxy import TcpProxy
from tests.support import wait_for

Proxy = Callable[[PostgresCluster | int], TcpProxy]


def _one(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]


@pytest.mark.slow
def test_pair_standby_has_every_commit_and_takes_over_behind_the_moved_proxy(
        pg_pair: PostgresPair, pg_proxy: Proxy) -> None:
    primary, standby = pg_pair.primary, pg_pair.standby
    proxy = pg_proxy(primary)
    assert _one(proxied_dsn(proxy), "SELECT inet_server_port()") == primary.port
    primary.execute("CREATE TABLE t (id int PRIMARY KEY)")
    primary.execute("INSERT INTO t SELECT generate_series(1, 100)")
    pg_pair.wait_replayed()
    assert standby.in_recovery
    assert standby.execute("SELECT count(*) FROM t") == "100"

    primary.execute("INSERT INTO t SELECT generate_series(101, 150)")  # acknowledged = on the standby
    pg_pair.fail_over()
    proxy.move_to(standby.port)

    dsn = proxied_dsn(proxy)
    assert _one(dsn, "SELECT inet_server_port()") == standby.port
    assert _one(dsn, "SELECT pg_is_in_recovery()") is False
    assert _one(dsn, "INSERT INTO t VALUES (151) RETURNING (SELECT count(*) FROM t)") == 150
    assert _one(multi_host_dsn([primary, standby]), "SELECT inet_server_port()") == standby.port


def test_half_open_proxy_silences_open_connections_until_resumed(
        pg_cluster: PostgresCluster, pg_proxy: Proxy) -> None:
    proxy = pg_proxy(pg_cluster)
    marker = f"half-open {uuid.uuid4().hex}"
    frozen = psycopg.connect(proxied_dsn(proxy), autocommit=True)
    try:
        pid = frozen.info.backend_pid
        assert proxy.half_open() == 1
        answer: list[object] = []
        query = threading.Thread(target=lambda: answer.append(
            frozen.execute(f"SELECT '{marker}'").fetchone()), daemon=True)
        query.start()
        # A new connection goes through; the frozen one's query never reaches the server.
        assert _one(proxied_dsn(proxy), "SELECT 1") == 1
        assert proxy.accepted == 2
        assert pg_cluster.execute(f"SELECT query FROM pg_stat_activity WHERE pid = {pid}") \
            != f"SELECT '{marker}'"
        assert query.is_alive() and proxy.open_connections == 1

        proxy.resume()
        query.join(30)
        assert answer == [(marker,)]  # neither side was closed: the query completes
    finally:
        frozen.close()


def test_pg18_cluster_runs_postgresql_18_with_logical_wal(pg18_cluster: PostgresCluster) -> None:
    assert pg18_cluster.version == 18
    assert int(pg18_cluster.execute("SHOW server_version_num")) >= 180000
    assert pg18_cluster.execute("SHOW wal_level") == "logical"


@pytest.mark.slow
def test_pg18_failover_slot_is_synced_and_usable_after_promotion(pg18_pair: PostgresPair) -> None:
    primary, standby = pg18_pair.primary, pg18_pair.standby
    assert standby.execute("SHOW sync_replication_slots") == "on"
    assert primary.execute("SHOW synchronized_standby_slots") == pg18_pair.slot
    primary.execute("CREATE TABLE t (id int PRIMARY KEY, note text)")
    primary.execute("CREATE PUBLICATION pub FOR TABLE t")
    primary.execute("SELECT pg_create_logical_replication_slot("
                    "'relay', 'pgoutput', false, false, true)")
    assert primary.execute("SELECT failover FROM pg_replication_slots"
                           " WHERE slot_name = 'relay'") == "t"
    primary.execute("INSERT INTO t VALUES (1, 'seen')")
    pg18_pair.wait_failover_ready("relay", advance=True)
    assert pg18_pair.synced_slot("relay") == (True, False)

    primary.execute("INSERT INTO t VALUES (2, 'after the last confirm')")
    pg18_pair.fail_over()

    changes = standby.execute(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('relay', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'pub')"
        " WHERE encode(data, 'escape') LIKE '%after the last confirm%'")
    assert changes == "1"
    wait_for(lambda: standby.execute("SELECT count(*) FROM t") == "2", message="rows")
