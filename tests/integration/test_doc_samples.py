"""Samples of program output in the docs match what the program prints today.

Values differ from run to run (hosts, LSNs); the checks, their order and verdicts are
compared, so a doc sample cannot silently fall behind the program.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from cdc_relay.local.broker import Broker
from cdc_relay.local.postgres import PostgresCluster
from tests.support import run_cli

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
_LINE = re.compile(r"^(PASS|WARN|FAIL|SKIP)  (\S+(?: \S+)*?)  ")


def _checks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2).strip()) for m in map(_LINE.match, text.splitlines()) if m]


def _doc_sample(command: str) -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index(f"$ {command}")
    return text[start:text.index("```", start)]


def test_doctors_healthy_sample_is_what_doctor_prints(broker: Broker) -> None:
    with PostgresCluster(settings={"max_slot_wal_keep_size": "10GB"}) as cluster:
        dsn = cluster.dsn()
        assert run_cli("init", "--dsn", dsn).returncode == 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE ROLE cdc_relay LOGIN REPLICATION")
            conn.execute("GRANT SELECT ON outbox_events TO cdc_relay")
        result = run_cli("doctor", "--dsn", dsn.replace("user=postgres", "user=cdc_relay"),
                         "--brokers", broker.bootstrap)
    assert result.returncode == 0, result.stdout + result.stderr
    sample = _doc_sample('cdc-relay doctor --dsn "host=db dbname=app user=cdc_relay"')
    assert _checks(sample) == _checks(result.stdout)
    assert sample.strip().splitlines()[-1] == result.stdout.strip().splitlines()[-1]
