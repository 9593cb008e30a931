"""Tables whose names need PostgreSQL's double quotes (a dash, upper case) selected by name
in ``--capture``, ``cdc-relay snapshot`` and ``init --capture``, on the real stack
(PostgreSQL, Apache Kafka, the relay as a process; docs/table-cdc.md, selecting tables)."""

from __future__ import annotations

import json
import re

import psycopg
import pytest

from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg, run_cli

pytestmark = pytest.mark.integration

TABLES = """
CREATE TABLE public."my-table" (id int PRIMARY KEY, v text);
CREATE TABLE public."my table" (id int PRIMARY KEY, v text);
CREATE SCHEMA "Sales";
CREATE TABLE "Sales"."Orders" (id int PRIMARY KEY, v text);
CREATE SCHEMA sales;
CREATE TABLE sales.orders (id int PRIMARY KEY, v text);
INSERT INTO "Sales"."Orders" VALUES (1, 'before the relay');
"""
CAPTURE = 'public."my-table", "Sales"."Orders", public."my table"'


def _events(messages: list[Msg], topic: str) -> list[tuple[str, object]]:
    out = []
    for m in messages:
        if m.topic == topic and m.value is not None:
            value = json.loads(m.value)
            out.append((value["op"], value["after"]["id"]))
    return out


def test_a_dashed_and_an_upper_case_table_are_captured_and_snapshotted_by_their_quoted_names(
        db: str, broker: object, topic_prefix: str) -> None:
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(TABLES + 'ALTER TABLE "Sales"."Orders" REPLICA IDENTITY NOTHING')
    init = run_cli("init", "--dsn", db, "--slot", "cdc_relay", "--plugin", "pgoutput",
                   "--capture", CAPTURE)
    assert init.returncode == 0, init.stderr
    assert "Sales.Orders" in init.stdout and "public.my-table" in init.stdout, init.stdout
    fix = re.search(r"Fix: (ALTER TABLE \S+ REPLICA IDENTITY DEFAULT)", init.stdout + init.stderr)
    assert fix is not None and fix.group(1).startswith('ALTER TABLE "Sales"."Orders"'), init.stdout
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(fix.group(1))  # the warning's fix works as written
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
        "--capture", CAPTURE, "--capture-prefix", topic_prefix))
    try:
        with psycopg.connect(db) as conn:
            conn.execute("INSERT INTO sales.orders VALUES (7, 'not captured')")
            conn.execute("INSERT INTO public.\"my-table\" VALUES (1, 'a')")
            conn.execute("INSERT INTO \"Sales\".\"Orders\" VALUES (2, 'b')")
            conn.execute("INSERT INTO public.\"my table\" VALUES (3, 'c')")
            conn.commit()
        done = run_cli("snapshot", "--dsn", db, '"Sales"."Orders"')
        assert done.returncode == 0, done.stderr
        assert "for Sales.Orders into" in done.stdout  # Debezium's name in data-collections
        dashed, upper = f"{topic_prefix}.public.my-table", f"{topic_prefix}.Sales.Orders"
        spaced = f"{topic_prefix}.public.my_table"  # Kafka allows no space: as Debezium's
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(
                until=lambda ms: len(_events(ms, upper)) >= 3 and _events(ms, dashed) != []
                and _events(ms, spaced) != [],
                timeout=60)
        assert relay.stop() == 0, relay.stderr
    finally:
        relay.kill()
    assert _events(got, dashed) == [("c", 1)]
    assert _events(got, spaced) == [("c", 3)]
    [spaced_event] = [json.loads(m.value) for m in got if m.topic == spaced and m.value]
    assert spaced_event["source"]["table"] == "my table"
    assert _events(got, upper)[0] == ("c", 2)
    assert sorted(_events(got, upper)[1:]) == [("r", 1), ("r", 2)]  # the snapshot's rows
    assert not [m for m in got if m.topic == f"{topic_prefix}.sales.orders"]
