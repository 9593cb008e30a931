"""The wrong endpoint, said plainly, against real servers: pgbouncer, a hot standby, a
read-only role or database, a role without the right to replicate.

Each case ends in one line naming the cause and the fix (``run``, ``init``, ``poll``) or
a doctor FAIL carrying the same fix. pgbouncer 1.18 (Debian's) runs in front of this
worker's PostgreSQL 15 on a port of its own (cdc_relay/local/pgbouncer.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from cdc_relay.errors import ExitCode
from cdc_relay.local.broker import Broker
from cdc_relay.local.pair import PostgresPair
from cdc_relay.local.pgbouncer import Pgbouncer
from cdc_relay.local.postgres import PostgresCluster
from tests.support import init_outbox, run_cli

UNREACHABLE_BROKER = ("--brokers", "127.0.0.1:1")
PG = ("--plugin", "pgoutput")


@pytest.fixture(scope="module")
def bouncer(pg_cluster: PostgresCluster) -> Iterator[Pgbouncer]:
    with Pgbouncer(pg_cluster.port) as pooler:
        yield pooler


def _through(bouncer: Pgbouncer, db: str) -> str:
    dbname = str(psycopg.conninfo.conninfo_to_dict(db)["dbname"])
    return bouncer.dsn(dbname)


def _one_line(result: object) -> str:
    """The one error line (run logs its start-up first)."""
    stderr = str(getattr(result, "stderr", ""))
    lines = [line for line in stderr.strip().splitlines() if line.startswith("cdc-relay: error")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _slots(db: str) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_replication_slots"
                           " WHERE database = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def _doctor(dsn: str, *args: str) -> dict[str, dict[str, str]]:
    result = run_cli("doctor", "--dsn", dsn, "--format", "json", *args)
    assert result.returncode == ExitCode.FAILURE, result.stdout + result.stderr
    return {check["name"]: check for check in json.loads(result.stdout)}


def test_init_through_pgbouncer_names_the_pooler_and_creates_no_slot(
        bouncer: Pgbouncer, db: str) -> None:
    result = run_cli("init", "--dsn", _through(bouncer, db), *PG)
    assert result.returncode == ExitCode.USAGE, result.stderr
    line = _one_line(result)
    assert "connection pooler" in line and "replication connection" in line
    assert "point --dsn at PostgreSQL itself" in line
    assert _slots(db) == 0


def test_run_through_pgbouncer_names_the_pooler_whether_or_not_the_slot_exists(
        bouncer: Pgbouncer, db: str, broker: Broker) -> None:
    args = ("run", "--dsn", _through(bouncer, db), *PG, "--brokers", broker.bootstrap)
    init_outbox(db, "--mode", "poll")  # the table, no slot: run would create it
    first = run_cli(*args, timeout=60)
    assert first.returncode == ExitCode.USAGE, first.stderr
    assert "connection pooler" in first.stderr and _slots(db) == 0
    init_outbox(db, *PG)  # the slot, made directly
    second = run_cli(*args, timeout=60)
    assert second.returncode == ExitCode.USAGE, second.stderr
    assert "connection pooler" in second.stderr and "point --dsn at PostgreSQL" in second.stderr


def test_doctor_through_pgbouncer_fails_the_replication_connection_with_the_fix(
        bouncer: Pgbouncer, db: str) -> None:
    init_outbox(db, *PG)
    checks = _doctor(_through(bouncer, db), *PG)
    replication = checks["replication connection"]
    assert replication["verdict"] == "fail", replication
    assert "connection pooler" in replication["detail"]
    assert "not at the pooler" in replication["fix"]
    direct = run_cli("doctor", "--dsn", db, "--format", "json", *PG)
    by_name = {c["name"]: c for c in json.loads(direct.stdout)}
    assert by_name["replication connection"]["verdict"] == "pass"


def test_a_hot_standby_is_named_where_init_polling_and_doctor_must_write(
        pg_pair: PostgresPair) -> None:
    primary_dsn = pg_pair.primary.create_database("app")
    init_outbox(primary_dsn, *PG)
    pg_pair.wait_replayed()
    standby = pg_pair.standby.dsn("app")
    for args in (("init", *PG), ("poll", *UNREACHABLE_BROKER)):
        result = run_cli(*args, "--dsn", standby, timeout=60)
        assert result.returncode == ExitCode.USAGE, result.stderr
        line = _one_line(result)
        assert "hot standby" in line and "pg_is_in_recovery()" in line
        assert "point --dsn at the primary" in line
    writable = _doctor(standby, "--mode", "poll")["writable"]
    assert writable["verdict"] == "fail" and "hot standby" in writable["detail"]
    assert "writer endpoint" in writable["fix"]


def test_a_database_read_only_by_default_is_named_with_both_fixes(db: str, broker: Broker) -> None:
    init_outbox(db, *PG)
    dbname = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
    for args in (("init", *PG), ("run", *PG, "--brokers", broker.bootstrap),
                 ("poll", *UNREACHABLE_BROKER)):
        result = run_cli(*args, "--dsn", db, timeout=60)
        assert result.returncode == ExitCode.USAGE, (args, result.stderr)
        line = _one_line(result)
        assert "default_transaction_read_only = on" in line and "writer endpoint" in line
        assert "default_transaction_read_only = off" in line
    writable = _doctor(db, *PG)["writable"]
    assert writable["verdict"] == "fail", writable


@pytest.fixture
def roles(db: str) -> Iterator[list[str]]:
    """Roles made by the test (cluster-wide): dropped after it, with rds_replication."""
    made: list[str] = []
    yield made
    with psycopg.connect(db, autocommit=True) as conn:
        for role in reversed(made):
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_membership_in_rds_replication_counts_as_the_right_to_replicate(
        db: str, roles: list[str], topic_prefix: str) -> None:
    init_outbox(db, *PG)
    member = "member_" + topic_prefix
    with psycopg.connect(db, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication'").fetchone() is None:
            conn.execute("CREATE ROLE rds_replication NOLOGIN")
            roles.append("rds_replication")
        conn.execute(f"CREATE ROLE {member} LOGIN IN ROLE rds_replication")
        roles.append(member)
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {member}")
    as_member = db.replace("user=postgres", f"user={member}")
    checks = _doctor(as_member, *PG)
    assert checks["REPLICATION"]["verdict"] == "pass", checks["REPLICATION"]
    assert "rds_replication" in checks["REPLICATION"]["detail"]


def test_a_role_without_the_right_to_replicate_is_one_line_naming_both_grants(
        db: str, roles: list[str], topic_prefix: str, broker: Broker) -> None:
    init_outbox(db, *PG)
    role = "plain_" + topic_prefix
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        roles.append(role)
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    as_role = db.replace("user=postgres", f"user={role}")
    result = run_cli("run", "--dsn", as_role, *PG, "--brokers", broker.bootstrap, timeout=60)
    assert result.returncode == ExitCode.REFUSED, result.stderr
    line = _one_line(result)
    assert "REPLICATION" in line and "GRANT rds_replication TO" in line
    replication = _doctor(as_role, *PG)["REPLICATION"]
    assert replication["verdict"] == "fail" and "rds_replication" in replication["fix"]
