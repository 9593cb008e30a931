"""The continuity rules that need no server: the watchdog, telling a slot loss, the window
a recovery cannot vouch for, and the recovery command (docs/design.md, continuity)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from cdc_relay.config import FlowConfig, ReplicationConfig, RouterConfig, TableRef
from cdc_relay.decoding.wal2json import Wal2JsonDecoder
from cdc_relay.errors import ConfigError, ExitCode, SlotLost
from cdc_relay.model import Lsn, OutboxColumns, SlotStatus
from cdc_relay.routing import Router
from cdc_relay.testing import FakeSinkFactory, FakeSlot, FakeSource, Txn
from cdc_relay.wal.recovery import Retention, unvouched_window
from cdc_relay.wal.slot.continuity import SlotRecord, loss_reason, recovery_command, slot_lost
from cdc_relay.wal.stream.loop import WalRelay
from cdc_relay.wal.stream.session import LoopTimings

TABLE = TableRef("public", "outbox_events")
T0 = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def _relay(slot: FakeSlot, now: list[float], stop: threading.Event,
           sources: list[FakeSource], idle: int) -> WalRelay:
    def on_idle() -> None:
        now[0] += 1.0  # every wait of the loop takes a fake second
        if now[0] >= idle:
            stop.set()

    def source() -> FakeSource:
        made = FakeSource(slot, on_idle, lambda flushed: None)
        sources.append(made)
        return made

    return WalRelay(source_factory=source, decoder=Wal2JsonDecoder(TABLE, OutboxColumns()),
                    router=Router(RouterConfig(topic_pattern="t.{aggregate_type}"), TABLE),
                    sink_factory=FakeSinkFactory(), flow=FlowConfig(),
                    timings=LoopTimings(status_interval=1.0, replication_timeout=30.0,
                                        reconnect_min=0, reconnect_max=0),
                    clock=lambda: now[0])


def test_a_half_open_connection_is_dropped_and_reconnected() -> None:
    slot = FakeSlot([Txn(1000, ["e1"])], half_open=True)
    now, stop, sources = [0.0], threading.Event(), []
    _relay(slot, now, stop, sources, idle=100).run(stop)
    assert len(sources) >= 2, "the silent connection was never given up"
    assert ("reply requested", 1000) in slot.calls, "no keepalive was asked for first"


def test_a_quiet_but_live_connection_is_kept() -> None:
    slot = FakeSlot([Txn(1000, ["e1"])])
    now, stop, sources = [0.0], threading.Event(), []
    _relay(slot, now, stop, sources, idle=200).run(stop)
    assert len(sources) == 1
    assert slot.calls.count(("reply requested", 1000)) >= 2  # asked, answered, asked again


def _status(wal_status: str | None = "reserved") -> SlotStatus:
    return SlotStatus(name="cdc_relay", plugin="pgoutput", slot_type="logical", database="app",
                      active=False, active_pid=None, confirmed_flush_lsn=Lsn(100),
                      restart_lsn=Lsn(90), lag_bytes=0, lag_seconds=None, retained_bytes=10,
                      wal_status=wal_status, safe_wal_size=None)


def _record(system_id: str | None = "7000", covered: datetime | None = T0) -> SlotRecord:
    return SlotRecord(slot="cdc_relay", plugin="pgoutput", database="app", table="public.outbox",
                      system_identifier=system_id, timeline=1, created_lsn=Lsn(50),
                      created_at=T0 - timedelta(days=1), failover=False, horizon_xid=740,
                      covered_at=covered, confirmed_lsn=Lsn(100))


@pytest.mark.parametrize(("status", "record", "system_id", "lost"), [
    (None, None, "7000", False),  # the first start: nothing existed
    (None, "record", "7000", True),  # created, now missing: the failover case
    (None, "record", None, True),  # the role may not read the identifier: still a loss
    (None, "record", "8000", False),  # a record of another system (a restored copy)
    ("reserved", "record", "7000", False),
    ("unreserved", "record", "7000", False),  # at risk, not lost yet
    ("lost", None, "7000", True),  # invalidated, even with no record
])
def test_what_counts_as_a_slot_loss(status: str | None, record: str | None,
                                    system_id: str | None, lost: bool) -> None:
    reason = loss_reason(_status(status) if status else None,
                         _record() if record else None, system_id)
    assert (reason is not None) is lost


def test_a_slot_loss_names_the_window_and_the_exact_command() -> None:
    error = slot_lost("replication slot 'cdc_relay' no longer exists", _record(),
                      argv=["/usr/bin/cdc-relay", "run", "--dsn", "host=db password=s3cret",
                            "--on-slot-loss", "exit", "--plugin", "pgoutput"])
    text = str(error)
    assert isinstance(error, SlotLost) and error.exit_code is ExitCode.SLOT_LOST
    assert "since 2026-12-03 10:00:00" in text
    assert "cdc-relay run --dsn 'host=db password=***' --plugin pgoutput --on-slot-loss recover" in text
    assert "s3cret" not in text and "\n" not in text


def test_the_window_nobody_can_vouch_for() -> None:
    covered = T0
    kept = Retention(oldest=T0 - timedelta(hours=1), rows=10, deletes=True)
    assert unvouched_window(covered, kept, T0 + timedelta(hours=2)) is None
    trimmed = Retention(oldest=T0 + timedelta(minutes=5), rows=10, deletes=True)
    assert unvouched_window(covered, trimmed, T0 + timedelta(hours=2)) == (
        T0, T0 + timedelta(minutes=5))
    young = Retention(oldest=T0 + timedelta(minutes=5), rows=10, deletes=False)
    assert unvouched_window(covered, young, T0 + timedelta(hours=2)) is None  # none written before
    empty = Retention(oldest=None, rows=0, deletes=True)  # insert-then-delete: nothing is kept
    assert unvouched_window(covered, empty, T0 + timedelta(hours=2)) == (
        T0, T0 + timedelta(hours=2))


def test_continuity_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="on-slot-loss"):
        ReplicationConfig(dsn="host=x", on_slot_loss="ignore")
    with pytest.raises(ConfigError, match="replication-timeout"):
        ReplicationConfig(dsn="host=x", status_interval=10, replication_timeout=20)
    assert recovery_command(["cdc-relay", "run", "--on-slot-loss=exit"]) == (
        "cdc-relay run --on-slot-loss recover")
