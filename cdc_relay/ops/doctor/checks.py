"""Doctor's vocabulary and its checks: pure functions from gathered facts to verdicts.

Owns the options, the facts dataclasses and every check that can
be decided from those facts alone - wal_level, slot and sender headroom, REPLICATION,
output_plugin_libraries, the outbox table, its privileges, trigger and publication, the
slot and its WAL retention - each failure carrying the exact fix to run.

A check's line is ``Check``/``Verdict`` (cdc_relay/ops/verdicts.py, shared with the
failover checks). Must not do I/O: no connection, no broker, no environment. Gathering the facts and the
two checks that need I/O of their own live in ``ops/doctor/gather.py``; rendering in
``ops/doctor/report.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from cdc_relay.config import KafkaConfig, OutboxConfig
from cdc_relay.model import (
    BOOKKEEPING_COLUMNS,
    NOTIFY_TRIGGER,
    SlotStatus,
    human_bytes,
    idle_timeout_warning,
    invalidation_cause,
    seconds_text,
)
from cdc_relay.ops.verdicts import Check, Verdict
from cdc_relay.sink.config import NatsConfig, RabbitMqConfig, SinkProbe
from cdc_relay.sink.http.config import HttpConfig
from cdc_relay.sink.kinesis.config import KinesisConfig
from cdc_relay.sink.redis.config import RedisConfig
from cdc_relay.sink.sqs.config import SqsConfig

DEFAULT_LIBRARIES = ("pgoutput", "test_decoding")  # output_plugin_libraries' default
RETENTION_WARN = 0.8  # of max_slot_wal_keep_size


@dataclass(frozen=True, slots=True)
class DoctorSettings:
    """What to check: the relay's own options."""

    dsn: str
    outbox: OutboxConfig = field(default_factory=OutboxConfig)
    slot: str = "cdc_relay"
    plugin: str = "pgoutput"
    publication: str = "cdc_relay_outbox"
    mode: str = "wal"  # or "poll": skip logical decoding checks
    plugin_from_slot: bool = False  # no --plugin: an existing slot's plugin, as run does
    kafka: KafkaConfig | None = None
    broker_timeout: float = 10.0
    # --sink other than kafka (sink/factory.py's OtherSink)
    sink: (RabbitMqConfig | NatsConfig | SqsConfig | RedisConfig | HttpConfig | KinesisConfig
           | None) = None
    standby_dsn: str | None = None  # --standby-dsn: check its copy of the slot (failover)


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
    wal_segment_size: int = 16 * 2**20
    rds_replication: bool = False  # a member of rds_replication (RDS/Aurora's replication right)


@dataclass(frozen=True, slots=True)
class EndpointFacts:
    """What the DSN reaches (pg/endpoint.py): a pooler, a read-only node."""

    read_only: str | None = None  # why sessions cannot write; None: they can
    replication_error: str | None = None  # a replication connection's failure; None: it works
    pooler: bool = False  # that failure is a connection pooler's refusal
    probed: bool = False  # a replication connection was tried (WAL mode)
    # A hot standby (decoding on a standby, run --primary-dsn): its hot_standby_feedback and
    # major version; None where the server is not a standby.
    hot_standby_feedback: str | None = None
    standby_version: int | None = None


@dataclass(frozen=True, slots=True)
class TableFacts:
    exists: bool
    owner: bool = False
    privileges: dict[str, bool] = field(default_factory=dict)
    trigger: bool = False
    columns: frozenset[str] = frozenset()
    partitions: int | None = None  # leaf partitions of a partitioned table; None: not one


@dataclass(frozen=True, slots=True)
class PublicationFacts:
    exists: bool
    inserts: bool = False
    includes_table: bool = False
    via_root: bool = False  # publish_via_partition_root


@dataclass(frozen=True, slots=True)
class BackfillFacts:
    """Pending rows and ``run --snapshot initial``'s record for the slot (if any)."""

    pending: int
    oldest_pending: datetime | None = None
    state: str | None = None  # creating / running / done; None: no record for the slot
    running: bool = False  # a relay holds the slot's backfill lock now
    rows_done: int = 0
    rows_total: int | None = None
    pending_before_start: int = 0  # pending rows created before the recorded backfill began
    # pending rows created before the slot's recorded creation (None: no record of the slot)
    pending_before_slot: int | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    server: ServerFacts
    table: TableFacts
    publication: PublicationFacts
    slot: SlotStatus | None
    idle_slots: tuple[SlotStatus, ...] = ()  # inactive logical slots of this database
    backfill: BackfillFacts | None = None  # None: the table has no bookkeeping columns
    endpoint: EndpointFacts = field(default_factory=EndpointFacts)


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


def slot_checks(facts: Facts, options: DoctorSettings) -> list[Check]:
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
    if slot.invalidated:
        why, fix = invalidation_cause(slot.invalidation_reason)
        return [Check("slot", Verdict.FAIL, f"{name} is invalidated (invalidation_reason "
                      f"{slot.invalidation_reason or 'wal_removed'}): {why}; it can never "
                      "stream again",
                      "run the relay once with --on-slot-loss recover (a new slot, and the "
                      "retained outbox rows that may be unrelayed republished; "
                      f"docs/high-availability.md, Recovering from a slot loss); then {fix}")]
    state = f"active (pid {slot.active_pid})" if slot.active else "inactive"
    lag = human_bytes(slot.lag_bytes or 0)
    detail = f"{name}: {slot.plugin}, {state}, confirmed {slot.confirmed_flush_lsn}, lag {lag}"
    retained = slot.retained_bytes or 0
    if not slot.active and retained >= facts.server.wal_segment_size:
        # Below one WAL segment it is a slot just created (init) or a relay restarting.
        return [Check("slot", Verdict.FAIL,
                      f"{detail}: no relay streams from it, and it retains {human_bytes(retained)} "
                      "of WAL, more with every write until the disk is full",
                      f"start the relay (cdc-relay run --slot {name}); if none will run, {drop}"),
                _retention_check(slot, facts.server), *_idle_timeout_check(slot)]
    return [Check("slot", Verdict.PASS, detail), _retention_check(slot, facts.server),
            *_idle_timeout_check(slot)]


def _idle_timeout_check(slot: SlotStatus) -> list[Check]:
    """PostgreSQL 18's idle_replication_slot_timeout: the relay's downtime budget."""
    name, timeout = "idle timeout", slot.idle_timeout
    if timeout is None:
        return []  # before PostgreSQL 18
    if timeout == 0:
        return [Check(name, Verdict.PASS, "idle_replication_slot_timeout is off (0)")]
    budget = seconds_text(timeout)
    warning = idle_timeout_warning(slot)
    if warning is not None:
        return [Check(name, Verdict.WARN, warning,
                      "start the relay (cdc-relay run), or ALTER SYSTEM SET "
                      "idle_replication_slot_timeout = '<longer than the longest downtime>'; "
                      "SELECT pg_reload_conf();")]
    if slot.active or slot.inactive_seconds is None:
        return [Check(name, Verdict.PASS, f"idle_replication_slot_timeout {budget}: the "
                      "relay may be down that long before PostgreSQL invalidates the slot")]
    return [Check(name, Verdict.PASS, f"inactive {seconds_text(slot.inactive_seconds)} of "
                  f"idle_replication_slot_timeout's {budget}")]


def idle_slot_checks(facts: Facts) -> list[Check]:
    """Polling mode: every inactive logical slot of this database is WAL nobody reads."""
    if not facts.idle_slots:
        return [Check("unused slots", Verdict.PASS,
                      "no inactive replication slot in this database retains WAL")]
    return [Check("unused slots", Verdict.FAIL,
                  f"replication slot {slot.name} ({slot.plugin}) is inactive and retains "
                  f"{human_bytes(slot.retained_bytes or 0)} of WAL, more with every write until "
                  "the disk is full: polling mode does not read it",
                  f"cdc-relay slot drop --dsn DSN --slot {slot.name} --yes (unless a WAL-mode "
                  "relay will use it; dropping loses its position)")
            for slot in facts.idle_slots]


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
    safe = slot.safe_wal_size
    if retained > RETENTION_WARN * server.keep_size or (
            safe is not None and safe < (1 - RETENTION_WARN) * server.keep_size):
        left = f"; safe_wal_size {human_bytes(safe)}: that much more WAL and the server " \
            "invalidates the slot" if safe is not None else ""
        return Check("WAL retention", Verdict.WARN,
                     f"retains {human_bytes(retained)} of {limit} allowed{left}",
                     "check the relay is streaming (cdc-relay status); raise "
                     "max_slot_wal_keep_size if the lag is expected")
    return Check("WAL retention", Verdict.PASS, f"retains {human_bytes(retained)} of {limit} allowed")


def backfill_check(facts: Facts, options: DoctorSettings) -> Check | None:
    """Rows pending while the slot exists and no backfill runs: were they ever published?

    WAL mode publishes what is committed after the slot's consistent point and never sets
    ``processed_at``; rows that were pending before the slot existed are published only by
    ``run --snapshot initial``. Where the slot's creation is recorded (wal/slot/continuity.py)
    only rows older than it are counted as never published. None when the table has no
    bookkeeping columns.
    """
    info, name, slot = facts.backfill, "backfill", options.slot
    if info is None:
        return None
    redo = f"cdc-relay run --snapshot initial --slot {slot} (it redoes an unfinished backfill)"
    if info.running:
        total = "?" if info.rows_total is None else str(info.rows_total)
        return Check(name, Verdict.PASS, f"running: {info.rows_done} of {total} rows published")
    if info.state is not None and info.state != "done":
        return Check(name, Verdict.WARN, f"the backfill of slot {slot} did not finish "
                     f"({info.rows_done} of {info.rows_total} rows) and no relay runs it", redo)
    if facts.slot is None:
        if not info.pending:
            return Check(name, Verdict.PASS, "no pending rows")
        return Check(name, Verdict.WARN, f"{info.pending} rows are pending; a relay creating the "
                     f"slot publishes only later commits unless started with --snapshot initial",
                     f"cdc-relay run --snapshot initial --slot {slot} (docs/migration.md)")
    if info.state == "done":
        if info.pending_before_start:
            # Not a backlog: publishing them (cdc-relay poll) would send them twice.
            return Check(name, Verdict.PASS, f"done ({info.rows_done} rows); streaming since. "
                         f"{info.pending_before_start} rows older than it keep processed_at NULL: "
                         "WAL mode published them without marking them (rows of transactions "
                         "still open when the backfill or a slot recovery began, which the slot "
                         "streamed, or rows relayed before a slot loss); nothing to publish")
        return Check(name, Verdict.PASS, f"done ({info.rows_done} rows); streaming since")
    if not info.pending:
        return Check(name, Verdict.PASS, "no pending rows")
    if info.pending_before_slot is not None:
        return _older_than_slot(info, name, slot)
    oldest = f", the oldest from {info.oldest_pending:%Y-%m-%d %H:%M}" if info.oldest_pending else ""
    return Check(name, Verdict.WARN,
                 f"{info.pending} rows have processed_at NULL{oldest}, the slot exists and no "
                 "backfill ran for it: rows committed before the slot existed were never published "
                 "(in a WAL-only deployment every row looks pending: WAL mode never sets "
                 "processed_at)",
                 _backlog_fix(slot))


def _backlog_fix(slot: str) -> str:
    return (f"if they are a poller's backlog: stop the relays, cdc-relay slot drop --slot {slot}, "
            "then cdc-relay run --snapshot initial (docs/migration.md); if not, purge old rows "
            "with cdc-relay cleanup --wal-mode")


def _older_than_slot(info: BackfillFacts, name: str, slot: str) -> Check:
    """The slot's creation is recorded: only rows older than it may never have been
    published; newer ones are the slot's to publish (WAL mode never marks them)."""
    newer = info.pending - (info.pending_before_slot or 0)
    unmarked = (f"{newer} newer rows keep processed_at NULL: the slot streams them (WAL mode "
                "never marks rows)") if newer else ""
    if not info.pending_before_slot:
        return Check(name, Verdict.PASS, f"no pending row older than slot {slot}; {unmarked}")
    return Check(name, Verdict.WARN,
                 f"{info.pending_before_slot} rows older than slot {slot} have processed_at NULL "
                 "and no backfill ran for it: they were never published" + (
                     f" ({unmarked})" if unmarked else ""),
                 _backlog_fix(slot))


def sink_checks(found: list[SinkProbe]) -> list[Check]:
    """The report lines of a RabbitMQ or NATS probe (ok None = a warning)."""
    verdicts = {True: Verdict.PASS, False: Verdict.FAIL, None: Verdict.WARN}
    return [Check(f"broker: {probe.name}", verdicts[probe.ok], probe.detail,
                  None if probe.ok else probe.fix, probe.exit_code) for probe in found]
