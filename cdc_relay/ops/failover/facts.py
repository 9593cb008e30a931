"""Failover readiness of the relay's slot (PostgreSQL 17+ failover slots), as pure values.

Owns the facts ``doctor``, ``status`` and the metrics read about failover (docs/
high-availability.md) - on the primary: the server version, the slot's ``failover``
flag, ``synchronized_standby_slots`` and the physical slots it names; on a standby: its
recovery state, ``sync_replication_slots``, ``hot_standby_feedback``,
``primary_slot_name``, whether ``primary_conninfo`` names a database (never the
conninfo itself: it may hold a password) and its copy of the slot - and the one
verdict they share: does the standby hold a copy of the slot that survives promotion
(``synced AND NOT temporary``: PostgreSQL drops temporary synced slots at promotion).

Must not do I/O (the reading is ops/failover/read.py, the doctor's lines
ops/failover/checks.py) or import a driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

FAILOVER_SLOTS_SINCE = 170000  # server_version_num of PostgreSQL 17
HA_DOCS = "docs/high-availability.md"
_DBNAME_RE = re.compile(r"(?:^|\s)dbname\s*=\s*(?:'(?:[^'\\]|\\.)+'|[^\s']+)")


@dataclass(frozen=True, slots=True)
class PrimaryFacts:
    """What the primary says about failover for one slot."""

    version_num: int  # server_version_num, e.g. 180006
    slot_exists: bool = False
    slot_failover: bool | None = None  # None: the server has no failover slots (< 17)
    synchronized_standby_slots: tuple[str, ...] = ()
    physical_slots: dict[str, bool] = field(default_factory=dict)  # named ones found: active?
    physical_senders: int = 0  # walsenders streaming WAL to standbys (not logical slots)

    @property
    def failover_slots(self) -> bool:
        """Whether the server has failover slots at all (17+)."""
        return self.version_num >= FAILOVER_SLOTS_SINCE


@dataclass(frozen=True, slots=True)
class SlotCopy:
    """The standby's row of the slot in ``pg_replication_slots``."""

    synced: bool
    temporary: bool
    invalidation_reason: str | None = None


@dataclass(frozen=True, slots=True)
class StandbyFacts:
    """What a standby says about its slot synchronisation (None: the server lacks it)."""

    in_recovery: bool
    version_num: int
    sync_replication_slots: bool | None
    hot_standby_feedback: bool
    primary_slot_name: str
    conninfo_dbname: bool | None  # primary_conninfo names a database; None: hidden from us
    copy: SlotCopy | None  # None: no slot of that name on the standby


@dataclass(frozen=True, slots=True)
class FailoverStatus:
    """The verdict ``status`` and the metrics show: ready is None while it cannot be known."""

    available: bool  # the primary has failover slots (17+)
    slot_failover: bool | None
    standby_checked: bool  # a standby was given and read
    ready: bool | None  # the standby holds a failover-ready copy; None: no standby read
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"available": self.available, "slot_failover": self.slot_failover,
                "standby_checked": self.standby_checked, "ready": self.ready,
                "problems": list(self.problems)}


def parse_slot_list(value: str | None) -> tuple[str, ...]:
    """``synchronized_standby_slots`` ('a, "B"') as names (('a', 'B'))."""
    return tuple(part.strip().strip('"') for part in (value or "").split(",") if part.strip())


def conninfo_has_dbname(conninfo: str) -> bool:
    """Whether a key=value or URI ``primary_conninfo`` names a database (slot sync needs one)."""
    if conninfo.startswith(("postgres://", "postgresql://")):
        parts = urlsplit(conninfo)
        return parts.path.strip("/") != "" or bool(parse_qs(parts.query).get("dbname"))
    return bool(_DBNAME_RE.search(conninfo))


def primary_problems(primary: PrimaryFacts, slot: str) -> list[str]:
    """Why the primary side is not set up for failover (empty: it is)."""
    if not primary.failover_slots:
        return [f"PostgreSQL {primary.version_num // 10000} has no failover slots (17+)"]
    if not primary.slot_exists:
        return [f"slot {slot} does not exist on the primary"]
    problems = []
    if not primary.slot_failover:
        problems.append(f"slot {slot} is not a failover slot (failover = false)")
    if not primary.synchronized_standby_slots:
        problems.append("synchronized_standby_slots is empty on the primary")
    missing = [name for name in primary.synchronized_standby_slots
               if name not in primary.physical_slots]
    if missing:
        problems.append(f"synchronized_standby_slots names {', '.join(missing)}, which the "
                        "primary has no physical slot for")
    return problems


def standby_problems(standby: StandbyFacts, primary: PrimaryFacts, slot: str) -> list[str]:
    """Why the standby does not hold a failover-ready copy of ``slot`` (empty: it does)."""
    if not standby.in_recovery:
        return ["the standby is not in recovery (not a standby, or already promoted)"]
    problems = []
    if not standby.sync_replication_slots:
        problems.append("sync_replication_slots is off on the standby")
    if not standby.hot_standby_feedback:
        problems.append("hot_standby_feedback is off on the standby")
    if not standby.primary_slot_name:
        problems.append("primary_slot_name is not set on the standby")
    elif primary.synchronized_standby_slots and \
            standby.primary_slot_name not in primary.synchronized_standby_slots:
        problems.append(f"the standby's primary_slot_name {standby.primary_slot_name} is not in "
                        "the primary's synchronized_standby_slots")
    if standby.conninfo_dbname is False:
        problems.append("primary_conninfo on the standby has no dbname")
    problems += copy_problems(standby.copy, slot)
    return problems


def copy_problems(copy: SlotCopy | None, slot: str) -> list[str]:
    """Why the standby's copy of ``slot`` would not survive a promotion (empty: it would)."""
    if copy is None:
        return [f"the standby has no copy of slot {slot}"]
    if copy.invalidation_reason:
        return [f"the standby's copy of slot {slot} is invalidated ({copy.invalidation_reason})"]
    if not copy.synced:
        return [f"slot {slot} on the standby is not a synced copy of the primary's"]
    if copy.temporary:
        return [f"the standby's copy of slot {slot} is still temporary (the primary's slot has "
                "not yet confirmed past the standby's catalog xmin): PostgreSQL drops it at "
                "promotion"]
    return []


def failover_status(primary: PrimaryFacts, standby: StandbyFacts | None, slot: str,
                    standby_error: str | None = None) -> FailoverStatus:
    """The shared verdict: is the slot ready to survive a failover to the standby?"""
    problems = primary_problems(primary, slot)
    if standby_error is not None:
        problems.append(f"the standby could not be read: {standby_error}")
    elif standby is not None and primary.failover_slots:
        problems += standby_problems(standby, primary, slot)
    checked = standby is not None and standby_error is None
    ready = None if standby is None and standby_error is None else not problems
    return FailoverStatus(primary.failover_slots, primary.slot_failover, checked,
                          ready, tuple(problems))
