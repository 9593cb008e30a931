"""``doctor --exactly-once``: the checks of exactly-once mode, from gathered facts (pure).

Owns what is judged - the checkpoint topic's shape, the checkpoint against the slot and
the server, whether ``read_committed`` consumers see what the slot was confirmed for, and
the hints for the transactional.id's ACLs - as values in, Checks out.
The facts are gathered by ops/doctor/gather_exactly_once.py. Imports no driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_relay.errors import CheckpointCorrupt, CheckpointMismatch
from cdc_relay.model import Lsn
from cdc_relay.ops.verdicts import Check, Verdict
from cdc_relay.sink.transactions import CheckpointViews
from cdc_relay.wal.exactly_once.checkpoint import Checkpoint, choose, committed_view_behind


@dataclass(frozen=True, slots=True)
class ExactlyOnceFacts:
    """What doctor found for exactly-once mode (None where it could not look)."""

    system_id: str
    slot: str
    topic: str
    transactional_id: str
    topic_shape: tuple[int, dict[str, str]] | None  # partitions, config; None = missing
    topic_problems: list[str]
    records: list[tuple[bytes | None, bytes | None]]
    slot_confirmed: Lsn | None
    server_lsn: Lsn
    views: CheckpointViews | None = None  # both readings of the topic (None: not read)


def exactly_once_checks(facts: ExactlyOnceFacts) -> list[Check]:
    """The checkpoint topic, the checkpoint itself, its committed view, the transactional.id's ACLs."""
    return [_topic_check(facts), _checkpoint_check(facts), _committed_view_check(facts),
            _acl_hint(facts)]


def _topic_check(facts: ExactlyOnceFacts) -> Check:
    if facts.topic_shape is None:
        return Check("checkpoint topic", Verdict.WARN, f"{facts.topic} does not exist yet",
                     "the relay creates it on start (1 partition, cleanup.policy=compact) if it "
                     "may CREATE topics; otherwise create it so")
    if facts.topic_problems:
        return Check("checkpoint topic", Verdict.FAIL,
                     f"{facts.topic}: {'; '.join(facts.topic_problems)}",
                     "use a topic with 1 partition and cleanup.policy=compact (--checkpoint-topic), "
                     f"e.g. kafka-configs --alter --entity-type topics --entity-name {facts.topic} "
                     "--add-config cleanup.policy=compact")
    return Check("checkpoint topic", Verdict.PASS,
                 f"{facts.topic}: 1 partition, cleanup.policy=compact")


def _checkpoint_check(facts: ExactlyOnceFacts) -> Check:
    name = "checkpoint"
    try:
        checkpoint = choose(facts.records, system_id=facts.system_id, slot=facts.slot)
    except CheckpointMismatch as exc:
        return Check(name, Verdict.FAIL, str(exc).split(": skipping")[0],
                     "if this cluster really replaced the other, start once with --reset-checkpoint")
    except CheckpointCorrupt as exc:
        return Check(name, Verdict.FAIL, str(exc), "start once with --reset-checkpoint")
    if checkpoint is None:
        return Check(name, Verdict.PASS, "no checkpoint yet: the first run starts from the slot")
    return _placed(facts, checkpoint)


def _placed(facts: ExactlyOnceFacts, checkpoint: Checkpoint) -> Check:
    name, lsn = "checkpoint", checkpoint.lsn
    if lsn > facts.server_lsn:
        return Check(name, Verdict.FAIL,
                     f"checkpoint {lsn} is ahead of the server's WAL position {facts.server_lsn}: "
                     "this is not the cluster that wrote it (restored from a backup?) and new "
                     "transactions below it would be skipped",
                     "start once with --reset-checkpoint (then check the topics for gaps)")
    slot = facts.slot_confirmed
    if slot is None:
        return Check(name, Verdict.WARN, f"checkpoint {lsn}, but slot {facts.slot!r} does not exist",
                     f"cdc-relay init --slot {facts.slot}")
    where = (f"the slot is {int(lsn) - int(slot)} bytes behind it: a restart skips what is "
             "already in Kafka" if lsn > slot else "the slot is at or past it")
    partial = (f"; transaction at {checkpoint.partial_commit_lsn} split, "
               f"{checkpoint.partial_events} of its events in Kafka"
               if checkpoint.partial_commit_lsn is not None else "")
    return Check(name, Verdict.PASS, f"checkpoint {lsn}, slot at {slot}: {where}{partial}")


def _committed_view_check(facts: ExactlyOnceFacts) -> Check:
    name = "committed view"
    if facts.views is None:
        return Check(name, Verdict.SKIP, "not checked: the checkpoint topic was not read")
    behind = committed_view_behind(facts.views, system_id=facts.system_id, slot=facts.slot,
                                   confirmed=facts.slot_confirmed, fenced=False)
    if behind is not None:
        return Check(name, Verdict.FAIL, behind,
                     "those events are lost for read_committed consumers: check the broker's "
                     "transaction state (kafka-transactions describe) and republish them from "
                     "the outbox table")
    return Check(name, Verdict.PASS, "read_committed consumers see every checkpoint the slot "
                 "was confirmed for")


def _acl_hint(facts: ExactlyOnceFacts) -> Check:
    return Check("transactional.id", Verdict.PASS,
                 f"{facts.transactional_id} (system identifier {facts.system_id}, slot "
                 f"{facts.slot}); with ACLs the relay's principal needs WRITE and DESCRIBE on "
                 f"TransactionalId {facts.transactional_id}, IDEMPOTENT_WRITE on the cluster "
                 f"(older brokers), READ and WRITE on topic {facts.topic} (CREATE to have it "
                 "created) and WRITE on the event and dead-letter topics")
