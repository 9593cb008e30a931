"""``cdc-relay doctor``: will the relay work against this database and broker, and if not, why.

Facts are gathered in one pass over one ordinary connection (``gather``): server
settings, the role, the outbox table and its privileges, the publication and the slot;
then the failover facts (ops/failover: the primary's, and a standby's over a connection
of its own when ``--standby-dsn`` is given).
The checks are pure functions of those facts, so they are tested without a server; each
failure carries the exact fix (an ``ALTER SYSTEM`` line, a ``GRANT``, a command). Two
checks need I/O of their own: the output plugin probe - wal2json is not an extension,
so ``pg_available_extensions`` cannot tell; creating and dropping a temporary slot can -
and the broker's: Kafka's metadata request, or the RabbitMQ / NATS sink's probe (connect,
log in, the exchange or stream; sink/factory.py).

This module owns the I/O half: gathering, the two probes, and running every check in
order. The facts are ``ops/doctor/facts.py``; the verdicts on them ``ops/doctor/checks.py``
and ``ops/doctor/slot_checks.py``; the report is ``ops/doctor/report.py``.

Must not change anything except that temporary slot, nor stop at the first failure: an
operator wants the whole list at once.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import errors as pgerrors
from psycopg import sql

from cdc_relay.config import validate_slot_name
from cdc_relay.errors import AccessRefused, RelayError, ServiceUnavailable, mask_secrets
from cdc_relay.model import NOTIFY_TRIGGER
from cdc_relay.ops.doctor.checks import (
    endpoint_checks,
    libraries_fix,
    may_replicate,
    plugin_allowed,
    server_checks,
    sink_checks,
    table_checks,
)
from cdc_relay.ops.doctor.facts import (
    BackfillFacts,
    DoctorSettings,
    EndpointFacts,
    Facts,
    PublicationFacts,
    ServerFacts,
    TableFacts,
    quote_ident,
)
from cdc_relay.ops.doctor.slot_checks import backfill_check, idle_slot_checks, slot_checks
from cdc_relay.ops.failover.checks import failover_checks
from cdc_relay.ops.failover.read import gather_failover
from cdc_relay.ops.verdicts import Check, Verdict
from cdc_relay.pg.db import connect, describe_dsn, translate_error, validated_table
from cdc_relay.pg.endpoint import pooler_refusal, probe_replication, read_only_reason
from cdc_relay.pg.slots import idle_logical_slots, read_slot_status
from cdc_relay.sink.kafka.client import check_brokers
from cdc_relay.text import one_line
from cdc_relay.wal.backfill.state import backfill_running, read_record
from cdc_relay.wal.slot.continuity import read_record as read_slot_record

PROBE_TIMEOUT = "10s"  # creating a slot waits for running transactions: bound it


_SERVER_SQL = """
SELECT current_setting('server_version'), current_database(), current_user,
       r.rolsuper, r.rolreplication, current_setting('wal_level'),
       current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int,
       pg_size_bytes(current_setting('max_slot_wal_keep_size')),
       (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication),
       pg_size_bytes(current_setting('wal_segment_size')),
       EXISTS (SELECT 1 FROM pg_roles AS g WHERE g.rolname = 'rds_replication'
               AND pg_has_role(current_user, g.oid, 'MEMBER'))
FROM pg_roles AS r WHERE r.rolname = current_user
"""

_TABLE_SQL = """
SELECT pg_has_role(current_user, c.relowner, 'USAGE'),
       has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
       has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE'),
       EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = c.oid AND t.tgname = %s
               AND NOT t.tgisinternal),
       ARRAY(SELECT a.attname::text FROM pg_attribute AS a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       CASE WHEN c.relkind = 'p' THEN
            (SELECT count(*) FROM pg_partition_tree(c.oid) AS t WHERE t.isleaf)::int END
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""

_PUBLICATION_SQL = """
SELECT p.pubinsert, p.puballtables OR EXISTS (
    SELECT 1 FROM pg_publication_tables AS t
    WHERE t.pubname = p.pubname AND t.schemaname = %s AND t.tablename = %s) OR EXISTS (
    SELECT 1 FROM pg_publication_rel AS r
    WHERE r.prpubid = p.oid AND r.prrelid = to_regclass(%s)), p.pubviaroot
FROM pg_publication AS p WHERE p.pubname = %s
"""


def gather(conn: psycopg.Connection[Any], options: DoctorSettings) -> Facts:
    """Read every fact the checks need (read-only)."""
    table = validated_table(options.outbox.table)
    try:
        row = conn.execute(_SERVER_SQL).fetchone()
        assert row is not None
        server = _with_libraries(conn, replace(ServerFacts(*row[:11]), wal_segment_size=row[11],
                                               rds_replication=bool(row[12])))
        read_only = read_only_reason(conn)
        found = conn.execute(_TABLE_SQL, (NOTIFY_TRIGGER, table.schema, table.name)).fetchone()
        pub = conn.execute(_PUBLICATION_SQL, (table.schema, table.name, f"{quote_ident(table.schema)}."
                                              f"{quote_ident(table.name)}",
                                              options.publication)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, "reading server settings and catalogs") from exc
    table_facts = TableFacts(False)
    if found is not None:
        owner, select, insert, update, delete, trigger, columns, partitions = found
        table_facts = TableFacts(True, owner, {"SELECT": select, "INSERT": insert,
                                               "UPDATE": update, "DELETE": delete},
                                 trigger, frozenset(columns), partitions)
    publication = PublicationFacts(False)
    if pub is not None:
        inserts, includes, via_root = pub
        publication = PublicationFacts(True, inserts, bool(includes), via_root)
    backfill = None
    # Without SELECT the count would fail: the table privileges check reports it instead.
    if ({"processed_at", "dead_lettered_at"} <= table_facts.columns
            and table_facts.privileges.get("SELECT")):
        backfill = gather_backfill(conn, options)
    endpoint = EndpointFacts(read_only=read_only)
    if read_only is not None and "pg_is_in_recovery" in read_only:
        try:
            row = conn.execute("SELECT current_setting('hot_standby_feedback')").fetchone()
        except psycopg.Error as exc:
            raise translate_error(exc, "reading hot_standby_feedback") from exc
        endpoint = replace(endpoint, hot_standby_feedback=row[0] if row else "unknown",
                           standby_version=conn.info.server_version // 10000)
    if options.mode == "wal":
        error = probe_replication(options.dsn)
        endpoint = replace(endpoint, probed=True, pooler=error is not None and pooler_refusal(error),
                           replication_error=None if error is None else mask_secrets(
                               one_line(str(error))).split("FATAL:")[-1].strip())
    return Facts(server, table_facts, publication, read_slot_status(conn, options.slot)[1],
                 tuple(idle_logical_slots(conn)), backfill, endpoint)


def gather_backfill(conn: psycopg.Connection[Any], options: DoctorSettings) -> BackfillFacts:
    """Pending rows, the oldest one, those older than the slot's recorded creation, and the
    slot's backfill record (read-only)."""
    table = validated_table(options.outbox.table)
    created = sql.Identifier(options.outbox.columns.created_at)
    record = read_record(conn, table, options.slot)
    since = record.started_at if record is not None else None
    try:
        slot_record = read_slot_record(conn, table.schema, options.slot)
    except AccessRefused:  # a role without SELECT on the records: counted as before
        slot_record = None
    slot_created = slot_record.created_at if slot_record is not None else None
    try:
        row = conn.execute(sql.SQL(
            "SELECT count(*), min({c}), count(*) FILTER (WHERE {c} < %s),"
            " count(*) FILTER (WHERE {c} < %s) FROM {t}"
            " WHERE processed_at IS NULL AND dead_lettered_at IS NULL").format(
                c=created, t=sql.Identifier(table.schema, table.name)),
            (since, slot_created)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"counting pending rows of {table}") from exc
    pending, oldest, before, before_slot = row if row is not None else (0, None, 0, 0)
    if record is None:
        return BackfillFacts(pending, oldest,
                             pending_before_slot=None if slot_created is None else before_slot)
    running = not record.finished and backfill_running(conn, options.slot)
    return BackfillFacts(pending, oldest, record.state, running, record.rows_done,
                         record.rows_total, before)


def _with_libraries(conn: psycopg.Connection[Any], server: ServerFacts) -> ServerFacts:
    """output_plugin_libraries (15.19+) is readable only with pg_read_all_settings."""
    try:
        row = conn.execute("SELECT current_setting('output_plugin_libraries', true)").fetchone()
    except pgerrors.InsufficientPrivilege:
        return replace(server, libraries_hidden=True)
    return replace(server, plugin_libraries=row[0] if row else None)


def probe_plugin(conn: psycopg.Connection[Any], facts: Facts, options: DoctorSettings) -> Check:
    """Can the plugin be loaded? Create and drop a temporary slot with it."""
    name, plugin, server = "plugin loads", options.plugin, facts.server
    if plugin == "pgoutput":
        return Check(name, Verdict.PASS, "pgoutput is built into PostgreSQL")
    slot = facts.slot
    if slot is not None and slot.active and slot.plugin == plugin:
        return Check(name, Verdict.PASS, f"slot {slot.name} is streaming with {plugin}")
    blockers = [reason for reason, blocked in (
        ("wal_level is not logical", server.wal_level != "logical"),
        ("the role lacks REPLICATION", not may_replicate(server)),
        ("no replication slot is free", server.slots_used >= server.max_slots),
        ("output_plugin_libraries does not allow it", not plugin_allowed(server, plugin)),
    ) if blocked]
    if blockers:
        return Check(name, Verdict.SKIP, f"not probed: {'; '.join(blockers)} (see above)")
    probe = f"cdc_relay_doctor_{os.getpid()}"
    try:
        conn.execute(f"SET statement_timeout = '{PROBE_TIMEOUT}'")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, %s, true)", (probe, plugin))
        conn.execute("SELECT pg_drop_replication_slot(%s)", (probe,))
        conn.execute("RESET statement_timeout")
    except psycopg.Error as exc:
        return _probe_failed(exc, plugin, server)
    return Check(name, Verdict.PASS, f"a temporary slot with {plugin} was created and dropped")


def _probe_failed(exc: psycopg.Error, plugin: str, server: ServerFacts) -> Check:
    message = " ".join((exc.diag.message_primary or str(exc)).split())
    if exc.sqlstate == "57014":
        return Check("plugin loads", Verdict.WARN,
                     f"not probed: creating a slot waited over {PROBE_TIMEOUT} for running "
                     "transactions to finish", "run doctor again when long transactions are done")
    if "may not be used as an output plugin" in message:
        return Check("plugin loads", Verdict.FAIL, message, libraries_fix(server, plugin))
    if exc.sqlstate == "58P01" or "could not access file" in message:
        major = server.version.split(".")[0]
        return Check("plugin loads", Verdict.FAIL, f"{plugin} is not installed on the server "
                     f"({message})", f"install the server package postgresql-{major}-{plugin} "
                     f"(e.g. apt-get install postgresql-{major}-{plugin}), or use --plugin pgoutput")
    return Check("plugin loads", Verdict.FAIL, str(translate_error(exc, f"probing {plugin}")))


def check_sink(options: DoctorSettings) -> list[Check]:
    """The broker checks: Kafka's metadata request, or the RabbitMQ / NATS probe."""
    if options.sink is None:
        return [check_broker(options)]
    from cdc_relay.sink.factory import probe_sink

    try:
        return sink_checks(probe_sink(options.sink, options.broker_timeout))
    except RelayError as exc:  # e.g. the client library is not installed
        return [Check("broker", Verdict.FAIL, str(exc))]


def check_broker(options: DoctorSettings) -> Check:
    """A metadata request with the relay's own producer settings."""
    if options.kafka is None:
        return Check("broker", Verdict.SKIP, "not checked: pass --brokers HOST:PORT")
    try:
        check_brokers(options.kafka, options.broker_timeout)
    except AccessRefused as exc:  # the line says what to fix
        return Check("broker", Verdict.FAIL, str(exc),
                     "pass the relay's user and password (sasl.username / sasl.password) "
                     "with --producer-config")
    except RelayError as exc:
        return Check("broker", Verdict.FAIL, str(exc),
                     "start the broker or correct --brokers; for SASL/SSL pass the same "
                     "--producer-config as the relay", exc.exit_code)
    return Check("broker", Verdict.PASS, f"{options.kafka.brokers} answered a metadata request")


def run_doctor(options: DoctorSettings) -> list[Check]:
    """Every check, in order; a connection failure skips the database checks."""
    validate_slot_name(options.slot)
    validated_table(options.outbox.table)
    checks: list[Check] = []
    try:
        conn = connect(options.dsn, autocommit=True, application_name="cdc-relay doctor")
    except ServiceUnavailable as exc:
        checks.append(Check("connection", Verdict.FAIL, str(exc),
                            "check --dsn (host, port, database, user, password) and that the "
                            "server accepts this client (listen_addresses, pg_hba.conf)",
                            exc.exit_code))
    else:
        with conn:
            checks += _database_checks(conn, options)
    checks += check_sink(options)
    return checks


def _failover_checks(conn: psycopg.Connection[Any], options: DoctorSettings) -> list[Check]:
    """PostgreSQL 17+ failover slots: the primary's side, and the standby's when given."""
    try:
        primary, standby, error = gather_failover(conn, options.standby_dsn, options.slot)
    except RelayError as exc:
        return [Check("failover", Verdict.FAIL, str(exc))]
    return failover_checks(primary, standby, options.slot,
                           standby_given=options.standby_dsn is not None, standby_error=error)


def _database_checks(conn: psycopg.Connection[Any], options: DoctorSettings) -> list[Check]:
    try:
        facts = gather(conn, options)
    except RelayError as exc:
        return [Check("catalogs", Verdict.FAIL, str(exc))]
    server = facts.server
    if options.plugin_from_slot and facts.slot is not None and facts.slot.plugin in (
            "wal2json", "pgoutput"):
        options = replace(options, plugin=facts.slot.plugin)  # what run would use
    checks = [Check("connection", Verdict.PASS, f"{server.role}@{describe_dsn(options.dsn)}, "
                    f"PostgreSQL {server.version}"), *endpoint_checks(facts, options)]
    if options.mode == "wal":
        checks += server_checks(server, facts.slot, options.plugin)
        checks.append(probe_plugin(conn, facts, options))
    checks += table_checks(facts, options)
    if options.mode == "wal":
        checks += slot_checks(facts, options)
        backfill = backfill_check(facts, options)
        if backfill is not None:
            checks.append(backfill)
        checks += _failover_checks(conn, options)
    else:
        checks += idle_slot_checks(facts)
    return checks
