"""Half-open PostgreSQL connections on a real network: recovered by TCP keepalives alone.

The relay runs in a network namespace of its own (tests/integration/netns.py) and
reaches a throwaway PostgreSQL and Tansu broker over a veth pair. The test then drops
every packet of the relay's PostgreSQL connections open at that moment, in both
directions: no FIN, no RST, and - unlike tests/integration/tcp_proxy.py - no proxy's
kernel acknowledging the keepalive probes, so only the TCP keepalives and
``tcp_user_timeout`` every connection gets (cdc_relay/pg/db.py) can notice. New
connections work, as after a NAT or load-balancer timeout. Every event committed after
the cut must reach Kafka with no operator action (docs/high-availability.md, silent
networks). Skips in one line where network namespaces cannot be made, except in CI.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from cdc_relay.local.broker import Broker
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.netns import Netns, unavailable, veth_namespace
from tests.integration.wal_support import collect_ids, init_db, write_workload
from tests.support import CliProcess, KafkaCollector, init_outbox, skip_or_fail_in_ci, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]

RECOVERY = 120.0  # generous: keepalives give up after ~25 s, tcp_user_timeout after 30 s


class _VethBroker(Broker):
    """A Tansu broker listening (and advertised) on the host end of the veth pair."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self._veth_host = host

    @property
    def host(self) -> str:
        return self._veth_host


@dataclass
class Net:
    ns: Netns
    pg: PostgresCluster
    broker: Broker

    def dsn(self, dbname: str) -> str:
        """The DSN a process in the namespace uses: through the veth pair."""
        return f"host={self.ns.host_addr} port={self.pg.port} dbname={dbname} user=postgres"

    def cut(self) -> set[int]:
        """Silence every connection from the namespace to PostgreSQL open now."""
        ports = self.ns.client_ports(self.pg.port)
        assert ports, "the relay has no PostgreSQL connection to cut"
        self.ns.silence(ports)
        return ports


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    reason = unavailable()
    if reason is not None:
        skip_or_fail_in_ci(reason)
    with veth_namespace() as ns:
        pg = PostgresCluster(settings={"listen_addresses": f"127.0.0.1,{ns.host_addr}"})
        broker = _VethBroker(ns.host_addr)
        try:
            pg.start()
            with open(pg.data_dir / "pg_hba.conf", "a", encoding="utf-8") as hba:
                hba.write(f"host all all {ns.ns_addr}/32 trust\n"
                          f"host replication all {ns.ns_addr}/32 trust\n")
            pg.execute("SELECT pg_reload_conf()")
            broker.start()
            yield Net(ns, pg, broker)
        finally:
            broker.kill()
            pg.cleanup()


def _poll(net: Net, dsn: str, prefix: str) -> CliProcess:
    return CliProcess(["poll", "--dsn", dsn, "--brokers", net.broker.bootstrap, "--topic-pattern",
                       prefix + ".{aggregate_type}", "--interval", "200ms"],
                      prefix=net.ns.wrap([]))


def _recovered(net: Net, prefix: str, ids: set[str], relay: CliProcess, since: float) -> None:
    with KafkaCollector(net.broker.bootstrap, prefix) as collector:
        try:
            collect_ids(collector, prefix, ids, timeout=RECOVERY)
        except TimeoutError as exc:
            raise AssertionError(f"not recovered; the relay said:\n{relay.stderr}") from exc
    print(f"recovered {time.monotonic() - since:.1f} s after the cut")  # measured for the docs
    print(*(line for line in relay.stderr.splitlines() if "WARNING" in line), sep="\n")
    assert relay.running(), relay.stderr


def test_an_idle_poller_recovers_from_a_half_open_connection(net: Net, topic_prefix: str) -> None:
    local = net.pg.create_database("idle")
    init_outbox(local, "--mode", "poll")
    with _poll(net, net.dsn("idle"), topic_prefix) as poller:
        before = write_workload(local, transactions=3, seed=40)
        with KafkaCollector(net.broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, before.ids)
        cut_at = time.monotonic()
        ports = net.cut()  # the poller's connections, idle between polls or LISTENing
        after = write_workload(local, transactions=5, seed=41)
        _recovered(net, topic_prefix, after.ids, poller, cut_at)
        assert net.ns.client_ports(net.pg.port) - ports, "no new connection"


def test_a_poller_stuck_in_a_query_recovers_from_a_half_open_connection(
        net: Net, topic_prefix: str) -> None:
    local = net.pg.create_database("stuck")
    init_outbox(local, "--mode", "poll")
    with _poll(net, net.dsn("stuck"), topic_prefix) as poller:
        before = write_workload(local, transactions=2, seed=42)
        with KafkaCollector(net.broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, before.ids)
        with psycopg.connect(local) as locker:
            # The poller's claim waits on this lock: its query is in flight when the network
            # goes silent, and when the lock goes it claims these rows on the dead connection.
            locker.execute("LOCK TABLE outbox_events IN EXCLUSIVE MODE")
            stuck = {str(emit(locker, "order", f"order-{i}", "OrderPlaced", {"i": i}))
                     for i in range(5)}
            wait_for(lambda: _waiting_on_lock(local, net.ns.ns_addr), timeout=30,
                     message="the poller's claim waiting on the lock")
            cut_at = time.monotonic()
            net.cut()
            locker.commit()
        after = write_workload(local, transactions=3, seed=43)
        _recovered(net, topic_prefix, after.ids | stuck, poller, cut_at)


def _waiting_on_lock(dsn: str, client: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE client_addr = %s"
                           " AND wait_event_type = 'Lock'", (client,)).fetchone()
    return row is not None and row[0] > 0


def test_a_wal_relay_recovers_from_a_half_open_replication_connection(
        net: Net, topic_prefix: str) -> None:
    local = net.pg.create_database("wal")
    init_db(local, slot="netfault", plugin="pgoutput")
    with CliProcess(["run", "--dsn", net.dsn("wal"), "--brokers", net.broker.bootstrap,
                     "--slot", "netfault", "--plugin", "pgoutput", "--topic-pattern",
                     topic_prefix + ".{aggregate_type}", "--status-interval", "200ms"],
                    prefix=net.ns.wrap([])) as relay:
        before = write_workload(local, transactions=3, seed=44)
        with KafkaCollector(net.broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, before.ids)
        cut_at = time.monotonic()
        net.cut()
        after = write_workload(local, transactions=5, seed=45)
        _recovered(net, topic_prefix, after.ids, relay, cut_at)
