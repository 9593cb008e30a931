"""The sql/ templates and the statements built from them, without a database."""

from __future__ import annotations

import re

import pytest
from psycopg import sql

from cdc_relay.app.init import InitReport
from cdc_relay.config import OutboxConfig, TableRef
from cdc_relay.consumer import mark_statement
from cdc_relay.errors import ConfigError
from cdc_relay.model import OutboxColumns
from cdc_relay.outbox import insert_statement
from cdc_relay.pg.db import derived_name, validated_columns
from cdc_relay.pg.schema import Outcome, migrations, render, template_names

ODD = OutboxConfig(
    TableRef("Weird$Schema", "select"),
    OutboxColumns(id="Id", aggregate_type="from", aggregate_id="a$b", event_type="_type",
                  payload="PAYLOAD", created_at="order"),
)


def test_migrations_are_numbered_in_order_from_one() -> None:
    assert [m.version for m in migrations()] == [1, 2, 3, 4, 5]
    assert [m.name for m in migrations()] == [
        "0001_outbox.sql", "0002_notify_function.sql", "0003_processed_events.sql",
        "0004_created_at_clock.sql", "0005_trace_context.sql"]


@pytest.mark.parametrize("outbox", [OutboxConfig(), ODD,
                                    OutboxConfig(columns=OutboxColumns.debezium())])
def test_every_template_renders_with_quoted_names_only(outbox: OutboxConfig) -> None:
    names = template_names(outbox)
    for migration in migrations():
        text = render(migration.template, names).as_string(None)
        assert not re.search(r"\{\w+\}", text), migration.name
    assert all(isinstance(value, sql.Identifier) for value in names.values())


def test_odd_identifiers_are_quoted_verbatim() -> None:
    text = render(migrations()[0].template, template_names(ODD)).as_string(None)
    assert 'CREATE TABLE IF NOT EXISTS "Weird$Schema"."select" (' in text
    assert '"Id" UUID PRIMARY KEY DEFAULT gen_random_uuid()' in text
    assert '"from" VARCHAR(100) NOT NULL' in text
    assert 'CREATE INDEX IF NOT EXISTS "select_pending_idx" ON "Weird$Schema"."select" ("order")' \
        in text
    assert 'CREATE OR REPLACE VIEW "Weird$Schema"."select_dead_letters"' in text


def test_the_pending_index_matches_the_polling_claim() -> None:
    text = render(migrations()[0].template, template_names(OutboxConfig())).as_string(None)
    assert re.search(r'"outbox_events_pending_idx" ON "public"."outbox_events" \("created_at"\)'
                     r"\s+WHERE processed_at IS NULL AND dead_lettered_at IS NULL", text)


@pytest.mark.parametrize(
    "outbox",
    [
        OutboxConfig(TableRef("public", "x; drop table y")),
        OutboxConfig(TableRef('pub"lic', "outbox")),
        OutboxConfig(TableRef("public", "a" * 64)),
        OutboxConfig(columns=OutboxColumns(payload="pay load")),
        OutboxConfig(columns=OutboxColumns(aggregate_id="aggregate_type")),
        OutboxConfig(columns=OutboxColumns(created_at="processed_at")),
    ],
)
def test_invalid_names_never_reach_a_template(outbox: OutboxConfig) -> None:
    with pytest.raises(ConfigError):
        template_names(outbox)


def test_long_table_names_get_distinct_derived_names_within_the_limit() -> None:
    long_a, long_b = "a" * 62 + "x", "a" * 62 + "y"
    names = {derived_name(t, s) for t in (long_a, long_b)
             for s in ("_dead_letters", "_pending_idx", "_dead_idx")}
    assert len(names) == 6
    assert all(len(n) <= 63 for n in names)
    assert long_a not in names
    assert derived_name("outbox_events", "_dead_letters") == "outbox_events_dead_letters"


def test_insert_statement_quotes_the_mapped_columns() -> None:
    text = insert_statement("Billing.Outbox$Events", OutboxColumns.debezium()).as_string(None)
    assert text == (
        'INSERT INTO "Billing"."Outbox$Events" ("id", "aggregatetype", "aggregateid", "type", '
        '"payload") VALUES (%s, %s, %s, %s, %s)'
    )
    assert insert_statement("outbox_events") is insert_statement("outbox_events")


def test_mark_statement_is_an_idempotent_insert() -> None:
    text = mark_statement(TableRef("Billing", "processed_events")).as_string(None)
    assert text == ('INSERT INTO "Billing"."processed_events" (event_id) VALUES (%s) '
                    "ON CONFLICT (event_id) DO NOTHING RETURNING 1")


@pytest.mark.parametrize("table", ["x; drop table y", "a.b.c", TableRef("public", "a b")])
def test_statement_builders_refuse_invalid_tables(table: str | TableRef) -> None:
    with pytest.raises(ConfigError):
        insert_statement(table)
    with pytest.raises(ConfigError):
        mark_statement(table)


def test_validated_columns_accepts_the_defaults_and_debezium() -> None:
    assert validated_columns(None) == OutboxColumns()
    assert validated_columns(OutboxColumns.debezium()) == OutboxColumns.debezium()


def test_report_of_a_noop_run_says_nothing_changed() -> None:
    report = InitReport(TableRef(), (), 3, Outcome.EXISTED, Outcome.SKIPPED, Outcome.EXISTED,
                        slot_name="cdc_relay", plugin="wal2json")
    assert not report.changed
    assert report.lines() == [
        "outbox public.outbox_events: schema up to date (version 3)",
        "mode: wal",
        "notify trigger: existed",
        "replication slot cdc_relay (wal2json): existed",
    ]


def test_report_counts_a_dropped_trigger_as_a_change() -> None:
    report = InitReport(TableRef(), (), 3, Outcome.DROPPED, Outcome.SKIPPED, Outcome.SKIPPED,
                        mode="wal")
    assert report.changed
    assert report.lines()[2].startswith("notify trigger: dropped (WAL mode does not use it")
    poll = InitReport(TableRef(), (), 3, Outcome.CREATED, Outcome.SKIPPED, Outcome.SKIPPED,
                      mode="poll")
    assert poll.lines()[-1] == "replication slot: none (polling mode does not use one)"
