"""``doctor``'s failover lines: the failover facts (ops/failover/facts.py) as Checks, with fixes.

Owns what doctor says about PostgreSQL 17+ failover slots (docs/high-availability.md):
on the primary, the slot's ``failover`` flag and ``synchronized_standby_slots``; given a
standby (``--standby-dsn``), its ``sync_replication_slots``, ``hot_standby_feedback``,
``primary_slot_name``, the ``dbname`` in its ``primary_conninfo`` and whether it holds a
copy of the slot that survives promotion. Without ``--standby-dsn`` the primary's gaps
are warnings while some standby streams from it (none: nothing to fail over to, so they
are skipped); with one, anything that keeps the copy from being failover-ready fails. On
15/16 it says failover slots do not exist and where the recovery path is.

Must not do I/O (ops/failover/read.py gathers) or import a driver.
"""

from __future__ import annotations

from cdc_relay.ops.failover.facts import (
    HA_DOCS,
    PrimaryFacts,
    StandbyFacts,
    copy_problems,
)
from cdc_relay.ops.verdicts import Check, Verdict

RELOAD = "SELECT pg_reload_conf();"


def failover_checks(primary: PrimaryFacts, standby: StandbyFacts | None, slot: str, *,
                    standby_given: bool, standby_error: str | None = None) -> list[Check]:
    """Every failover line, primary first; one line on servers without failover slots."""
    if not primary.failover_slots:
        return [_unavailable(primary, standby_given)]
    if not (standby_given or primary.physical_senders or primary.synchronized_standby_slots):
        return [Check("failover slot", Verdict.SKIP, "no standby streams from this primary: "
                      "nothing to fail over to (pass --standby-dsn to check one)")]
    checks = [_slot_flag(primary, slot, standby_given),
              _synchronized(primary, standby, standby_given)]
    if not standby_given:
        return [*checks, Check("standby", Verdict.SKIP, "not checked: pass --standby-dsn "
                               "(CDC_RELAY_STANDBY_DSN) to check the standby's copy of the slot")]
    if standby_error is not None:
        return [*checks, Check("standby", Verdict.FAIL, standby_error,
                               "check --standby-dsn: a standby of this primary that this "
                               "client may connect to")]
    assert standby is not None
    if not standby.in_recovery:
        return [*checks, Check("standby", Verdict.FAIL, "the server is not in recovery: not a "
                               "standby, or already promoted", "point --standby-dsn at the "
                               "streaming standby that would be promoted")]
    return [*checks, Check("standby", Verdict.PASS, "in recovery"),
            *_standby_settings(standby, primary), _copy(standby, slot)]


def _unavailable(primary: PrimaryFacts, standby_given: bool) -> Check:
    major = primary.version_num // 10000
    detail = (f"PostgreSQL {major} has no failover slots (17+): no standby holds a copy of the "
              "slot, so after a promotion the relay finds its slot missing, stops (exit 7) and "
              "prints the command that recovers without losing events")
    if standby_given:
        return Check("failover slots", Verdict.WARN, detail,
                     f"see {HA_DOCS} (Recovering from a slot loss); upgrade to PostgreSQL 17+ "
                     "for failover slots")
    return Check("failover slots", Verdict.SKIP, f"{detail} ({HA_DOCS})")


def _slot_flag(primary: PrimaryFacts, slot: str, standby_given: bool) -> Check:
    name = "failover slot"
    if not primary.slot_exists:
        return Check(name, Verdict.SKIP, f"checked once {slot} exists")
    if primary.slot_failover:
        return Check(name, Verdict.PASS, f"{slot} has failover = true: standbys may sync it")
    return Check(name, Verdict.FAIL if standby_given else Verdict.WARN,
                 f"{slot} has failover = false: no standby keeps a copy, so a promotion loses it",
                 f"stop the relay, then psql \"DSN replication=database\" -c "
                 f"'ALTER_REPLICATION_SLOT {slot} (FAILOVER true)', and start it again")


def _synchronized(primary: PrimaryFacts, standby: StandbyFacts | None,
                  standby_given: bool) -> Check:
    name, names = "synchronized_standby_slots", primary.synchronized_standby_slots
    physical = standby.primary_slot_name if standby and standby.primary_slot_name else None
    fix = (f"on the primary: ALTER SYSTEM SET synchronized_standby_slots = "
           f"'{physical or '<the standby physical slot>'}'; {RELOAD}")
    if not names:
        return Check(name, Verdict.FAIL if standby_given else Verdict.WARN,
                     "empty: the relay may receive changes the standby does not have yet, "
                     "which a promotion then loses", fix)
    missing = [slot for slot in names if slot not in primary.physical_slots]
    if missing:
        return Check(name, Verdict.FAIL, f"names {', '.join(missing)}, but the primary has no "
                     "such physical slot: logical decoding waits for it forever",
                     f"create it (SELECT pg_create_physical_replication_slot('{missing[0]}')) "
                     "for the standby, or " + fix)
    if physical is not None and physical not in names:
        return Check(name, Verdict.FAIL, f"{', '.join(names)} does not name the standby's "
                     f"physical slot {physical}", fix)
    active = ", ".join(f"{slot} ({'active' if on else 'inactive'})"
                       for slot, on in primary.physical_slots.items())
    return Check(name, Verdict.PASS, f"waits for {active}")


def _standby_settings(standby: StandbyFacts, primary: PrimaryFacts) -> list[Check]:
    def setting(name: str, ok: bool, detail: str, value: str) -> Check:
        if ok:
            return Check(f"standby {name}", Verdict.PASS, detail)
        return Check(f"standby {name}", Verdict.FAIL, detail,
                     f"on the standby: ALTER SYSTEM SET {name} = {value}; {RELOAD}")

    slot_hint = primary.synchronized_standby_slots[0] if primary.synchronized_standby_slots \
        else "<its physical slot>"
    checks = [
        setting("sync_replication_slots", bool(standby.sync_replication_slots),
                "on" if standby.sync_replication_slots else "off: the standby copies no slot",
                "on"),
        setting("hot_standby_feedback", standby.hot_standby_feedback,
                "on" if standby.hot_standby_feedback else "off: the slot sync worker needs it",
                "on"),
        setting("primary_slot_name", bool(standby.primary_slot_name),
                standby.primary_slot_name or "not set: slot synchronisation needs it",
                f"'{slot_hint}'"),
    ]
    if standby.conninfo_dbname is None:
        checks.append(Check("standby primary_conninfo", Verdict.SKIP,
                            "not readable by this role (needs pg_read_all_settings)"))
    else:
        checks.append(setting("primary_conninfo", standby.conninfo_dbname, "names a database"
                              if standby.conninfo_dbname else "has no dbname: the slot sync "
                              "worker cannot connect", "'<the same conninfo> dbname=postgres'"))
    return checks


def _copy(standby: StandbyFacts, slot: str) -> Check:
    problems = copy_problems(standby.copy, slot)
    if problems and standby.copy is not None and standby.copy.temporary:
        return Check("standby slot copy", Verdict.FAIL, problems[0],
                     "keep the relay streaming (start it if it is stopped): the copy turns "
                     "persistent once the relay confirms past the standby's catalog xmin, "
                     f"usually within a minute ({HA_DOCS})")
    if problems:
        return Check("standby slot copy", Verdict.FAIL, problems[0],
                     "fix the lines above; the standby's slot sync worker then copies the slot "
                     f"within seconds (its log says why it cannot) ({HA_DOCS})")
    return Check("standby slot copy", Verdict.PASS, f"{slot} is synced and not temporary: it "
                 "survives a promotion (failover-ready)")
