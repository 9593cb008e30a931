"""Exactly-once's pure parts: the checkpoint record, the replay filter, the batching policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_relay.config import TxnLimits
from cdc_relay.errors import CheckpointCorrupt, CheckpointMismatch, ConfigError, RelayError
from cdc_relay.model import Lsn
from cdc_relay.sink.transactions import CheckpointViews
from cdc_relay.wal.exactly_once.checkpoint import (
    SKIP_ALL,
    Checkpoint,
    ReplayFilter,
    checkpoint_key,
    choose,
    committed_view_behind,
    transactional_id,
)
from cdc_relay.wal.exactly_once.txn_policy import CommittedTracker, TxnBatch

SYS, SLOT = "7301234567890123456", "cdc_relay"


def _record(cp: Checkpoint) -> tuple[bytes, bytes]:
    return checkpoint_key(cp.system_id, cp.slot), cp.encode()


def _views(committed: list[int], aborted: list[int], *, other: int = 0,
           stable: int | None = None) -> CheckpointViews:
    """Checkpoints of this source at the given LSNs, committed ones first, then ``other``
    records of another source, then the ``aborted`` ones (in the log only)."""
    records = [(checkpoint_key(SYS, SLOT), Checkpoint(SYS, SLOT, Lsn(lsn)).encode())
               for lsn in committed]
    records += [(b"99/other", b"{}")] * other
    log = [(offset, key, value) for offset, (key, value) in enumerate(records)]
    shown = list(log)
    for lsn in aborted:
        log.append((len(log), *_record(Checkpoint(SYS, SLOT, Lsn(lsn)))))
    return CheckpointViews(shown, log, len(log) if stable is None else stable)


def _behind(views: CheckpointViews, confirmed: int | None, *, fenced: bool = False) -> str | None:
    return committed_view_behind(views, system_id=SYS, slot=SLOT,
                                 confirmed=None if confirmed is None else Lsn(confirmed),
                                 fenced=fenced)


def test_the_committed_view_is_fine_when_it_shows_the_newest_checkpoint() -> None:
    assert _behind(_views([100, 200], []), 500, fenced=True) is None  # slot past it: idle advance
    assert _behind(_views([], []), 500, fenced=True) is None
    assert _behind(_views([100], [], other=3, stable=2), 100, fenced=True) is None


def test_an_aborted_checkpoint_ahead_of_the_slot_is_a_replay_not_a_loss() -> None:
    # Killed between producing the checkpoint record and the commit: aborted, replayed.
    assert _behind(_views([100], [200]), 150, fenced=True) is None
    assert _behind(_views([100], [200]), None) is None  # no slot: nothing confirmed


def test_a_slot_confirmed_past_a_checkpoint_read_committed_readers_miss_is_named() -> None:
    line = _behind(_views([100], [200]), 200)
    assert line is not None and "0/C8" in line and "checkpoint 0/64" in line
    assert "confirmed at 0/C8" in line and "\n" not in line
    assert _behind(_views([], [200]), 300) is not None  # none committed at all
    assert _behind(_views([300], [200]), 300) is None  # an older record: nothing newer hidden


def test_after_fencing_the_last_stable_offset_must_pass_the_newest_record() -> None:
    stuck = _views([100], [200], stable=1)  # the stable offset stops at the aborted record
    line = _behind(stuck, 150, fenced=True)
    assert line is not None and "last stable offset 1" in line
    assert _behind(stuck, 150, fenced=False) is None  # a running relay's open transaction
    assert _behind(stuck, 500, fenced=False) is None  # still open: not judged (doctor)
    assert _behind(_views([100], [200], stable=2), 500, fenced=False) is not None  # below it


def test_an_unreadable_or_deleted_newest_record_is_left_to_choose() -> None:
    views = _views([100], [])
    log = [*views.logged, (1, checkpoint_key(SYS, SLOT), None), (2, checkpoint_key(SYS, SLOT), b"?")]
    assert _behind(CheckpointViews(views.committed, log, 3), 500, fenced=True) is None


def test_ids_and_keys_are_deterministic_per_source() -> None:
    assert transactional_id(SYS, SLOT) == transactional_id(SYS, SLOT)
    assert transactional_id(SYS, SLOT) != transactional_id(SYS, "other")
    assert transactional_id(SYS, SLOT) != transactional_id("1", SLOT)
    assert checkpoint_key(SYS, SLOT) == f"{SYS}/{SLOT}".encode()


@given(st.integers(0, 2**64 - 1), st.one_of(st.none(), st.integers(0, 2**64 - 1)),
       st.integers(0, 10**9))
def test_checkpoint_round_trips(lsn: int, partial: int | None, events: int) -> None:
    cp = Checkpoint(SYS, SLOT, Lsn(lsn), None if partial is None else Lsn(partial),
                    0 if partial is None else events)
    assert Checkpoint.decode(cp.encode()) == cp


def test_choose_takes_the_latest_record_of_this_source() -> None:
    old = Checkpoint(SYS, SLOT, Lsn(100))
    new = Checkpoint(SYS, SLOT, Lsn(200))
    other_slot = Checkpoint(SYS, "b", Lsn(999))
    records = [_record(old), _record(other_slot), _record(new)]
    assert choose(records, system_id=SYS, slot=SLOT) == new
    assert choose([], system_id=SYS, slot=SLOT) is None


def test_a_tombstone_deletes_the_checkpoint() -> None:
    records = [_record(Checkpoint(SYS, SLOT, Lsn(100))), (checkpoint_key(SYS, SLOT), None)]
    assert choose(records, system_id=SYS, slot=SLOT) is None


def test_another_clusters_checkpoint_for_the_slot_is_refused_unless_reset() -> None:
    records = [_record(Checkpoint("111", SLOT, Lsn(100)))]
    with pytest.raises(CheckpointMismatch, match="--reset-checkpoint"):
        choose(records, system_id=SYS, slot=SLOT)
    assert choose(records, system_id=SYS, slot=SLOT, reset=True) is None
    # once this cluster has its own checkpoint, the old one no longer matters
    ours = Checkpoint(SYS, SLOT, Lsn(5))
    assert choose([*records, _record(ours)], system_id=SYS, slot=SLOT) == ours


def test_reset_ignores_this_sources_checkpoint_too() -> None:
    assert choose([_record(Checkpoint(SYS, SLOT, Lsn(5)))], system_id=SYS, slot=SLOT,
                  reset=True) is None


def test_an_unreadable_record_is_an_error_not_a_fresh_start() -> None:
    with pytest.raises(CheckpointCorrupt):
        choose([(checkpoint_key(SYS, SLOT), b"{nope")], system_id=SYS, slot=SLOT)


def test_replay_filter_is_transaction_granular() -> None:
    cp = Checkpoint(SYS, SLOT, Lsn(1000), partial_commit_lsn=Lsn(2000), partial_events=7)
    replay = ReplayFilter(cp)
    assert replay.skip(Lsn(900)) == SKIP_ALL  # commit record before the checkpoint's end
    assert replay.skip(Lsn(999)) == SKIP_ALL
    assert replay.skip(Lsn(1000)) == 0  # the first transaction after it
    assert replay.skip(Lsn(2000)) == 7  # the split one: what is already in Kafka
    assert replay.skip(Lsn(3000)) == 0
    assert ReplayFilter(None).skip(Lsn(1)) == 0


def test_replay_filter_refuses_to_guess_without_a_commit_lsn() -> None:
    with pytest.raises(RelayError, match="include-lsn"):
        ReplayFilter(Checkpoint(SYS, SLOT, Lsn(10))).skip(None)


def test_limits_are_validated() -> None:
    for bad in ({"interval": 0}, {"max_events": 0}, {"max_bytes": 0}, {"split_events": 0}):
        with pytest.raises(ConfigError):
            TxnLimits(**bad)  # type: ignore[arg-type]


def test_a_batch_closes_only_at_a_boundary_after_the_interval() -> None:
    batch = TxnBatch(TxnLimits(interval=0.1))
    assert not batch.should_close(10.0)  # nothing open
    batch.begin_pg()
    batch.opened(0.0)
    batch.added(100)
    assert not batch.should_close(5.0)  # inside a PostgreSQL transaction: never
    batch.commit_pg()
    assert not batch.should_close(0.05)
    assert batch.should_close(0.1)
    assert batch.age(0.25) == pytest.approx(0.25)
    batch.closed()
    assert batch.age(1.0) == 0.0


def test_event_and_byte_limits_close_at_the_next_boundary() -> None:
    for limits, nbytes in ((TxnLimits(interval=60, max_events=3), 1),
                           (TxnLimits(interval=60, max_bytes=250), 100)):
        batch = TxnBatch(limits)
        batch.begin_pg()
        batch.opened(0.0)
        for _ in range(3):
            batch.added(nbytes)
        assert not batch.should_close(0.0)
        assert not batch.should_split()  # a large transaction is not split by default
        batch.commit_pg()
        assert batch.should_close(0.0)


def test_split_events_split_a_transaction_and_count_its_events() -> None:
    batch = TxnBatch(TxnLimits(interval=60, split_events=2))
    batch.begin_pg()
    batch.opened(0.0)
    batch.added(1)
    assert not batch.should_split()
    batch.added(1)
    assert batch.should_split()
    batch.closed()
    batch.opened(1.0)
    assert not batch.should_split()
    batch.added(1)
    assert batch.pg_events == 3  # all of the transaction's events produced so far
    assert batch.pg_events_here == 1


def test_committed_tracker_confirms_only_after_the_kafka_commit() -> None:
    tracker = CommittedTracker(Lsn(10))
    tracker.begin()
    first = tracker.produced()
    second = tracker.produced()
    tracker.commit(Lsn(50))
    tracker.delivered(first)
    tracker.delivered(second)  # broker acks inside the open transaction
    assert tracker.confirmed == Lsn(10)
    tracker.idle_position(Lsn(60))  # not idle: a keepalive cannot pass it either
    assert tracker.confirmed == Lsn(10)
    tracker.committed(tracker.last_produced)
    assert tracker.confirmed == Lsn(50)
    tracker.idle_position(Lsn(60))  # nothing open: keepalive advances are allowed again
    assert tracker.confirmed == Lsn(60)


def test_committed_tracker_split_commit_does_not_confirm_the_open_transaction() -> None:
    tracker = CommittedTracker(Lsn(10))
    tracker.begin()
    tracker.produced()
    tracker.committed(tracker.last_produced)  # a split: the PostgreSQL txn is still open
    assert tracker.confirmed == Lsn(10)
    tracker.commit(Lsn(70))
    assert tracker.confirmed == Lsn(70)


def test_committed_tracker_counts_broker_acks_out_of_flight() -> None:
    tracker = CommittedTracker(Lsn(10))
    tracker.begin()
    tokens = [tracker.produced() for _ in range(3)]
    assert tracker.inflight == 3
    tracker.delivered(tokens[0])
    tracker.delivered(tokens[2])
    assert tracker.inflight == 1  # backpressure sees only what the broker has not acked
    tracker.delivered(tokens[1])
    tracker.committed(tokens[2])
    assert tracker.inflight == 0
    tracker.produced()
    assert tracker.inflight == 1


def test_committed_tracker_counts_a_batch_of_acks_as_one_by_one_and_confirms_nothing() -> None:
    tracker = CommittedTracker(Lsn(10))
    tracker.begin()
    tokens = [tracker.produced() for _ in range(4)]
    tracker.commit(Lsn(50))
    tracker.delivered_all([tokens[3], tokens[0]])  # a poll's successes, handed over at once
    assert (tracker.inflight, tracker.confirmed) == (2, Lsn(10))
    tracker.delivered_all([tokens[1], tokens[2]])
    assert (tracker.inflight, tracker.confirmed) == (0, Lsn(10))  # acked, not committed
    tracker.committed(tokens[3])
    assert (tracker.inflight, tracker.confirmed) == (0, Lsn(50))
    tracker.delivered_all([tokens[1]])  # behind the watermark now: not counted again
    assert tracker.inflight == 0
    tracker.produced()
    assert tracker.inflight == 1
