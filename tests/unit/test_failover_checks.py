"""Failover readiness as pure values: the shared verdict, doctor's lines, status and metrics.

The facts are what ops/failover/read.py gathers from a primary and a standby; here they
are written out by hand (no services). docs/high-availability.md explains each setting.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cdc_relay.config import TableRef
from cdc_relay.model import Lsn, SlotStatus
from cdc_relay.ops.doctor.report import failed
from cdc_relay.ops.failover.checks import failover_checks
from cdc_relay.ops.failover.facts import (
    PrimaryFacts,
    SlotCopy,
    StandbyFacts,
    conninfo_has_dbname,
    failover_status,
    parse_slot_list,
)
from cdc_relay.ops.metrics.collectors import FailoverCollector, WalCollector
from cdc_relay.ops.status import StatusReport
from cdc_relay.ops.verdicts import Check, Verdict
from cdc_relay.stats import RelayStats
from tests.unit.test_metrics_endpoint import probe_with, samples

SLOT = "cdc_relay"
PRIMARY = PrimaryFacts(180006, slot_exists=True, slot_failover=True,
                       synchronized_standby_slots=("standby1",), physical_slots={"standby1": True})
STANDBY = StandbyFacts(in_recovery=True, version_num=180006, sync_replication_slots=True,
                       hot_standby_feedback=True, primary_slot_name="standby1",
                       conninfo_dbname=True, copy=SlotCopy(synced=True, temporary=False))
PG15 = PrimaryFacts(150020, slot_exists=True)


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def test_a_failover_ready_pair_passes_every_line_and_is_ready() -> None:
    checks = failover_checks(PRIMARY, STANDBY, SLOT, standby_given=True)
    assert [c.name for c in checks if c.verdict is not Verdict.PASS] == []
    assert "failover-ready" in by_name(checks)["standby slot copy"].detail
    status = failover_status(PRIMARY, STANDBY, SLOT)
    assert (status.ready, status.standby_checked, status.problems) == (True, True, ())


def test_postgresql_15_says_failover_slots_do_not_exist_and_points_at_the_recovery_docs() -> None:
    (alone,) = failover_checks(PG15, None, SLOT, standby_given=False)
    assert alone.verdict is Verdict.SKIP and "PostgreSQL 15 has no failover slots" in alone.detail
    assert "exit 7" in alone.detail and "docs/high-availability.md" in alone.detail
    (given,) = failover_checks(PG15, None, SLOT, standby_given=True)
    assert given.verdict is Verdict.WARN and "Recovering from a slot loss" in (given.fix or "")
    status = failover_status(PG15, None, SLOT)
    assert (status.available, status.ready) == (False, None)


def test_without_a_standby_the_primary_gaps_are_warnings_and_the_standby_is_skipped() -> None:
    primary = replace(PRIMARY, slot_failover=False, synchronized_standby_slots=(),
                      physical_slots={}, physical_senders=1)
    checks = by_name(failover_checks(primary, None, SLOT, standby_given=False))
    assert checks["failover slot"].verdict is Verdict.WARN
    assert "ALTER_REPLICATION_SLOT cdc_relay (FAILOVER true)" in (checks["failover slot"].fix or "")
    assert checks["synchronized_standby_slots"].verdict is Verdict.WARN
    assert checks["standby"].verdict is Verdict.SKIP and "--standby-dsn" in checks["standby"].detail
    assert not failed(list(checks.values()))
    assert failover_status(primary, None, SLOT).ready is None


def test_a_primary_nobody_streams_from_has_nothing_to_fail_over_to() -> None:
    primary = replace(PRIMARY, slot_failover=False, synchronized_standby_slots=(),
                      physical_slots={}, physical_senders=0)
    (alone,) = failover_checks(primary, None, SLOT, standby_given=False)
    assert alone.verdict is Verdict.SKIP and "no standby streams" in alone.detail


def test_with_a_standby_a_slot_without_failover_fails_and_is_not_ready() -> None:
    primary = replace(PRIMARY, slot_failover=False)
    checks = by_name(failover_checks(primary, STANDBY, SLOT, standby_given=True))
    assert checks["failover slot"].verdict is Verdict.FAIL
    status = failover_status(primary, STANDBY, SLOT)
    assert status.ready is False and "failover = false" in status.problems[0]


def test_synchronized_standby_slots_naming_a_missing_slot_fails_even_without_a_standby() -> None:
    primary = replace(PRIMARY, synchronized_standby_slots=("standby1", "gone"))
    check = by_name(failover_checks(primary, None, SLOT, standby_given=False))[
        "synchronized_standby_slots"]
    assert check.verdict is Verdict.FAIL and "gone" in check.detail and "waits" in check.detail
    assert "pg_create_physical_replication_slot('gone')" in (check.fix or "")


def test_synchronized_standby_slots_must_name_the_standbys_physical_slot() -> None:
    standby = replace(STANDBY, primary_slot_name="other")
    primary = replace(PRIMARY, physical_slots={"standby1": True, "other": True})
    check = by_name(failover_checks(primary, standby, SLOT, standby_given=True))[
        "synchronized_standby_slots"]
    assert check.verdict is Verdict.FAIL
    assert "synchronized_standby_slots = 'other'" in (check.fix or "")


@pytest.mark.parametrize(("change", "line", "fix"), [
    ({"sync_replication_slots": False}, "standby sync_replication_slots",
     "ALTER SYSTEM SET sync_replication_slots = on"),
    ({"hot_standby_feedback": False}, "standby hot_standby_feedback",
     "ALTER SYSTEM SET hot_standby_feedback = on"),
    ({"primary_slot_name": ""}, "standby primary_slot_name",
     "ALTER SYSTEM SET primary_slot_name = 'standby1'"),
    ({"conninfo_dbname": False}, "standby primary_conninfo", "dbname="),
])
def test_each_standby_setting_fails_with_its_alter_system_fix(
        change: dict[str, object], line: str, fix: str) -> None:
    standby = replace(STANDBY, **change)  # type: ignore[arg-type]
    check = by_name(failover_checks(PRIMARY, standby, SLOT, standby_given=True))[line]
    assert check.verdict is Verdict.FAIL and fix in (check.fix or "")
    assert failover_status(PRIMARY, standby, SLOT).ready is False


def test_a_hidden_primary_conninfo_is_skipped_not_failed() -> None:
    standby = replace(STANDBY, conninfo_dbname=None)
    checks = by_name(failover_checks(PRIMARY, standby, SLOT, standby_given=True))
    assert checks["standby primary_conninfo"].verdict is Verdict.SKIP
    assert failover_status(PRIMARY, standby, SLOT).ready is True


@pytest.mark.parametrize(("copy", "reason"), [
    (None, "has no copy"),
    (SlotCopy(synced=True, temporary=True), "still temporary"),
    (SlotCopy(synced=False, temporary=False), "not a synced copy"),
    (SlotCopy(synced=True, temporary=False, invalidation_reason="wal_removed"), "invalidated"),
])
def test_a_copy_that_would_not_survive_promotion_is_not_failover_ready(
        copy: SlotCopy | None, reason: str) -> None:
    standby = replace(STANDBY, copy=copy)
    check = by_name(failover_checks(PRIMARY, standby, SLOT, standby_given=True))["standby slot copy"]
    assert check.verdict is Verdict.FAIL and reason in check.detail
    status = failover_status(PRIMARY, standby, SLOT)
    assert status.ready is False and reason in status.problems[-1]


def test_a_promoted_or_unreachable_standby_fails_the_standby_line() -> None:
    promoted = by_name(failover_checks(PRIMARY, replace(STANDBY, in_recovery=False), SLOT,
                                       standby_given=True))["standby"]
    assert promoted.verdict is Verdict.FAIL and "not in recovery" in promoted.detail
    down = by_name(failover_checks(PRIMARY, None, SLOT, standby_given=True,
                                   standby_error="cannot connect to PostgreSQL at s:5432/app"))
    assert down["standby"].verdict is Verdict.FAIL and "s:5432/app" in down["standby"].detail
    status = failover_status(PRIMARY, None, SLOT, standby_error="cannot connect")
    assert (status.ready, status.standby_checked) == (False, False)


def test_a_missing_slot_is_checked_once_it_exists() -> None:
    primary = replace(PRIMARY, slot_exists=False, slot_failover=None)
    assert by_name(failover_checks(primary, None, SLOT, standby_given=False))[
        "failover slot"].verdict is Verdict.SKIP


@pytest.mark.parametrize(("conninfo", "named"), [
    ("host=p port=5432 user=rep dbname=postgres application_name=s1", True),
    ("dbname = 'my db' host=p", True),
    ("host=p port=5432 user=rep application_name=s1", False),
    ("host=p mydbname=x", False),
    ("postgresql://rep@p:5432/postgres", True),
    ("postgresql://rep@p:5432?dbname=app", True),
    ("postgresql://rep@p:5432", False),
])
def test_conninfo_dbname_is_recognised_in_both_spellings(conninfo: str, named: bool) -> None:
    assert conninfo_has_dbname(conninfo) is named


def test_synchronized_standby_slots_are_parsed_as_names() -> None:
    assert parse_slot_list('standby1, "Standby2" ,') == ("standby1", "Standby2")
    assert parse_slot_list("") == () and parse_slot_list(None) == ()


# ---------------------------------------------------------------- status and metrics

class Figures:
    def __init__(self, ok: bool, status: object) -> None:
        self.failover_ok = ok
        self.failover = status


def test_failover_metrics_say_ready_and_the_slot_flag() -> None:
    ready = samples(FailoverCollector(Figures(True, failover_status(PRIMARY, STANDBY, SLOT))))
    assert ready["cdc_relay_slot_failover_ready"] == 1
    assert ready["cdc_relay_slot_failover"] == 1
    assert ready["cdc_relay_failover_probe_success"] == 1
    temporary = failover_status(PRIMARY, replace(STANDBY, copy=SlotCopy(True, True)), SLOT)
    assert samples(FailoverCollector(Figures(True, temporary)))["cdc_relay_slot_failover_ready"] == 0


def test_failover_metrics_are_absent_while_unknown() -> None:
    unread = samples(FailoverCollector(Figures(False, None)))
    assert unread["cdc_relay_failover_probe_success"] == 0
    assert not any("failover_ready" in name or name == "cdc_relay_slot_failover"
                   for name in unread)
    down = samples(FailoverCollector(Figures(True, failover_status(
        PRIMARY, None, SLOT, standby_error="cannot connect"))))
    assert down["cdc_relay_failover_probe_success"] == 0
    assert down["cdc_relay_slot_failover_ready"] == 0


def test_wal_status_is_a_labelled_gauge_with_the_current_status_at_one() -> None:
    slot = SlotStatus(name=SLOT, plugin="pgoutput", slot_type="logical", database="app",
                      active=False, active_pid=None, confirmed_flush_lsn=Lsn(100),
                      restart_lsn=Lsn(50), lag_bytes=0, lag_seconds=None, retained_bytes=2**20,
                      wal_status="unreserved", safe_wal_size=-4096)
    found = samples(WalCollector(RelayStats(), probe_with(slot)))
    assert found["cdc_relay_slot_wal_status{status=unreserved}"] == 1
    assert found["cdc_relay_slot_wal_status{status=reserved}"] == 0
    assert found["cdc_relay_slot_wal_status{status=lost}"] == 0
    assert found["cdc_relay_slot_safe_wal_size_bytes"] == -4096


def _report(status: object) -> StatusReport:
    return StatusReport(SLOT, Lsn(100), None, TableRef("public", "outbox_events"), None, None,
                        failover=status)  # type: ignore[arg-type]


def test_status_shows_failover_readiness_and_every_reason_it_is_not_ready() -> None:
    ready = "\n".join(_report(failover_status(PRIMARY, STANDBY, SLOT)).lines())
    assert "failover" in ready and "ready: the standby holds a synced, persistent copy" in ready
    temporary = failover_status(PRIMARY, replace(STANDBY, hot_standby_feedback=False,
                                                 copy=SlotCopy(True, True)), SLOT)
    lines = _report(temporary).lines()
    assert any("NOT ready" in line for line in lines)
    assert sum("problem" in line for line in lines) == 2
    assert _report(temporary).to_dict()["failover"]["ready"] is False


def test_status_on_15_says_failover_slots_are_unavailable() -> None:
    text = "\n".join(_report(failover_status(PG15, None, SLOT)).lines())
    assert "unavailable: PostgreSQL 15 has no failover slots" in text
    assert "docs/high-availability.md" in text
