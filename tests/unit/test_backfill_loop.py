"""The backfill's publishing loop and doctor's backfill check, with fakes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from datetime import UTC, datetime
from typing import Any

import pytest

from cdc_relay.config import FlowConfig, RouterConfig
from cdc_relay.errors import DeadLetterRefused
from cdc_relay.model import OutboxEvent, SlotStatus
from cdc_relay.ops.doctor.facts import (
    BackfillFacts,
    DoctorSettings,
    Facts,
    PublicationFacts,
    ServerFacts,
    TableFacts,
)
from cdc_relay.ops.doctor.slot_checks import backfill_check
from cdc_relay.ops.verdicts import Verdict
from cdc_relay.routing import Router
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind
from cdc_relay.testing import FakeSinkFactory, shuffled
from cdc_relay.wal.backfill.loop import Backfill, BackfillStats, BackfillTimings


class FakeReader:
    """Rows 0..n-1 in a fixed order; ``after(ordinal)`` runs once each row was handed out."""

    pid = 42

    def __init__(self, n: int, after: Callable[[int], None] | None = None) -> None:
        self.events = [OutboxEvent(f"id-{i}", "order", f"o-{i % 7}", "Placed",
                                   f'{{"seq": {i}}}'.encode(), 1_700_000_000_000 + i)
                       for i in range(n)]
        self.offsets: list[int] = []
        self._after = after

    def rows(self, offset: int) -> Generator[tuple[Any, OutboxEvent], None, None]:
        self.offsets.append(offset)
        for i in range(offset, len(self.events)):
            yield i, self.events[i]
            if self._after is not None:
                self._after(i)


class FakeStore:
    def __init__(self) -> None:
        self.progress_calls: list[int] = []

    def progress(self, rows_done: int) -> None:
        self.progress_calls.append(rows_done)

    def snapshot_age(self, reader_pid: int) -> tuple[float, int] | None:
        return 1.0, 3


class Marks(list[Any]):
    """A MarkProcessed that keeps every marked id."""

    def __call__(self, raw_ids: list[Any]) -> None:
        self.extend(raw_ids)

    def drain(self) -> None:
        pass


def make(reader: FakeReader, factory: FakeSinkFactory, *, max_inflight: int = 100,
         topic_pattern: str = "outbox.event.{aggregate_type}") -> tuple[Backfill, list[Any]]:
    marked = Marks()
    backfill = Backfill(reader=reader, store=FakeStore(), mark=marked,
                        router=Router(RouterConfig(topic_pattern=topic_pattern)),
                        sink_factory=factory, flow=FlowConfig(max_inflight_events=max_inflight),
                        timings=BackfillTimings(retry_min=0, retry_max=0, progress_interval=0),
                        stats=BackfillStats(rows_total=len(reader.events)))
    return backfill, marked


def test_every_row_is_published_once_as_the_router_makes_it_and_marked_once() -> None:
    reader = FakeReader(1000)
    factory = FakeSinkFactory(reorder=shuffled(7), max_per_poll=13)
    backfill, marked = make(reader, factory)
    assert backfill.run(threading.Event())
    router = Router(RouterConfig())
    assert factory.current.messages == [router.route(e) for e in reader.events]
    assert sorted(marked) == list(range(1000))
    assert backfill.stats.finished and backfill.stats.rows_done == 1000


def test_in_flight_rows_never_exceed_the_bound() -> None:
    peak = 0
    factory = FakeSinkFactory(max_per_poll=5)

    def watch(_: int) -> None:
        nonlocal peak
        peak = max(peak, factory.current.pending())

    backfill, marked = make(FakeReader(500, after=watch), factory, max_inflight=50)
    assert backfill.run(threading.Event())
    assert 0 < peak <= 50
    assert len(marked) == 500


def test_a_fatal_producer_error_resumes_at_the_watermark_with_a_new_producer() -> None:
    factory = FakeSinkFactory(reorder=shuffled(3), max_per_poll=20)

    def fail_once(ordinal: int) -> None:
        if ordinal == 600 and factory.generations == 1:
            factory.current.fail_producer()

    reader = FakeReader(1000, after=fail_once)
    backfill, marked = make(reader, factory, max_inflight=100)
    assert backfill.run(threading.Event())
    assert factory.generations == 2
    assert reader.offsets[0] == 0 and reader.offsets[1] > 0  # not from scratch
    assert sorted(marked) == list(range(1000))  # each row marked exactly once
    produced = sum(len(sink.produced) for sink in factory.sinks)
    assert produced <= 1000 + 100  # only what was unacknowledged at the failure is sent again


def test_an_event_refused_for_good_goes_to_the_dead_letter_topic_and_counts_as_done() -> None:
    reader = FakeReader(10)
    reader.events[4].aggregate_type = "no spaces allowed"
    factory = FakeSinkFactory()
    backfill, marked = make(reader, factory)
    assert backfill.run(threading.Event())
    dead = [m for m in factory.current.messages if m.topic == "outbox.dead-letters"]
    assert [dict(m.headers)["id"] for m in dead] == [b"id-4"]
    assert sorted(marked) == list(range(10))
    assert backfill.stats.dead_lettered == 1


def test_a_delivery_refused_for_good_is_dead_lettered_too() -> None:
    factory = FakeSinkFactory(fail_tokens={3: ErrorKind.PERMANENT})
    backfill, marked = make(FakeReader(10), factory)
    assert backfill.run(threading.Event())
    dead = [m for m in factory.current.messages if m.topic == "outbox.dead-letters"]
    assert [dict(m.headers)["id"] for m in dead] == [b"id-3"]
    assert sorted(marked) == list(range(10))


def test_a_too_large_row_is_dead_lettered_without_its_payload_by_the_sinks_cause() -> None:
    too_large = DeliveryError(ErrorKind.PERMANENT, "refused", Cause.TOO_LARGE)
    factory = FakeSinkFactory(fail_tokens={3: too_large})
    backfill, marked = make(FakeReader(10), factory)
    assert backfill.run(threading.Event())
    [dead] = [m for m in factory.current.messages if m.topic == "outbox.dead-letters"]
    assert dead.value == b"" and "payload_omitted_bytes" in dict(dead.headers)
    assert sorted(marked) == list(range(10)) and backfill.stats.dead_lettered == 1


def test_a_dead_letter_refused_too_stops_the_backfill_with_the_acknowledged_rows_marked() -> None:
    factory = FakeSinkFactory(fail_tokens={5: ErrorKind.PERMANENT},
                              reject_topics={"outbox.dead-letters": ErrorKind.PERMANENT})
    backfill, marked = make(FakeReader(10), factory)
    with pytest.raises(DeadLetterRefused, match="refused event id-5"):
        backfill.run(threading.Event())
    assert factory.generations == 1  # not retried with a new producer: it would refuse again
    assert 5 not in marked and sorted(marked) == sorted(set(marked))
    assert not backfill.stats.finished and not backfill.stats.running


def test_a_stop_mid_way_returns_unfinished_with_the_acknowledged_rows_marked() -> None:
    stop = threading.Event()

    def stop_at(ordinal: int) -> None:
        if ordinal == 300:
            stop.set()

    factory = FakeSinkFactory()
    backfill, marked = make(FakeReader(1000, after=stop_at), factory)
    assert not backfill.run(stop)
    assert not backfill.stats.finished
    assert 300 < len(marked) < 310  # the row in hand when the stop came, then no more
    assert sorted(marked) == list(range(len(marked)))


# ---------------------------------------------------------------- doctor

SERVER = ServerFacts("15.20", "app", "relay", True, True, "logical", 10, 10, -1, 1, 0)
SLOT = SlotStatus("cdc_relay", "wal2json", "logical", "app", False, None, None, None, 0, None, 0,
                  "reserved", None)


def facts(backfill: BackfillFacts | None, slot: SlotStatus | None = SLOT) -> Facts:
    return Facts(SERVER, TableFacts(True), PublicationFacts(False), slot, backfill=backfill)


@pytest.mark.parametrize(("info", "slot", "verdict", "words"), [
    (BackfillFacts(0), SLOT, Verdict.PASS, "no pending rows"),
    (BackfillFacts(12, datetime(2026, 1, 1, tzinfo=UTC)), SLOT, Verdict.WARN, "never published"),
    (BackfillFacts(12), None, Verdict.WARN, "--snapshot initial"),
    (BackfillFacts(5, state="running", rows_done=3, rows_total=9), SLOT, Verdict.WARN,
     "did not finish"),
    (BackfillFacts(5, state="running", running=True, rows_done=3, rows_total=9), SLOT,
     Verdict.PASS, "3 of 9"),
    (BackfillFacts(5, state="done", rows_done=9, rows_total=9), SLOT, Verdict.PASS, "done"),
    (BackfillFacts(5, state="done", pending_before_start=2), SLOT, Verdict.PASS,
     "WAL mode published them without marking them"),
    (BackfillFacts(12, pending_before_slot=0), SLOT, Verdict.PASS, "no pending row older than"),
    (BackfillFacts(12, pending_before_slot=3), SLOT, Verdict.WARN,
     "3 rows older than slot cdc_relay have processed_at NULL and no backfill ran for it: they "
     "were never published (9 newer rows keep processed_at NULL"),
])
def test_doctor_backfill_check(info: BackfillFacts, slot: SlotStatus | None, verdict: Verdict,
                               words: str) -> None:
    check = backfill_check(facts(info, slot), DoctorSettings(dsn="x"))
    assert check is not None
    assert check.verdict is verdict and words in check.detail


def test_doctor_has_no_backfill_check_without_the_bookkeeping_columns() -> None:
    assert backfill_check(facts(None), DoctorSettings(dsn="x")) is None


def test_status_calls_unmarked_rows_no_backlog_where_a_slot_reads_the_table() -> None:
    from cdc_relay.config import TableRef
    from cdc_relay.model import Lsn
    from cdc_relay.ops.status import StatusReport

    table = TableRef("public", "outbox_events")
    wal = "\n".join(StatusReport("cdc_relay", Lsn(100), SLOT, table, 1, 0).lines())
    assert "pending rows" in wal and "polling mode's backlog" not in wal
    assert "WAL mode publishes rows without marking them" in wal
    polling = "\n".join(StatusReport("cdc_relay", Lsn(100), None, table, 1, 0).lines())
    assert "1 (polling mode's backlog)" in polling


def test_doctor_never_advises_publishing_rows_a_finished_backfill_or_recovery_left_unmarked(
) -> None:
    info = BackfillFacts(1, state="done", rows_done=4, pending_before_start=1)
    check = backfill_check(facts(info, SLOT), DoctorSettings(dsn="x"))
    assert check is not None and check.verdict is Verdict.PASS and check.fix is None
    assert "cdc-relay poll" not in check.detail and "nothing to publish" in check.detail


def test_the_stop_line_counts_the_rows_a_recovery_republished(
        caplog: pytest.LogCaptureFixture) -> None:
    from cdc_relay.app.run import Republished, _stopped
    from cdc_relay.stats import RelayStats

    stats = RelayStats()
    stats.published, stats.dead_lettered = 2, 0
    with caplog.at_level("INFO", logger="cdc_relay"):
        _stopped(stats, "cdc_relay", "kafka", Republished("by the slot's recovery", 3, 1))
    [line] = [r for r in caplog.records if r.getMessage().startswith("stopped:")]
    assert line.getMessage() == (
        "stopped: 5 events published (3 of them by the slot's recovery), 1 dead-lettered")
    assert (line.published, line.republished) == (5, 3)  # type: ignore[attr-defined]
