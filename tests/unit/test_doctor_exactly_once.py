"""doctor --exactly-once's pure checks."""

from __future__ import annotations

from dataclasses import replace

from cdc_relay.model import Lsn
from cdc_relay.ops.doctor.checks import Verdict
from cdc_relay.ops.doctor.exactly_once import ExactlyOnceFacts, exactly_once_checks
from cdc_relay.wal.checkpoint import Checkpoint, checkpoint_key

FACTS = ExactlyOnceFacts(system_id="73", slot="s", topic="cp", transactional_id="cdc-relay.73.s",
                         topic_shape=(1, {"cleanup.policy": "compact"}), topic_problems=[],
                         records=[], slot_confirmed=Lsn(100), server_lsn=Lsn(1000))


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
