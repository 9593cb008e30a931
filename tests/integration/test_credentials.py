"""Rotating credentials against a real PostgreSQL that checks passwords (scram-sha-256).

The cluster is this module's own: pg_hba.conf asks the relay's role for a password over
127.0.0.1 (ordinary and replication connections), the ``postgres`` superuser stays
trusted for the test's own statements. ``--password-command`` reads a file the test
rewrites when it rotates the password.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc_relay.errors import ExitCode
from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import free_port
from cdc_relay.local.postgres import PostgresCluster
from tests.integration.wal_support import assert_contract, collect_ids, start_relay, write_workload
from tests.support import KafkaCollector, run_cli, scrape, wait_for

ROLE = "relay_pw"


def require_passwords(cluster: PostgresCluster, role: str) -> None:
    """pg_hba.conf: ``role`` authenticates with scram-sha-256 over 127.0.0.1 (then reload)."""
    hba = cluster.data_dir / "pg_hba.conf"
    lines = (f"host all {role} 127.0.0.1/32 scram-sha-256\n"
             f"host replication {role} 127.0.0.1/32 scram-sha-256\n")
    hba.write_text(lines + hba.read_text(encoding="utf-8"), encoding="utf-8")
    cluster.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="module")
def scram_cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    try:
        cluster.start()
        require_passwords(cluster, ROLE)
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture
def app_db(scram_cluster: PostgresCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database owned by the password-checked role (LOGIN REPLICATION); its admin DSN."""
    name = "app_" + re.sub(r"\W", "_", request.node.name)[:40].lower()
    scram_cluster.execute(f"DROP ROLE IF EXISTS {ROLE}")
    scram_cluster.execute(f"CREATE ROLE {ROLE} LOGIN REPLICATION PASSWORD 'first-secret-4711'")
    scram_cluster.execute(f'CREATE DATABASE "{name}" OWNER {ROLE}')
    try:
        yield scram_cluster.dsn(name)
    finally:
        scram_cluster.drop_database(name)
        scram_cluster.execute(f"DROP ROLE IF EXISTS {ROLE}")


def _as_role(admin_dsn: str) -> str:
    return admin_dsn.replace("user=postgres", f"user={ROLE}")


def _terminate_role_backends(admin_dsn: str) -> int:
    """pg_terminate_backend of every backend of the role: its walsender and the others."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE usename = %s", (ROLE,)).fetchall()
    return len(rows)


def _has_backend(admin_dsn: str, application_name: str) -> bool:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s"
                           " AND application_name = %s", (ROLE, application_name)).fetchone()
    return row is not None and row[0] > 0


def test_a_password_changed_while_the_relay_runs_is_fetched_again_on_reconnect(
        app_db: str, tmp_path: Path, broker: Broker, topic_prefix: str) -> None:
    secret = tmp_path / "password"
    secret.write_text("first-secret-4711\n", encoding="utf-8")
    command = f"cat {secret}"
    dsn = _as_role(app_db)
    without = run_cli("init", "--dsn", dsn, "--plugin", "pgoutput")
    assert without.returncode == ExitCode.REFUSED, without.stderr  # the DSN has no password
    init = run_cli("init", "--dsn", dsn, "--plugin", "pgoutput", "--password-command", command)
    assert init.returncode == 0, init.stderr
    port = free_port()
    with start_relay(dsn, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=("--password-command", command, "--metrics-port", str(port))) as relay:
        expected = write_workload(app_db, transactions=5, seed=41)
        with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
            collect_ids(collector, topic_prefix, expected.ids)

            # Rotate: the server takes only the new password, the command prints it.
            with psycopg.connect(app_db, autocommit=True) as conn:
                conn.execute(f"ALTER ROLE {ROLE} PASSWORD 'second-secret-0815'")
            secret.write_text("second-secret-0815\n", encoding="utf-8")
            streams_before = relay.stderr.count("streaming from slot")
            assert _terminate_role_backends(app_db) >= 1
            write_workload(app_db, transactions=5, seed=42, expected=expected)
            wait_for(lambda: relay.stderr.count("streaming from slot") > streams_before
                     or not relay.running(), timeout=60, message="the relay reconnected")
            assert relay.running(), relay.stderr
            messages = collect_ids(collector, topic_prefix, expected.ids, timeout=90)
        # The metrics' status reads reconnect with the new password too.
        wait_for(lambda: scrape(port).get("cdc_relay_slot_probe_success") == 1.0
                 and _has_backend(app_db, "cdc-relay metrics"), timeout=30,
                 message="the metrics probe reconnected with the new password")
        assert relay.stop() == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    for output in (relay.stderr, relay.stdout, init.stderr, init.stdout):
        assert "first-secret" not in output and "second-secret" not in output


@pytest.mark.parametrize("command", ["echo oops >&2; exit 3", "true", "printf '\\n'"],
                         ids=["fails", "prints-nothing", "prints-an-empty-line"])
def test_a_password_command_that_gives_no_password_is_one_line_exit_6(
        app_db: str, command: str) -> None:
    for args in (["init", "--plugin", "pgoutput"],
                 ["run", "--plugin", "pgoutput", "--brokers", "127.0.0.1:1"]):
        result = run_cli(*args, "--dsn", _as_role(app_db), "--password-command", command)
        assert result.returncode == ExitCode.REFUSED, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "password command" in lines[0], result.stderr
        assert "--password-command" in lines[0] and "Traceback" not in result.stderr


def test_rds_iam_over_an_unencrypted_dsn_is_refused_before_connecting(app_db: str) -> None:
    result = run_cli("init", "--dsn", _as_role(app_db), "--aws-rds-iam", "--aws-region",
                     "eu-west-1")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert "sslmode" in result.stderr and len(result.stderr.strip().splitlines()) == 1
