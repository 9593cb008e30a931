"""Doctor's slot checks: pure functions from gathered facts to the slot's verdicts.

Owns the checks on the replication slot (exists, logical, this database and plugin, not
invalidated, streamed), its WAL retention and PostgreSQL 18's idle timeout, polling mode's
unused slots, and whether pending rows were ever published (the backfill check), each
failure carrying the exact fix to run. Must not do I/O: no connection, no broker, no
environment; the facts come from ``ops/doctor/gather.py``.
"""

from __future__ import annotations

from cdc_relay.model import SlotStatus, human_bytes, idle_timeout_warning, invalidation_cause, seconds_text
from cdc_relay.ops.doctor.facts import BackfillFacts, DoctorSettings, Facts, ServerFacts
from cdc_relay.ops.verdicts import Check, Verdict

RETENTION_WARN = 0.8  # of max_slot_wal_keep_size


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
