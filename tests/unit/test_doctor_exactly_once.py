"""doctor --exactly-once's pure checks."""

from __future__ import annotations

from dataclasses import replace

from cdc_relay.model import Lsn
from cdc_relay.ops.doctor.exactly_once import ExactlyOnceFacts, exactly_once_checks
from cdc_relay.ops.verdicts import Verdict
from cdc_relay.sink.transactions import CheckpointViews
from cdc_relay.wal.exactly_once.checkpoint import Checkpoint, checkpoint_key

FACTS = ExactlyOnceFacts(system_id="73", slot="s", topic="cp", transactional_id="cdc-relay.73.s",
                         topic_shape=(1, {"cleanup.policy": "compact"}), topic_problems=[],
                         records=[], slot_confirmed=Lsn(100), server_lsn=Lsn(1000),
                         views=CheckpointViews([], [], 0))


def _verdicts(facts: ExactlyOnceFacts) -> dict[str, Verdict]:
    return {c.name: c.verdict for c in exactly_once_checks(facts)}


def _with(cp: Checkpoint) -> ExactlyOnceFacts:
    return replace(FACTS, records=[(checkpoint_key(cp.system_id, cp.slot), cp.encode())])


def test_a_fresh_setup_passes_and_names_the_transactional_id() -> None:
    checks = exactly_once_checks(FACTS)
    assert all(c.verdict is Verdict.PASS for c in checks)
    assert "TransactionalId cdc-relay.73.s" in checks[-1].detail


def test_a_missing_topic_warns_and_a_misshapen_one_fails() -> None:
    assert _verdicts(replace(FACTS, topic_shape=None))["checkpoint topic"] is Verdict.WARN
    bad = replace(FACTS, topic_shape=(3, {}), topic_problems=["it has 3 partitions, not 1"])
    assert _verdicts(bad)["checkpoint topic"] is Verdict.FAIL


def test_the_checkpoint_is_placed_against_slot_and_server() -> None:
    ahead_of_slot = exactly_once_checks(_with(Checkpoint("73", "s", Lsn(500))))[1]
    assert ahead_of_slot.verdict is Verdict.PASS and "skips" in ahead_of_slot.detail
    restored = _with(Checkpoint("73", "s", Lsn(5000)))  # beyond the server's WAL
    assert _verdicts(restored)["checkpoint"] is Verdict.FAIL
    foreign = _with(Checkpoint("99", "s", Lsn(500)))
    check = exactly_once_checks(foreign)[1]
    assert check.verdict is Verdict.FAIL and check.fix and "--reset-checkpoint" in check.fix


def test_the_committed_view_fails_when_the_slot_passed_a_checkpoint_it_does_not_show() -> None:
    key = checkpoint_key("73", "s")
    shown = [(0, key, Checkpoint("73", "s", Lsn(50)).encode())]
    hidden = [*shown, (1, key, Checkpoint("73", "s", Lsn(90)).encode())]
    check = {c.name: c for c in exactly_once_checks(replace(
        FACTS, records=[r[1:] for r in shown], views=CheckpointViews(shown, hidden, 2)))}
    assert check["committed view"].verdict is Verdict.FAIL
    assert "past checkpoint 0/5A" in check["committed view"].detail
    fine = replace(FACTS, views=CheckpointViews(hidden, hidden, 2))
    assert _verdicts(fine)["committed view"] is Verdict.PASS
    assert _verdicts(replace(FACTS, views=None))["committed view"] is Verdict.SKIP  # not read
