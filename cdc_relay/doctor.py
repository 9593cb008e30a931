"""``cdc-relay doctor``: will the relay work against this database and broker, and if not, why.

Facts are gathered in one pass over one ordinary connection (``gather``): server
settings, the role, the outbox table and its privileges, the publication and the slot.
The checks are pure functions of those facts, so they are tested without a server; each
failure carries the exact fix (an ``ALTER SYSTEM`` line, a ``GRANT``, a command). Two
checks need I/O of their own: the output plugin probe - wal2json is not an extension,
so ``pg_available_extensions`` cannot tell; creating and dropping a temporary slot can -
and the broker's metadata request.

Must not change anything except that temporary slot, nor stop at the first failure: an
operator wants the whole list at once.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson
import psycopg
from psycopg import errors as pgerrors

from cdc_relay.config import KafkaConfig, OutboxConfig, validate_slot_name
from cdc_relay.db import BOOKKEEPING_COLUMNS, connect, describe_dsn, translate_error, validated_table
from cdc_relay.errors import RelayError, ServiceUnavailable
from cdc_relay.ops import SlotStatus, human_bytes, read_slot_status
from cdc_relay.schema import NOTIFY_TRIGGER
from cdc_relay.sink.kafka import check_brokers

DEFAULT_LIBRARIES = ("pgoutput", "test_decoding")  # output_plugin_libraries' default
PROBE_TIMEOUT = "10s"  # creating a slot waits for running transactions: bound it
RETENTION_WARN = 0.8  # of max_slot_wal_keep_size


class Verdict(enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of doctor's report; ``fix`` says what to run when it is not a pass."""

    name: str
    verdict: Verdict
    detail: str
    fix: str | None = None


@dataclass(frozen=True, slots=True)
class DoctorOptions:
    """What to check: the relay's own options."""

    dsn: str
    outbox: OutboxConfig = field(default_factory=OutboxConfig)
    slot: str = "cdc_relay"
    plugin: str = "wal2json"
    publication: str = "cdc_relay_outbox"
    mode: str = "wal"  # or "poll": skip logical decoding checks
    kafka: KafkaConfig | None = None
    broker_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class ServerFacts:
    version: str
    database: str
    role: str
    superuser: bool
    replication: bool
    wal_level: str
    max_slots: int
    max_senders: int
    keep_size: int  # max_slot_wal_keep_size in bytes, -1 = unlimited
    slots_used: int
    senders_used: int
    plugin_libraries: str | None = None  # output_plugin_libraries; None where the server lacks it
    libraries_hidden: bool = False  # the setting exists but this role may not read it


@dataclass(frozen=True, slots=True)
class TableFacts:
    exists: bool
    owner: bool = False
    privileges: dict[str, bool] = field(default_factory=dict)
    trigger: bool = False
    columns: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PublicationFacts:
    exists: bool
    inserts: bool = False
    includes_table: bool = False


@dataclass(frozen=True, slots=True)
class Facts:
    server: ServerFacts
    table: TableFacts
    publication: PublicationFacts
    slot: SlotStatus | None


# ---------------------------------------------------------------- gathering (I/O)

_SERVER_SQL = """
SELECT current_setting('server_version'), current_database(), current_user,
       r.rolsuper, r.rolreplication, current_setting('wal_level'),
       current_setting('max_replication_slots')::int, current_setting('max_wal_senders')::int,
       pg_size_bytes(current_setting('max_slot_wal_keep_size')),
       (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication)
FROM pg_roles AS r WHERE r.rolname = current_user
"""

_TABLE_SQL = """
SELECT pg_has_role(current_user, c.relowner, 'USAGE'),
       has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'),
       has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE'),
       EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = c.oid AND t.tgname = %s
               AND NOT t.tgisinternal),
       ARRAY(SELECT a.attname::text FROM pg_attribute AS a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
"""

_PUBLICATION_SQL = """
SELECT p.pubinsert, p.puballtables OR EXISTS (
    SELECT 1 FROM pg_publication_tables AS t
    WHERE t.pubname = p.pubname AND t.schemaname = %s AND t.tablename = %s)
FROM pg_publication AS p WHERE p.pubname = %s
"""


def gather(conn: psycopg.Connection[Any], options: DoctorOptions) -> Facts:
    """Read every fact the checks need (read-only)."""
    table = validated_table(options.outbox.table)
    try:
        row = conn.execute(_SERVER_SQL).fetchone()
        assert row is not None
        server = _with_libraries(conn, ServerFacts(*row))
        found = conn.execute(_TABLE_SQL, (NOTIFY_TRIGGER, table.schema, table.name)).fetchone()
        pub = conn.execute(_PUBLICATION_SQL, (table.schema, table.name,
                                              options.publication)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, "reading server settings and catalogs") from exc
    table_facts = TableFacts(False)
    if found is not None:
        owner, select, insert, update, delete, trigger, columns = found
        table_facts = TableFacts(True, owner, {"SELECT": select, "INSERT": insert,
                                               "UPDATE": update, "DELETE": delete},
                                 trigger, frozenset(columns))
    publication = PublicationFacts(pub is not None, *(pub or ()))
    return Facts(server, table_facts, publication, read_slot_status(conn, options.slot)[1])


def _with_libraries(conn: psycopg.Connection[Any], server: ServerFacts) -> ServerFacts:
    """output_plugin_libraries (15.19+) is readable only with pg_read_all_settings."""
    try:
        row = conn.execute("SELECT current_setting('output_plugin_libraries', true)").fetchone()
    except pgerrors.InsufficientPrivilege:
        return replace(server, libraries_hidden=True)
    return replace(server, plugin_libraries=row[0] if row else None)


def probe_plugin(conn: psycopg.Connection[Any], facts: Facts, options: DoctorOptions) -> Check:
    """Can the plugin be loaded? Create and drop a temporary slot with it."""
    name, plugin, server = "plugin loads", options.plugin, facts.server
    if plugin == "pgoutput":
        return Check(name, Verdict.PASS, "pgoutput is built into PostgreSQL")
    slot = facts.slot
    if slot is not None and slot.active and slot.plugin == plugin:
        return Check(name, Verdict.PASS, f"slot {slot.name} is streaming with {plugin}")
    blockers = [reason for reason, blocked in (
        ("wal_level is not logical", server.wal_level != "logical"),
        ("the role lacks REPLICATION", not (server.superuser or server.replication)),
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
        return Check("plugin loads", Verdict.FAIL, message, _libraries_fix(server, plugin))
    if exc.sqlstate == "58P01" or "could not access file" in message:
        major = server.version.split(".")[0]
        return Check("plugin loads", Verdict.FAIL, f"{plugin} is not installed on the server "
                     f"({message})", f"install the server package postgresql-{major}-{plugin} "
                     f"(e.g. apt-get install postgresql-{major}-{plugin}), or use --plugin pgoutput")
    return Check("plugin loads", Verdict.FAIL, str(translate_error(exc, f"probing {plugin}")))


def check_broker(options: DoctorOptions) -> Check:
    """A metadata request with the relay's own producer settings."""
    if options.kafka is None:
        return Check("broker", Verdict.SKIP, "not checked: pass --brokers HOST:PORT")
    try:
        check_brokers(options.kafka, options.broker_timeout)
    except RelayError as exc:
        return Check("broker", Verdict.FAIL, str(exc),
                     "start the broker or correct --brokers; for SASL/SSL pass the same "
                     "--producer-config as the relay")
    return Check("broker", Verdict.PASS, f"{options.kafka.brokers} answered a metadata request")


def run_doctor(options: DoctorOptions) -> list[Check]:
    """Every check, in order; a connection failure skips the database checks."""
    validate_slot_name(options.slot)
    validated_table(options.outbox.table)
    checks: list[Check] = []
    try:
        conn = connect(options.dsn, autocommit=True, application_name="cdc-relay doctor")
    except ServiceUnavailable as exc:
        checks.append(Check("connection", Verdict.FAIL, str(exc),
                            "check --dsn (host, port, database, user, password) and that the "
                            "server accepts this client (listen_addresses, pg_hba.conf)"))
    else:
        with conn:
            checks += _database_checks(conn, options)
    checks.append(check_broker(options))
    return checks


def _database_checks(conn: psycopg.Connection[Any], options: DoctorOptions) -> list[Check]:
    try:
        facts = gather(conn, options)
    except RelayError as exc:
        return [Check("catalogs", Verdict.FAIL, str(exc))]
    server = facts.server
    checks = [Check("connection", Verdict.PASS, f"{server.role}@{describe_dsn(options.dsn)}, "
                    f"PostgreSQL {server.version}")]
    if options.mode == "wal":
        checks += server_checks(server, facts.slot, options.plugin)
        checks.append(probe_plugin(conn, facts, options))
    checks += table_checks(facts, options)
    if options.mode == "wal":
        checks += slot_checks(facts, options)
    return checks


# ---------------------------------------------------------------- the checks (pure)

def quote_ident(name: str) -> str:
    """A double-quoted SQL identifier, for fixes printed to the user."""
    return '"' + name.replace('"', '""') + '"'


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


def _replication_check(server: ServerFacts) -> Check:
    if server.superuser:
        return Check("REPLICATION", Verdict.PASS, f"role {server.role} is a superuser")
    if server.replication:
        return Check("REPLICATION", Verdict.PASS, f"role {server.role} has REPLICATION")
    return Check("REPLICATION", Verdict.FAIL,
                 f"role {server.role} may not open a replication connection",
                 f"as a superuser: ALTER ROLE {quote_ident(server.role)} REPLICATION;")


def _libraries_fix(server: ServerFacts, plugin: str) -> str:
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
                 _libraries_fix(server, plugin))


def table_checks(facts: Facts, options: DoctorOptions) -> list[Check]:
    """The outbox table, its columns, privileges, trigger and (pgoutput) publication."""
    table, info, poll = options.outbox.table, facts.table, options.mode == "poll"
    if not info.exists:
        return [Check("outbox table", Verdict.FAIL, f"{table} does not exist",
                      f"cdc-relay init --dsn DSN --table {table}" + (" --no-slot" if poll else ""))]
    columns = options.outbox.columns
    missing = [getattr(columns, role) for role in columns.__dataclass_fields__
               if getattr(columns, role) not in info.columns]
    bookkeeping = [c for c in BOOKKEEPING_COLUMNS if c not in info.columns]
    if missing:
        table_check = Check("outbox table", Verdict.FAIL, f"{table} lacks {', '.join(missing)}",
                            "map the columns: --columns debezium or --columns FIELD=COLUMN,...")
    elif bookkeeping and poll:
        table_check = Check("outbox table", Verdict.FAIL, f"{table} lacks {', '.join(bookkeeping)}",
                            f"cdc-relay init --dsn DSN --table {table} --no-slot (adds them)")
    else:
        table_check = Check("outbox table", Verdict.PASS, f"{table} has the event columns"
                            + (" (no polling columns: WAL mode only)" if bookkeeping else ""))
    checks = [table_check, _privileges_check(facts, options), _trigger_check(info, poll)]
    if not poll and options.plugin == "pgoutput":
        checks.append(_publication_check(facts, options))
    return checks


def _privileges_check(facts: Facts, options: DoctorOptions) -> Check:
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


def _trigger_check(info: TableFacts, poll: bool) -> Check:
    if info.trigger:
        return Check("notify trigger", Verdict.PASS, f"{NOTIFY_TRIGGER} wakes pollers on insert")
    if not poll:
        return Check("notify trigger", Verdict.PASS, "absent (WAL mode does not need it)")
    return Check("notify trigger", Verdict.WARN, "absent: pollers wake only every --interval",
                 "cdc-relay init --dsn DSN --no-slot (without --no-trigger)")


def _publication_check(facts: Facts, options: DoctorOptions) -> Check:
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
    return Check("publication", Verdict.PASS, f"{pub} publishes inserts of {table}")


def slot_checks(facts: Facts, options: DoctorOptions) -> list[Check]:
    """The slot exists, is logical, of this database, with this plugin, not invalidated."""
    slot, name = facts.slot, options.slot
    drop = f"cdc-relay slot drop --dsn DSN --slot {name} (loses its position)"
    if slot is None:
        return [Check("slot", Verdict.WARN, f"{name} does not exist; the relay creates it on "
                      "start (events committed before then are not relayed)",
                      f"cdc-relay init --dsn DSN --slot {name} --plugin {options.plugin}")]
    problem = None
    if slot.slot_type != "logical":
        problem = f"{name} is a {slot.slot_type} slot, not a logical one"
    elif slot.database != facts.server.database:
        problem = f"{name} belongs to database {slot.database}, not {facts.server.database}"
    elif slot.plugin != options.plugin:
        problem = f"{name} uses plugin {slot.plugin}, not {options.plugin}"
    if problem is not None:
        return [Check("slot", Verdict.FAIL, problem, f"choose another --slot, or {drop}")]
    if slot.wal_status == "lost":
        return [Check("slot", Verdict.FAIL, f"{name} is invalidated: the WAL it needs was removed "
                      "(max_slot_wal_keep_size exceeded); it can never stream again",
                      f"{drop}, then cdc-relay init; republish events committed since "
                      f"{slot.confirmed_flush_lsn} from the outbox table")]
    state = f"active (pid {slot.active_pid})" if slot.active else "inactive"
    lag = human_bytes(slot.lag_bytes or 0)
    return [Check("slot", Verdict.PASS, f"{name}: {slot.plugin}, {state}, confirmed "
                  f"{slot.confirmed_flush_lsn}, lag {lag}"), _retention_check(slot, facts.server)]


def _retention_check(slot: SlotStatus, server: ServerFacts) -> Check:
    retained = slot.retained_bytes or 0
    keep_fix = ("ALTER SYSTEM SET max_slot_wal_keep_size = '<size, e.g. 10GB>'; "
                "SELECT pg_reload_conf();")
    if server.keep_size < 0:
        return Check("WAL retention", Verdict.WARN,
                     f"retains {human_bytes(retained)}; max_slot_wal_keep_size is unlimited, so a "
                     "stalled slot keeps WAL until the disk fills", keep_fix)
    limit = human_bytes(server.keep_size)
    if slot.wal_status == "unreserved":
        return Check("WAL retention", Verdict.FAIL,
                     f"retains {human_bytes(retained)}, beyond max_slot_wal_keep_size ({limit}): "
                     "the next checkpoint may invalidate the slot",
                     "get the relay streaming and caught up now, or raise max_slot_wal_keep_size")
    if retained > RETENTION_WARN * server.keep_size:
        return Check("WAL retention", Verdict.WARN,
                     f"retains {human_bytes(retained)} of {limit} allowed",
                     "check the relay is streaming (cdc-relay status); raise "
                     "max_slot_wal_keep_size if the lag is expected")
    return Check("WAL retention", Verdict.PASS, f"retains {human_bytes(retained)} of {limit} allowed")


# ---------------------------------------------------------------- output

def failed(checks: Sequence[Check]) -> bool:
    return any(check.verdict is Verdict.FAIL for check in checks)


def format_checks(checks: Sequence[Check]) -> str:
    """``PASS  name  detail`` lines, a ``fix:`` line under each non-pass, a summary."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"{check.verdict.value.upper():4}  {check.name.ljust(width)}  {check.detail}")
        if check.fix and check.verdict in (Verdict.FAIL, Verdict.WARN):
            lines.append(f"{'':4}  {'':{width}}  fix: {check.fix}")
    counts = {v: sum(c.verdict is v for c in checks) for v in Verdict}
    lines.append(f"doctor: {counts[Verdict.PASS]} passed, {counts[Verdict.WARN]} warning(s), "
                 f"{counts[Verdict.FAIL]} failed, {counts[Verdict.SKIP]} skipped")
    return "\n".join(lines)


def format_checks_json(checks: Sequence[Check]) -> str:
    """The checks as a JSON array of {name, verdict, detail, fix}."""
    return orjson.dumps([asdict(check) for check in checks], option=orjson.OPT_INDENT_2).decode()
