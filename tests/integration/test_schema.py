"""``init_database`` against a real PostgreSQL: migrations, trigger, publication, slot."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from cdc_relay.app.init import init_database
from cdc_relay.config import OutboxConfig, RouterConfig, TableRef
from cdc_relay.errors import ConfigError, DatabaseError, ServiceUnavailable, SlotBusy
from cdc_relay.local.postgres import PostgresCluster
from cdc_relay.model import OutboxColumns
from cdc_relay.outbox import emit
from cdc_relay.pg.db import connect
from cdc_relay.pg.message_columns import resolve_message_columns
from cdc_relay.pg.schema import ADVISORY_LOCK_KEY, Outcome
from cdc_relay.pg.slots import slot_exists, slot_info
from cdc_relay.wal.backfill.state import warn_if_unfinished
from cdc_relay.wal.slot.lifecycle import drop_slot
from cdc_relay.wal.slot.setup import ensure_replication


def _slot_name() -> str:
    return f"s_{uuid.uuid4().hex[:12]}"


def _rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def _catalog(dsn: str, schema: str, slot: str | None = None) -> dict[str, Any]:
    """Everything init creates, with oids and row versions (xmin) so any rewrite shows."""
    return {
        "relations": _rows(
            dsn,
            "SELECT c.oid, c.xmin::text, c.relname, c.relkind FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s ORDER BY 1",
            (schema,),
        ),
        "triggers": _rows(
            dsn,
            "SELECT t.oid, t.xmin::text, t.tgname FROM pg_trigger t JOIN pg_class c "
            "ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND NOT t.tgisinternal ORDER BY 1",
            (schema,),
        ),
        "functions": _rows(
            dsn,
            "SELECT p.oid, p.xmin::text, p.proname FROM pg_proc p JOIN pg_namespace n "
            "ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1",
            (schema,),
        ),
        "publications": _rows(
            dsn, "SELECT oid, xmin::text, pubname FROM pg_publication ORDER BY 1"
        ),
        "publication_tables": _rows(
            dsn, "SELECT oid, xmin::text FROM pg_publication_rel ORDER BY 1"
        ),
        "migrations": _rows(
            dsn,
            sql.SQL("SELECT table_name, version, applied_at FROM {} ORDER BY 1, 2").format(
                sql.Identifier(schema, "cdc_relay_schema_migrations")
            ).as_string(None),
        ),
        "slots": _rows(
            dsn,
            "SELECT slot_name, plugin, restart_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ),
    }


def _closed_port_dsn() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens there once the socket is closed.
    return f"host=127.0.0.1 port={port} dbname=nowhere user=u password=s3cret connect_timeout=2"


def test_second_init_changes_nothing(db: str) -> None:
    slot = _slot_name()
    first = init_database(db, OutboxConfig(), slot=slot, plugin="pgoutput")
    assert first.changed
    assert first.migrations_applied == (1, 2, 3, 4)
    # WAL mode: no NOTIFY trigger.
    assert (first.trigger, first.publication, first.slot) == (Outcome.ABSENT,) + (Outcome.CREATED,) * 2
    before = _catalog(db, "public", slot)

    second = init_database(db, OutboxConfig(), slot=slot, plugin="pgoutput")

    assert not second.changed
    assert second.migrations_applied == ()
    assert second.schema_version == 4
    assert (second.trigger, second.publication, second.slot) == (Outcome.ABSENT,) + (Outcome.EXISTED,) * 2
    assert str(second).splitlines()[0] == "outbox public.outbox_events: schema up to date (version 4)"
    assert _catalog(db, "public", slot) == before


@pytest.mark.parametrize(
    ("outbox", "options"),
    [
        (OutboxConfig(TableRef("public", "x; drop table y")), {}),
        (OutboxConfig(TableRef("x; drop table y", "outbox")), {}),
        (OutboxConfig(TableRef("public", 'out"box')), {}),
        (OutboxConfig(columns=OutboxColumns(payload="payload; --")), {}),
        (OutboxConfig(columns=OutboxColumns(id="payload")), {}),
        (OutboxConfig(columns=OutboxColumns(event_type="attempts")), {}),
        (OutboxConfig(), {"slot": "Bad-Slot"}),
        (OutboxConfig(), {"slot": "ok", "publication": "p; drop table y"}),
        (OutboxConfig(), {"slot": "ok", "plugin": "test_decoding"}),
    ],
)
def test_invalid_names_are_refused_before_connecting(
    outbox: OutboxConfig, options: dict[str, Any]
) -> None:
    # The DSN points at a closed port: a ConfigError (not ServiceUnavailable) proves
    # that validation happened before any connection attempt.
    options = {"slot": None, **options}
    with pytest.raises(ConfigError):
        init_database(_closed_port_dsn(), outbox, **options)


def test_unreachable_server_is_service_unavailable_without_password() -> None:
    dsn = _closed_port_dsn()
    with pytest.raises(ServiceUnavailable) as info:
        init_database(dsn, OutboxConfig(), slot=None)
    message = str(info.value)
    assert message.startswith("cannot connect to PostgreSQL at 127.0.0.1:")
    assert "/nowhere" in message
    assert "s3cret" not in message


def test_custom_schema_and_debezium_columns_work_with_emit(db: str) -> None:
    table = TableRef.parse("Billing.Outbox$Events")
    outbox = OutboxConfig(table, OutboxColumns.debezium())
    report = init_database(db, outbox, slot=None)
    assert report.migrations_applied == (1, 2, 3, 4)

    with psycopg.connect(db) as conn:
        event_id = emit(conn, "Order", "o-1", "OrderCreated", {"total": 12.5},
                        table=table, columns=OutboxColumns.debezium())
    rows = _rows(
        db,
        'SELECT id, aggregatetype, aggregateid, type, payload, attempts, processed_at '
        'FROM "Billing"."Outbox$Events"',
    )
    assert rows == [(event_id, "Order", "o-1", "OrderCreated", {"total": 12.5}, 0, None)]
    assert _rows(db, 'SELECT count(*) FROM "Billing"."Outbox$Events_dead_letters"') == [(0,)]
    assert _rows(db, "SELECT to_regclass('\"Billing\".processed_events') IS NOT NULL") == [
        (True,)
    ]
    assert _rows(db, "SELECT to_regclass('public.outbox_events')") == [(None,)]


def test_existing_debezium_table_gets_the_bookkeeping_columns(db: str) -> None:
    _rows(db, "CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) "
              "NOT NULL, aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, "
              "payload jsonb)")
    outbox = OutboxConfig(TableRef("public", "outbox"), OutboxColumns.debezium())

    init_database(db, outbox, slot=None)

    columns = {
        row[0] for row in _rows(
            db, "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'public' AND table_name = 'outbox'")
    }
    assert columns >= {"attempts", "created_at", "processed_at", "retry_after",
                       "last_error", "dead_lettered_at"}
    with psycopg.connect(db) as conn:
        emit(conn, "Order", "o-1", "OrderCreated", {}, table="public.outbox",
             columns=OutboxColumns.debezium())
    assert _rows(db, "SELECT count(*) FROM public.outbox WHERE created_at IS NOT NULL") == [(1,)]


def test_mapping_to_missing_columns_is_refused_and_rolled_back(db: str) -> None:
    _rows(db, "CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, "
              "aggregateid text NOT NULL, type text NOT NULL, payload jsonb)")

    with pytest.raises(ConfigError, match="--columns debezium"):
        init_database(db, OutboxConfig(TableRef("public", "outbox")), slot=None)

    assert _rows(db, "SELECT to_regclass('public.cdc_relay_schema_migrations')") == [(None,)]
    assert _rows(db, "SELECT count(*) FROM information_schema.columns WHERE "
                     "table_name = 'outbox' AND column_name = 'attempts'") == [(0,)]


def test_insert_trigger_notifies_the_channel(db: str) -> None:
    outbox = OutboxConfig(TableRef.parse("Shop.outbox_events"))
    init_database(db, outbox, slot=None)
    with psycopg.connect(db, autocommit=True) as listener:
        # The channel has upper-case letters: LISTEN must quote it to keep them.
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(outbox.notify_channel)))
        with psycopg.connect(db) as conn:
            emit(conn, "a", "1", "e", {}, table=outbox.table)
            emit(conn, "a", "2", "e", {}, table=outbox.table)
        received = list(listener.notifies(timeout=30, stop_after=1))

    assert [(n.channel, n.payload) for n in received] == [(outbox.notify_channel, "")]


def test_notify_trigger_follows_the_option(db: str) -> None:
    def triggers() -> int:
        return int(_rows(db, "SELECT count(*) FROM pg_trigger "
                             "WHERE tgrelid = 'public.outbox_events'::regclass")[0][0])

    report = init_database(db, OutboxConfig(), slot=None, notify_trigger=False)
    assert report.trigger is Outcome.ABSENT
    assert triggers() == 0
    assert init_database(db, OutboxConfig(), slot=None).trigger is Outcome.CREATED
    assert triggers() == 1
    report = init_database(db, OutboxConfig(), slot=None, notify_trigger=False)
    assert report.trigger is Outcome.DROPPED
    assert report.changed
    assert triggers() == 0


def _peek(db: str, slot: str, plugin: str) -> int:
    if plugin == "wal2json":
        query = ("SELECT count(*) FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
                 "'format-version', '2', 'add-tables', 'public.outbox_events') "
                 "WHERE data LIKE '%%\"action\":\"I\"%%'")
    else:
        # pgoutput: 'I' (0x49) messages of the publication's tables only.
        query = ("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                 "'proto_version', '1', 'publication_names', 'cdc_relay_outbox') "
                 "WHERE get_byte(data, 0) = 73")
    return int(_rows(db, query, (slot,))[0][0])


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_init_creates_a_slot_that_sees_outbox_inserts(db: str, plugin: str) -> None:
    slot = _slot_name()
    report = init_database(db, OutboxConfig(), slot=slot, plugin=plugin)

    assert report.slot is Outcome.CREATED
    info = slot_info(db, slot)
    assert info is not None
    assert (info.plugin, info.slot_type, info.active) == (plugin, "logical", False)
    publications = _rows(db, "SELECT pubname, pubinsert, pubupdate, pubdelete FROM "
                             "pg_publication")
    if plugin == "pgoutput":
        assert report.publication is Outcome.CREATED
        assert publications == [("cdc_relay_outbox", True, False, False)]
        assert _rows(db, "SELECT schemaname, tablename FROM pg_publication_tables") == [
            ("public", "outbox_events")]
    else:
        assert report.publication is Outcome.SKIPPED
        assert publications == []
    _rows(db, "CREATE TABLE other (x int)")
    _rows(db, "INSERT INTO other VALUES (1)")
    with psycopg.connect(db) as conn:
        emit(conn, "a", "1", "e", {"k": "v"})
    assert _peek(db, slot, plugin) == 1


def test_existing_publication_without_the_table_gets_it_added(db: str) -> None:
    _rows(db, "CREATE TABLE other (x int)")
    _rows(db, "CREATE PUBLICATION cdc_relay_outbox FOR TABLE other")

    report = init_database(db, OutboxConfig(), slot=_slot_name(), plugin="pgoutput")

    assert report.publication is Outcome.UPDATED
    assert sorted(_rows(db, "SELECT tablename FROM pg_publication_tables")) == [
        ("other",), ("outbox_events",)]


def test_slot_with_another_plugin_is_a_config_error_naming_the_fix(db: str) -> None:
    slot = _slot_name()
    init_database(db, OutboxConfig(), slot=slot, plugin="pgoutput")

    with pytest.raises(ConfigError) as info:
        init_database(db, OutboxConfig(), slot=slot, plugin="wal2json")

    message = str(info.value)
    assert "plugin 'pgoutput', not 'wal2json'" in message
    assert f"cdc-relay slot drop --slot {slot}" in message
    assert f"pg_drop_replication_slot('{slot}')" in message


def test_ensure_replication_needs_the_table_then_creates_publication_and_slot(
    db: str,
) -> None:
    slot = _slot_name()
    with pytest.raises(ConfigError, match="run `cdc-relay init` first"):
        ensure_replication(db, OutboxConfig(), slot=slot, plugin="pgoutput")
    assert not slot_exists(db, slot)
    init_database(db, OutboxConfig(), slot=None)

    first = ensure_replication(db, OutboxConfig(), slot=slot, plugin="pgoutput")
    second = ensure_replication(db, OutboxConfig(), slot=slot, plugin="pgoutput")

    assert (first.publication, first.slot) == (Outcome.CREATED, Outcome.CREATED)
    assert (second.publication, second.slot) == (Outcome.EXISTED, Outcome.EXISTED)
    assert not second.changed


def _with_init_lock_held(dsn: str, check: Any) -> Any:
    """Run ``check(conn)`` while another session holds init's advisory lock; a check that
    waits for the lock fails after 2 s instead of hanging."""
    with psycopg.connect(dsn) as holder, connect(dsn, autocommit=True) as conn:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
        conn.execute("SET lock_timeout = '2s'")
        return check(conn)


def test_a_publication_already_in_place_is_checked_without_init_s_lock(db: str) -> None:
    # Every restart of a pgoutput relay finds its publication in place: read-only, no
    # transaction, no lock (docs/design.md, start-up).
    slot = _slot_name()
    init_database(db, OutboxConfig(), slot=slot, plugin="pgoutput")

    report = _with_init_lock_held(db, lambda conn: ensure_replication(
        db, OutboxConfig(), slot=slot, plugin="pgoutput", conn=conn))

    assert (report.publication, report.slot) == (Outcome.EXISTED, Outcome.EXISTED)


def test_a_publication_that_must_change_is_changed_under_init_s_lock(db: str) -> None:
    slot = _slot_name()
    init_database(db, OutboxConfig(), slot=slot, plugin="pgoutput")
    _rows(db, "ALTER PUBLICATION cdc_relay_outbox DROP TABLE outbox_events")

    with pytest.raises(DatabaseError, match="lock timeout"):
        _with_init_lock_held(db, lambda conn: ensure_replication(
            db, OutboxConfig(), slot=slot, plugin="pgoutput", conn=conn))
    report = ensure_replication(db, OutboxConfig(), slot=slot, plugin="pgoutput")

    assert report.publication is Outcome.UPDATED
    assert _rows(db, "SELECT tablename FROM pg_publication_tables") == [("outbox_events",)]


def test_the_start_up_checks_run_on_a_shared_connection_and_leave_it_open(db: str) -> None:
    # cdc-relay run does its checks on one connection (docs/design.md, WAL mode, start-up).
    slot = _slot_name()
    init_database(db, OutboxConfig(), slot=None)
    router = RouterConfig(header_columns=(("aggregate_id", "x-aggregate"),))
    with connect(db, autocommit=True) as conn:
        backend = conn.info.backend_pid
        outbox = resolve_message_columns(db, OutboxConfig(), router, conn=conn)
        report = ensure_replication(db, outbox, slot=slot, plugin="wal2json", conn=conn)
        warn_if_unfinished(conn, outbox.table, slot)

        assert not conn.closed and conn.info.backend_pid == backend
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert outbox.extra_columns == ("aggregate_id",)
    assert report.slot is Outcome.CREATED and slot_exists(db, slot)
    with connect(db, autocommit=True) as conn, pytest.raises(ConfigError, match="no column"):
        resolve_message_columns(db, OutboxConfig(), RouterConfig(
            header_columns=(("nope", "x-nope"),)), conn=conn)


def test_slot_none_skips_slot_and_publication(db: str) -> None:
    report = init_database(db, OutboxConfig(), slot=None, plugin="pgoutput")
    assert (report.slot, report.publication) == (Outcome.SKIPPED, Outcome.SKIPPED)
    assert _rows(db, "SELECT count(*) FROM pg_publication") == [(0,)]


def test_drop_slot_refuses_an_active_slot(db: str) -> None:
    slot = _slot_name()
    init_database(db, OutboxConfig(), slot=slot, plugin="wal2json")
    assert slot_exists(db, slot)

    stream = connect(db, replication="database", autocommit=True)
    try:
        stream.pgconn.send_query(f"START_REPLICATION SLOT {slot} LOGICAL 0/0".encode())
        _wait_until(lambda: _active(db, slot), "slot to become active")
        with pytest.raises(SlotBusy, match="is active"):
            drop_slot(db, slot)
        assert slot_exists(db, slot)
    finally:
        stream.close()

    _wait_until(lambda: not _active(db, slot), "slot to become inactive")
    assert drop_slot(db, slot) is True
    assert not slot_exists(db, slot)
    assert drop_slot(db, slot) is False


def _active(db: str, slot: str) -> bool:
    info = slot_info(db, slot)
    return info is not None and info.active


def _wait_until(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.05)


def test_concurrent_inits_are_safe(db: str) -> None:
    slot = _slot_name()
    outbox = OutboxConfig(TableRef.parse("ops.outbox_events"))
    workers = 4
    barrier = threading.Barrier(workers)
    reports: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            reports.append(init_database(db, outbox, slot=slot, plugin="pgoutput"))
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sorted(v for r in reports for v in r.migrations_applied) == [1, 2, 3, 4]
    assert [r.slot for r in reports].count(Outcome.CREATED) == 1
    assert [r.publication for r in reports].count(Outcome.CREATED) == 1
    assert [r.trigger for r in reports] == [Outcome.ABSENT] * workers  # WAL mode: no trigger
    assert _rows(db, "SELECT count(*) FROM ops.cdc_relay_schema_migrations") == [(4,)]


def test_wal_level_replica_is_refused_with_the_fix() -> None:
    with PostgresCluster(settings={"wal_level": "replica"}) as cluster:
        with pytest.raises(DatabaseError) as info:
            init_database(cluster.dsn(), OutboxConfig(), slot="cdc_relay")
        assert "ALTER SYSTEM SET wal_level = logical" in str(info.value)
        assert "restart" in str(info.value)
        # The schema part is done and committed: polling mode works without a slot.
        assert init_database(cluster.dsn(), OutboxConfig(), slot=None).migrations_applied == ()


def test_plugin_missing_from_the_allow_list_is_refused_with_the_fix(
    pg_cluster: PostgresCluster,
) -> None:
    # PostgreSQL 15.19+ only lets slots use the plugins in output_plugin_libraries.
    known = pg_cluster.execute(
        "SELECT count(*) FROM pg_settings WHERE name = 'output_plugin_libraries'")
    if known != "1":
        pytest.skip("this PostgreSQL has no output_plugin_libraries setting")
    pg_cluster.require_plugin("wal2json")
    with PostgresCluster(settings={"output_plugin_libraries": "pgoutput"}) as cluster:
        with pytest.raises(DatabaseError) as info:
            init_database(cluster.dsn(), OutboxConfig(), slot="cdc_relay", plugin="wal2json")
        message = str(info.value)
        assert "ALTER SYSTEM SET output_plugin_libraries = 'pgoutput', 'test_decoding', " \
               "'wal2json'" in message
        assert "--plugin pgoutput" in message
        assert not slot_exists(cluster.dsn(), "cdc_relay")
