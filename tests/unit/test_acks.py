"""The acknowledgement invariant: property tests of AckTracker (docs/design.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_relay.acks import AckTracker
from cdc_relay.model import Lsn


@pytest.mark.slow  # a long property run
@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=12),
    data=st.data(),
)
def test_confirmed_never_decreases_and_never_passes_an_unacked_event(
    sizes: list[int], data: st.DataObject
) -> None:
    tracker = AckTracker(Lsn(100))
    # WAL order: txn i has sizes[i] events and ends at LSN 1000 * (i + 1).
    stream: list[tuple[str, int]] = []
    for i, size in enumerate(sizes):
        stream.append(("begin", i))
        stream.extend(("event", i) for _ in range(size))
        stream.append(("commit", i))
    end_lsn = {i: Lsn(1000 * (i + 1)) for i in range(len(sizes))}

    txn_of_seq: dict[int, int] = {}
    undelivered: set[int] = set()
    failed: set[int] = set()
    committed: set[int] = set()
    pos = 0
    previous = tracker.confirmed
    while pos < len(stream) or (undelivered - failed):
        choices = []
        if pos < len(stream):
            choices.append("read")
        if undelivered - failed:
            choices += ["deliver", "fail", "dup"]
        choices.append("keepalive")
        op = data.draw(st.sampled_from(choices))
        if op == "read":
            kind, txn = stream[pos]
            pos += 1
            if kind == "begin":
                tracker.begin()
            elif kind == "event":
                seq = tracker.produced()
                txn_of_seq[seq] = txn
                undelivered.add(seq)
            else:
                tracker.commit(end_lsn[txn])
                committed.add(txn)
        elif op in ("deliver", "fail"):
            seq = data.draw(st.sampled_from(sorted(undelivered - failed)))
            if op == "deliver":
                undelivered.discard(seq)
                tracker.delivered(seq)
            else:
                failed.add(seq)  # never delivered: it must hold the watermark forever
        elif op == "dup":
            delivered = sorted(set(txn_of_seq) - undelivered)
            if delivered:
                tracker.delivered(data.draw(st.sampled_from(delivered)))
        else:
            # A keepalive at the server's position: just past everything read so far.
            tracker.idle_position(Lsn(1000 * (len(committed) + 1) - 1))

        confirmed = tracker.confirmed
        assert confirmed >= previous, "confirmed LSN went backwards"
        previous = confirmed
        for seq in undelivered:
            assert confirmed < end_lsn[txn_of_seq[seq]], (
                f"confirmed {confirmed} passed undelivered event {seq} of txn {txn_of_seq[seq]}"
            )
        # A transaction that is still open is never confirmed past.
        if pos and stream[pos - 1][0] != "commit":
            assert confirmed < end_lsn[stream[pos - 1][1]]

    if not failed:
        assert tracker.confirmed >= end_lsn[len(sizes) - 1]
        assert tracker.inflight == 0


def test_commit_is_confirmed_only_after_every_event_of_it_and_before_it() -> None:
    tracker = AckTracker()
    tracker.begin()
    a, b = tracker.produced(), tracker.produced()
    tracker.commit(Lsn(10))
    tracker.begin()
    c = tracker.produced()
    tracker.commit(Lsn(20))

    tracker.delivered(c)
    assert tracker.confirmed == 0
    tracker.delivered(b)
    assert tracker.confirmed == 0
    tracker.delivered(a)
    assert tracker.confirmed == Lsn(20)
    assert tracker.inflight == 0


def test_empty_transaction_and_keepalive_advance_an_idle_tracker() -> None:
    tracker = AckTracker(Lsn(5))
    tracker.begin()
    tracker.commit(Lsn(50))
    assert tracker.confirmed == Lsn(50)
    tracker.idle_position(Lsn(70))
    assert tracker.confirmed == Lsn(70)


def test_keepalive_is_ignored_while_a_transaction_is_open_or_events_are_in_flight() -> None:
    tracker = AckTracker()
    tracker.begin()
    tracker.idle_position(Lsn(100))
    assert tracker.confirmed == 0
    seq = tracker.produced()
    tracker.commit(Lsn(200))
    tracker.idle_position(Lsn(300))
    assert tracker.confirmed == 0
    tracker.delivered(seq)
    assert tracker.confirmed == Lsn(200)
    tracker.idle_position(Lsn(300))
    assert tracker.confirmed == Lsn(300)


def test_delivered_through_acknowledges_a_prefix_at_once() -> None:
    tracker = AckTracker()
    tracker.begin()
    seqs = [tracker.produced() for _ in range(5)]
    tracker.commit(Lsn(10))
    tracker.begin()
    later = tracker.produced()
    tracker.commit(Lsn(20))
    tracker.delivered_through(seqs[-1])
    assert tracker.confirmed == Lsn(10)
    assert tracker.inflight == 1
    tracker.delivered(later)
    assert tracker.confirmed == Lsn(20)


def test_commit_behind_the_start_position_is_ignored() -> None:
    tracker = AckTracker(Lsn(500))
    tracker.begin()
    seq = tracker.produced()
    tracker.commit(Lsn(400))
    tracker.delivered(seq)
    assert tracker.confirmed == Lsn(500)


def test_empty_commits_behind_a_stuck_event_are_coalesced_into_one_entry() -> None:
    tracker = AckTracker()
    tracker.begin()
    stuck = tracker.produced()
    tracker.commit(Lsn(10))
    for i in range(100_000):  # another table's transactions: empty B/C pairs
        tracker.begin()
        tracker.commit(Lsn(20 + i))
    assert tracker.pending_commits <= 2
    assert tracker.confirmed == 0
    tracker.delivered(stuck)
    assert tracker.confirmed == Lsn(20 + 99_999)
    assert tracker.pending_commits == 0


def test_commits_with_events_behind_a_stuck_one_are_bounded_by_the_span() -> None:
    tracker = AckTracker()
    tracker.begin()
    stuck = tracker.produced()
    tracker.commit(Lsn(10))
    for i in range(1000):
        tracker.begin()
        seq = tracker.produced()
        tracker.commit(Lsn(20 + 2 * i))
        tracker.begin()
        tracker.commit(Lsn(21 + 2 * i))  # an empty one after each: coalesced
        tracker.delivered(seq)
    assert tracker.inflight == 1001
    assert tracker.pending_commits <= tracker.inflight + 1
    tracker.delivered(stuck)
    assert tracker.confirmed == Lsn(21 + 2 * 999)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=10),
    data=st.data(),
)
def test_a_batch_of_reports_confirms_exactly_the_prefix_it_completes(
    sizes: list[int], data: st.DataObject
) -> None:
    """delivered_all(batch) - a sink handing a poll's successes over at once - against a
    model of the invariant: the watermark is the first event not yet reported, and every
    commit whose events all lie below it is confirmed; duplicates and tokens never
    produced change nothing."""
    tracker = AckTracker(Lsn(10))
    commits: list[tuple[int, Lsn]] = []  # (events produced before the commit, end LSN)
    for i, size in enumerate(sizes):
        tracker.begin()
        for _ in range(size):
            tracker.produced()
        commits.append((tracker.inflight, Lsn(1000 * (i + 1))))
        tracker.commit(commits[-1][1])
    total = sum(sizes)
    reports = [*data.draw(st.permutations(range(total))),
               *data.draw(st.lists(st.integers(min_value=-2, max_value=total + 2), max_size=5))]
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(reports)),
                                     max_size=6)))
    seen: set[int] = set()
    start = 0
    for end in [*cuts, len(reports)]:
        batch = reports[start:end]
        start = max(start, end)
        tracker.delivered_all(batch)
        seen.update(batch)
        low = next((seq for seq in range(total) if seq not in seen), total)
        confirmed = max([Lsn(10), *(lsn for before, lsn in commits if before <= low)])
        assert (tracker.confirmed, tracker.inflight) == (confirmed, total - low)
    assert tracker.confirmed == Lsn(1000 * len(sizes)) and tracker.idle


def _state(tracker: AckTracker) -> tuple[int, ...]:
    return (int(tracker.confirmed), tracker.inflight, tracker.low, tracker.delivered_count,
            tracker.pending_commits, tracker.next_token)


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=10),
       data=st.data())
def test_a_run_registered_at_once_is_the_same_as_one_token_at_a_time(
    runs: list[int], data: st.DataObject
) -> None:
    one, many = AckTracker(Lsn(100)), AckTracker(Lsn(100))
    produced: list[int] = []
    for i, run in enumerate(runs):
        one.begin()
        many.begin()
        first = many.next_token
        tokens = [one.produced() for _ in range(run)]
        assert many.produced_many(run) == first + run == one.next_token
        assert tokens == list(range(first, first + run))
        produced += tokens
        if data.draw(st.booleans()):
            one.commit(Lsn(1000 * (i + 1)))
            many.commit(Lsn(1000 * (i + 1)))
        reports = data.draw(st.lists(st.sampled_from(produced), unique=True)) if produced else []
        # A report for a token not handed out yet is an unknown one: ignored by both.
        for token in [*reports, many.next_token]:
            one.delivered(token)
            many.delivered(token)
        assert _state(many) == _state(one)
        for token in produced:
            assert many.acknowledged(token) == one.acknowledged(token)


def test_a_negative_run_is_refused() -> None:
    tracker = AckTracker()
    tracker.produced_many(2)
    with pytest.raises(ValueError, match="negative"):
        tracker.produced_many(-1)
    assert tracker.next_token == 2
