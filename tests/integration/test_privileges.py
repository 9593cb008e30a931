"""A role without the outbox privileges: the GRANT that fixes it, exit 6; doctor lists it
as one check among the rest (docs/operations.md, a least-privilege role)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from cdc_relay.errors import ExitCode
from cdc_relay.local.broker import Broker
from tests.support import init_outbox, run_cli


@pytest.fixture
def bare_role(db: str) -> Iterator[tuple[str, str]]:
    """(a DSN of ``db`` as a role with LOGIN and nothing else, the role's name)."""
    role = f"bare_{uuid.uuid4().hex[:8]}"
    init_outbox(db, "--mode", "poll")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield db.replace("user=postgres", f"user={role}"), role
    finally:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_poll_without_table_privileges_names_the_grant_and_exits_6(
        bare_role: tuple[str, str], broker: Broker, topic_prefix: str) -> None:
    dsn, role = bare_role
    result = run_cli("poll", "--dsn", dsn, "--brokers", broker.bootstrap,
                     "--topic-pattern", topic_prefix + ".{aggregate_type}", timeout=60)
    assert result.returncode == ExitCode.REFUSED, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert f"GRANT SELECT, UPDATE ON outbox_events TO {role};" in error
    assert "must own" not in result.stderr and "needs CREATE" not in result.stderr


def test_doctor_reports_table_privileges_and_keeps_checking(bare_role: tuple[str, str]) -> None:
    dsn, role = bare_role
    result = run_cli("doctor", "--dsn", dsn, "--mode", "poll", "--brokers", "127.0.0.1:1")
    assert result.returncode == 3  # the broker at 127.0.0.1:1 cannot be reached
    privileges = [line for line in result.stdout.splitlines() if "table privileges" in line]
    assert privileges, result.stdout
    assert f"GRANT SELECT, UPDATE ON public.outbox_events TO \"{role}\";" in result.stdout
    assert "outbox table" in result.stdout and "notify trigger" in result.stdout.lower()
    assert "must own" not in result.stdout + result.stderr
