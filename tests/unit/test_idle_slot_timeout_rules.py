"""PostgreSQL 18's idle_replication_slot_timeout as pure verdicts: the invalidation reason
named in the slot-loss line, doctor, status and the metrics; the downtime budget warned
about past half the timeout. The real server's side is
tests/integration/test_idle_slot_timeout.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prometheus_client.core import Metric

from cdc_relay.config import TableRef
from cdc_relay.model import Lsn, SlotStatus, idle_timeout_warning, seconds_text
from cdc_relay.ops.doctor.facts import DoctorSettings, Facts, PublicationFacts, ServerFacts, TableFacts
from cdc_relay.ops.doctor.slot_checks import slot_checks
from cdc_relay.ops.metrics.collectors import slot_metrics
from cdc_relay.ops.status import StatusReport
from cdc_relay.ops.verdicts import Verdict
from cdc_relay.wal.slot.continuity import loss_reason
from cdc_relay.wal.stream.replication import _cause

SERVER = ServerFacts(version="18.1", database="app", role="relay", superuser=False,
                     replication=True, wal_level="logical", max_slots=10, max_senders=10,
                     keep_size=-1, slots_used=1, senders_used=0)
SLOT = SlotStatus(name="cdc_relay", plugin="pgoutput", slot_type="logical", database="app",
                  active=False, active_pid=None, confirmed_flush_lsn=Lsn(1000),
                  restart_lsn=Lsn(900), lag_bytes=0, lag_seconds=None, retained_bytes=100,
                  wal_status="reserved", safe_wal_size=None, idle_timeout=3600.0,
                  inactive_seconds=600.0)
OPTIONS = DoctorSettings(dsn="host=db dbname=app", plugin="pgoutput")
IDLE_TIMED_OUT = replace(SLOT, wal_status="lost", invalidation_reason="idle_timeout",
                         inactive_seconds=3700.0)


def _checks(slot: SlotStatus) -> dict[str, tuple[Verdict, str, str | None]]:
    facts = Facts(SERVER, TableFacts(True), PublicationFacts(False), slot)
    return {c.name: (c.verdict, c.detail, c.fix) for c in slot_checks(facts, OPTIONS)}


def test_an_idle_timeout_loss_names_the_setting_not_max_slot_wal_keep_size() -> None:
    reason = loss_reason(IDLE_TIMED_OUT, None, None)
    assert reason is not None and "idle_replication_slot_timeout" in reason
    assert "max_slot_wal_keep_size" not in reason


def test_a_wal_removed_loss_still_names_max_slot_wal_keep_size() -> None:
    for slot in (replace(SLOT, wal_status="lost", idle_timeout=None),  # before 17: no reason
                 replace(SLOT, wal_status="lost", invalidation_reason="wal_removed")):
        reason = loss_reason(slot, None, None)
        assert reason is not None and "max_slot_wal_keep_size" in reason


def test_the_streams_invalidation_line_explains_postgresql_18s_reason() -> None:
    said = ('can no longer access replication slot "cdc_relay"\nDETAIL:  This replication slot '
            'has been invalidated due to "idle_timeout".')
    assert "idle_replication_slot_timeout" in _cause(said)
    assert _cause("can no longer get changes from replication slot") == ""


def test_doctor_fails_an_idle_timed_out_slot_with_the_recovery_and_the_setting() -> None:
    verdict, detail, fix = _checks(IDLE_TIMED_OUT)["slot"]
    assert verdict is Verdict.FAIL and "idle_timeout" in detail
    assert fix is not None and "--on-slot-loss recover" in fix
    assert "idle_replication_slot_timeout" in fix


def test_doctor_warns_past_half_the_timeout_and_passes_below_it() -> None:
    assert _checks(SLOT)["idle timeout"][0] is Verdict.PASS  # 10 min of 1 h
    verdict, detail, _ = _checks(replace(SLOT, inactive_seconds=2000.0))["idle timeout"]
    assert verdict is Verdict.WARN and "idle_replication_slot_timeout" in detail
    assert "26m40s more" in detail


def test_the_timeout_does_not_apply_while_the_relay_streams_or_when_off() -> None:
    assert idle_timeout_warning(replace(SLOT, active=True, inactive_seconds=None)) is None
    assert idle_timeout_warning(replace(SLOT, idle_timeout=0.0, inactive_seconds=10**6)) is None
    assert "idle timeout" not in _checks(replace(SLOT, idle_timeout=None))  # before 18
    assert _checks(replace(SLOT, idle_timeout=0.0))["idle timeout"][0] is Verdict.PASS


def _status_lines(slot: SlotStatus) -> str:
    report = StatusReport("cdc_relay", Lsn(1000), slot, TableRef("public", "outbox_events"),
                          None, None)
    return "\n".join(report.lines())


def test_status_shows_the_budget_and_warns_past_half_of_it() -> None:
    assert "inactive 10m0s of idle_replication_slot_timeout 1h0m" in _status_lines(SLOT)
    assert "WARNING" not in _status_lines(SLOT)
    assert "WARNING" in _status_lines(replace(SLOT, inactive_seconds=1801.0))


def test_status_names_the_invalidation_reason_and_the_recovery() -> None:
    text = _status_lines(IDLE_TIMED_OUT)
    assert "invalidated" in text and "idle_timeout" in text and "--on-slot-loss recover" in text


@dataclass
class Probe:
    """A stand-in for the metrics' slot probe."""

    latest: SlotStatus | None
    ok: bool = True
    succeeded_at: float = 1.0


def _samples(slot: SlotStatus) -> dict[str, float]:
    metrics: list[Metric] = list(slot_metrics(Probe(slot)))
    return {f"{s.name}{s.labels}": s.value for m in metrics for s in m.samples}


def test_the_metrics_expose_the_invalidation_reason_and_the_budget() -> None:
    before = _samples(SLOT)
    assert before["cdc_relay_slot_inactive_seconds{}"] == 600.0
    assert before["cdc_relay_slot_idle_timeout_seconds{}"] == 3600.0
    assert before["cdc_relay_slot_invalidated{'reason': 'idle_timeout'}"] == 0
    after = _samples(IDLE_TIMED_OUT)
    assert after["cdc_relay_slot_invalidated{'reason': 'idle_timeout'}"] == 1
    assert after["cdc_relay_slot_invalidated{'reason': 'wal_removed'}"] == 0


def test_durations_read_as_people_write_them() -> None:
    assert [seconds_text(s) for s in (5, 90, 7260, 90000)] == ["5s", "1m30s", "2h1m", "1d1h"]
