"""Doctor's server, endpoint, table and sink checks: pure functions from gathered facts to verdicts.

Owns every check on the server and the outbox that can be decided from the facts
(``ops/doctor/facts.py``) alone - wal_level, slot and sender headroom, REPLICATION,
output_plugin_libraries, the endpoint (a pooler, a read-only node, a standby), the outbox
table, its privileges, trigger and publication, a sink's probe - each failure carrying the
exact fix to run. The slot's own checks are ``ops/doctor/slot_checks.py``.

A check's line is ``Check``/``Verdict`` (cdc_relay/ops/verdicts.py, shared with the
failover checks). Must not do I/O: no connection, no broker, no environment. Gathering the facts and the
two checks that need I/O of their own live in ``ops/doctor/gather.py``; rendering in
``ops/doctor/report.py``.
"""

from __future__ import annotations

from cdc_relay.model import BOOKKEEPING_COLUMNS, NOTIFY_TRIGGER, SlotStatus
from cdc_relay.ops.doctor.facts import (
    DoctorSettings,
    EndpointFacts,
    Facts,
    ServerFacts,
    TableFacts,
    quote_ident,
)
from cdc_relay.ops.verdicts import Check, Verdict
from cdc_relay.sink.config import SinkProbe

DEFAULT_LIBRARIES = ("pgoutput", "test_decoding")  # output_plugin_libraries' default


def plugin_libraries(server: ServerFacts) -> list[str]:
    return [part.strip().strip("'\"") for part in (server.plugin_libraries or "").split(",")
            if part.strip()]


def plugin_allowed(server: ServerFacts, plugin: str) -> bool:
    """False only when the setting is known to leave the plugin out."""
    return server.plugin_libraries is None or plugin in plugin_libraries(server)


def server_checks(server: ServerFacts, slot: SlotStatus | None, plugin: str) -> list[Check]:
    """wal_level, slot and sender headroom, REPLICATION, output_plugin_libraries."""
    restart = "then restart PostgreSQL (a reload is not enough)"
    checks = []
    if server.wal_level == "logical":
        checks.append(Check("wal_level", Verdict.PASS, "logical"))
    else:
        checks.append(Check("wal_level", Verdict.FAIL,
                            f"wal_level is {server.wal_level!r}; WAL mode needs 'logical'",
                            f"ALTER SYSTEM SET wal_level = logical; {restart} "
                            "- or use polling mode (cdc-relay poll)"))
    used, most = server.slots_used, server.max_slots
    if slot is not None or used < most:
        checks.append(Check("max_replication_slots", Verdict.PASS, f"{used} of {most} in use"))
    else:
        checks.append(Check("max_replication_slots", Verdict.FAIL,
                            f"all {most} replication slots are in use",
                            "drop unused slots (SELECT pg_drop_replication_slot('<name>')) or "
                            f"ALTER SYSTEM SET max_replication_slots = {most + 2}; {restart}"))
    needed = 0 if slot is not None and slot.active else 1
    if server.max_senders - server.senders_used >= needed:
        checks.append(Check("max_wal_senders", Verdict.PASS,
                            f"{server.senders_used} of {server.max_senders} in use"))
    else:
        checks.append(Check("max_wal_senders", Verdict.FAIL,
                            f"all {server.max_senders} WAL senders are in use",
                            f"ALTER SYSTEM SET max_wal_senders = {server.max_senders + 2}; {restart}"))
    return [*checks, _replication_check(server), _libraries_check(server, plugin)]


def may_replicate(server: ServerFacts) -> bool:
    """Superuser, REPLICATION, or membership in rds_replication (RDS/Aurora)."""
    return server.superuser or server.replication or server.rds_replication


def _replication_check(server: ServerFacts) -> Check:
    if server.superuser:
        return Check("REPLICATION", Verdict.PASS, f"role {server.role} is a superuser")
    if server.replication:
        return Check("REPLICATION", Verdict.PASS, f"role {server.role} has REPLICATION")
    if server.rds_replication:
        return Check("REPLICATION", Verdict.PASS, f"role {server.role} is a member of "
                     "rds_replication (RDS/Aurora's replication right)")
    role = quote_ident(server.role)
    return Check("REPLICATION", Verdict.FAIL,
                 f"role {server.role} may not open a replication connection",
                 f"as a superuser: ALTER ROLE {role} REPLICATION; (on RDS/Aurora, as the "
                 f"master user: GRANT rds_replication TO {role};)")


POOLER_FIX = ("point --dsn at PostgreSQL itself (its own host and port), not at the pooler: "
              "a logical replication stream needs a direct connection")


def endpoint_checks(facts: Facts, options: DoctorSettings) -> list[Check]:
    """The wrong endpoint: a pooler that cannot replicate (WAL mode), a read-only node."""
    checks = []
    endpoint = facts.endpoint
    if endpoint.probed:
        name = "replication connection"
        if endpoint.replication_error is None:
            checks.append(Check(name, Verdict.PASS, "opened (IDENTIFY_SYSTEM answered)"))
        elif endpoint.pooler:
            checks.append(Check(name, Verdict.FAIL, "--dsn reaches a connection pooler, which "
                                "cannot carry a replication connection (it answered: "
                                f"{endpoint.replication_error})", POOLER_FIX))
        elif not may_replicate(facts.server):
            checks.append(Check(name, Verdict.SKIP, "not possible without the right to "
                                "replicate (see REPLICATION)"))
        else:
            checks.append(Check(name, Verdict.FAIL, endpoint.replication_error,
                                "allow it in pg_hba.conf: a 'host replication <role> <client "
                                "address> <method>' line (the database 'all' does not cover "
                                "replication connections)"))
    what = ("init, polling's claims" if options.mode == "poll"
            else "init, the slot's continuity record")
    if endpoint.read_only is None:
        checks.append(Check("writable", Verdict.PASS, "the server accepts writes"))
    else:
        fix = "point --dsn at the primary (the writer endpoint), not a replica or reader endpoint"
        if options.mode == "wal" and endpoint.hot_standby_feedback is not None:
            fix += ("; or decode on this standby: run --dsn <this standby> --primary-dsn "
                    "<its primary> (PostgreSQL 16+), which writes on the primary")
        if "default_transaction_read_only" in endpoint.read_only:
            fix += (f"; or ALTER ROLE {quote_ident(facts.server.role)} SET "
                    "default_transaction_read_only = off;")
        checks.append(Check("writable", Verdict.FAIL,
                            f"the server is {endpoint.read_only}; {what} must write", fix))
    if options.mode == "wal" and endpoint.hot_standby_feedback is not None:
        checks.extend(standby_decoding_checks(endpoint))
    return checks


def standby_decoding_checks(endpoint: EndpointFacts) -> list[Check]:
    """A hot standby as ``run --primary-dsn``'s ``--dsn``: what decoding there needs (the
    standby's own wal_level is the wal_level check; the primary's shows in its slot's
    ``wal_level_insufficient`` invalidation)."""
    checks = []
    version = endpoint.standby_version or 0
    if version >= 16:
        checks.append(Check("standby decoding", Verdict.PASS,
                            f"PostgreSQL {version} decodes on a standby (run --primary-dsn)"))
    else:
        checks.append(Check("standby decoding", Verdict.FAIL,
                            f"PostgreSQL {version} cannot decode on a standby (16+ can)",
                            "upgrade the standby to PostgreSQL 16 or later, or decode on the "
                            "primary"))
    if endpoint.hot_standby_feedback == "on":
        checks.append(Check("hot_standby_feedback", Verdict.PASS, "on"))
    else:
        checks.append(Check(
            "hot_standby_feedback", Verdict.FAIL,
            f"hot_standby_feedback is {endpoint.hot_standby_feedback!r} on the standby: VACUUM "
            "on the primary may remove catalog rows the standby's slot needs, and PostgreSQL "
            "then invalidates it (rows_removed)",
            "ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf(); on the "
            "standby (with primary_slot_name set, so the feedback survives its restarts)"))
    return checks


def libraries_fix(server: ServerFacts, plugin: str) -> str:
    wanted = ", ".join(f"'{lib}'" for lib in [*(plugin_libraries(server) or DEFAULT_LIBRARIES),
                                              plugin])
    return (f"as a superuser: ALTER SYSTEM SET output_plugin_libraries = {wanted}; "
            "SELECT pg_reload_conf(); - or use --plugin pgoutput")


def _libraries_check(server: ServerFacts, plugin: str) -> Check:
    name = "output_plugin_libraries"
    if server.libraries_hidden:
        return Check(name, Verdict.SKIP, f"not readable by role {server.role} (needs "
                     "pg_read_all_settings); the probe below shows whether the plugin loads")
    if server.plugin_libraries is None:
        return Check(name, Verdict.PASS, "not restricted by this server version")
    if plugin_allowed(server, plugin):
        return Check(name, Verdict.PASS, f"allows {plugin} ({server.plugin_libraries})")
    return Check(name, Verdict.FAIL, f"{server.plugin_libraries!r} does not allow {plugin}",
                 libraries_fix(server, plugin))


def table_checks(facts: Facts, options: DoctorSettings) -> list[Check]:
    """The outbox table, its columns, privileges, trigger and (pgoutput) publication."""
    table, info, poll = options.outbox.table, facts.table, options.mode == "poll"
    if not info.exists:
        return [Check("outbox table", Verdict.FAIL, f"{table} does not exist",
                      f"cdc-relay init --dsn DSN --table {table}" + (" --mode poll" if poll else ""))]
    columns = options.outbox.columns
    missing = [getattr(columns, role) for role in columns.__dataclass_fields__
               if getattr(columns, role) not in info.columns]
    bookkeeping = [c for c in BOOKKEEPING_COLUMNS if c not in info.columns]
    if missing:
        table_check = Check("outbox table", Verdict.FAIL, f"{table} lacks {', '.join(missing)}",
                            "map the columns: --columns debezium or --columns FIELD=COLUMN,...")
    elif bookkeeping and poll:
        table_check = Check("outbox table", Verdict.FAIL, f"{table} lacks {', '.join(bookkeeping)}",
                            f"cdc-relay init --dsn DSN --table {table} --mode poll (adds them)")
    else:
        table_check = Check("outbox table", Verdict.PASS, f"{table} has the event columns"
                            + (" (no polling columns: WAL mode only)" if bookkeeping else "")
                            + _partition_note(info, options))
    checks = [table_check, _privileges_check(facts, options), _trigger_check(info, poll)]
    if not poll and options.plugin == "pgoutput":
        checks.append(_publication_check(facts, options))
    return [*checks, _messages_check(facts.server, options)]


def _messages_check(server: ServerFacts, options: DoctorSettings) -> Check:
    """Whether events written with outbox.emit_message (logical decoding messages) are relayed."""
    name = "tableless outbox"
    if options.mode == "poll":
        return Check(name, Verdict.SKIP, "polling mode cannot see events written with "
                     "emit_message() (logical decoding messages, no row): relay those with "
                     "WAL mode (cdc-relay run)")
    major = server.version.split(".")[0]
    if options.plugin == "pgoutput" and major.isdigit() and int(major) < 14:
        return Check(name, Verdict.FAIL, f"pgoutput on PostgreSQL {server.version} cannot send "
                     "logical decoding messages (needs 14+), so the relay cannot start",
                     "use --plugin wal2json, or upgrade PostgreSQL")
    return Check(name, Verdict.PASS, "emit_message() events ('cdc-relay' logical decoding "
                 "messages) are relayed like rows")


def _privileges_check(facts: Facts, options: DoctorSettings) -> Check:
    privileges, poll = facts.table.privileges, options.mode == "poll"
    have = ", ".join(f"{p} {'yes' if ok else 'no'}" for p, ok in privileges.items())
    needed = ("SELECT", "UPDATE") if poll else ("SELECT",)
    lacking = [p for p in needed if not privileges.get(p)]
    if not lacking:
        return Check("table privileges", Verdict.PASS, have)
    why = "polling claims and marks rows" if poll else "status and dead-letters read the table"
    return Check("table privileges", Verdict.FAIL if poll else Verdict.WARN,
                 f"{have}: {why}",
                 f"GRANT {', '.join(lacking)} ON {options.outbox.table} TO "
                 f"{quote_ident(facts.server.role)};")


def _partition_note(info: TableFacts, options: DoctorSettings) -> str:
    if info.partitions is None:
        return ""
    note = f"; partitioned, {info.partitions} partition(s)"
    if options.mode == "wal" and options.plugin == "wal2json":
        note += (" (wal2json streams every table's inserts and the relay picks the partitions'; "
                 "pgoutput filters on the server)")
    return note


def _trigger_check(info: TableFacts, poll: bool) -> Check:
    if info.trigger and not poll:
        return Check("notify trigger", Verdict.WARN,
                     f"{NOTIFY_TRIGGER} is installed but WAL mode does not use it: it costs every "
                     "insert a NOTIFY and makes PREPARE TRANSACTION fail in writing transactions",
                     "cdc-relay init --dsn DSN (WAL mode drops it), unless pollers also read "
                     "this table")
    if info.trigger:
        partitioned = "" if info.partitions is None else (
            " (inserts into the parent; rows inserted straight into a partition wait for "
            "--interval)")
        return Check("notify trigger", Verdict.PASS,
                     f"{NOTIFY_TRIGGER} wakes pollers on insert{partitioned}")
    if not poll:
        return Check("notify trigger", Verdict.PASS, "absent (WAL mode does not need it)")
    return Check("notify trigger", Verdict.WARN, "absent: pollers wake only every --interval",
                 "cdc-relay init --dsn DSN --mode poll (without --no-trigger)")


def _publication_check(facts: Facts, options: DoctorSettings) -> Check:
    pub, table, info = options.publication, options.outbox.table, facts.publication
    can_fix = facts.table.owner or facts.server.superuser
    if not info.exists:
        return Check("publication", Verdict.WARN if can_fix else Verdict.FAIL,
                     f"{pub} does not exist" + ("; the relay creates it on start" if can_fix else ""),
                     f"as the table's owner: CREATE PUBLICATION {quote_ident(pub)} FOR TABLE "
                     f"{table} WITH (publish = 'insert');")
    if not info.inserts:
        return Check("publication", Verdict.FAIL, f"{pub} does not publish inserts",
                     f"ALTER PUBLICATION {quote_ident(pub)} SET (publish = 'insert');")
    if not info.includes_table:
        return Check("publication", Verdict.WARN if can_fix else Verdict.FAIL,
                     f"{pub} does not include {table}",
                     f"ALTER PUBLICATION {quote_ident(pub)} ADD TABLE {table};")
    if facts.table.partitions is not None and not info.via_root:
        return Check("publication", Verdict.WARN if can_fix else Verdict.FAIL,
                     f"{pub} publishes the partitions of {table} under their own names, which "
                     "the relay does not read" + ("; the relay sets publish_via_partition_root "
                                                   "on start" if can_fix else ""),
                     f"ALTER PUBLICATION {quote_ident(pub)} SET (publish_via_partition_root = true);")
    return Check("publication", Verdict.PASS, f"{pub} publishes inserts of {table}"
                 + (" via its partition root" if facts.table.partitions is not None else ""))

def sink_checks(found: list[SinkProbe]) -> list[Check]:
    """The report lines of a RabbitMQ or NATS probe (ok None = a warning)."""
    verdicts = {True: Verdict.PASS, False: Verdict.FAIL, None: Verdict.WARN}
    return [Check(f"broker: {probe.name}", verdicts[probe.ok], probe.detail,
                  None if probe.ok else probe.fix, probe.exit_code) for probe in found]
