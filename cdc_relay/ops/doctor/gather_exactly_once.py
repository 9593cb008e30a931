"""Gathers the facts ``doctor --exactly-once`` judges (ops/doctor/exactly_once.py).

Reads, never writes: the system identifier (IDENTIFY_SYSTEM), the slot's confirmed LSN
and the server's WAL position, the checkpoint topic's shape and its records - committed
and all, read after the slot (a checkpoint committed later than the slot was read is
then seen committed too).
It never creates a producer with the relay's transactional.id: that would fence the
running relay.
"""

from __future__ import annotations

import psycopg

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import RelayError
from cdc_relay.model import Lsn
from cdc_relay.ops.doctor.exactly_once import ExactlyOnceFacts, exactly_once_checks
from cdc_relay.ops.verdicts import Check, Verdict
from cdc_relay.pg.db import open_connection
from cdc_relay.pg.identity import system_identifier
from cdc_relay.sink.kafka.checkpoint import describe_topic, read_views, topic_problems
from cdc_relay.sink.kafka.client import producer_settings
from cdc_relay.wal.exactly_once.checkpoint import transactional_id


def run_exactly_once_checks(dsn: str, slot: str, kafka: KafkaConfig | None, topic: str,
                            timeout: float = 10.0) -> list[Check]:
    """The exactly-once checks; one failing Check when the facts cannot be gathered."""
    if kafka is None:
        return [Check("exactly-once", Verdict.SKIP, "not checked: pass --brokers HOST:PORT")]
    try:
        facts = _gather(dsn, slot, kafka, topic, timeout)
    except (RelayError, psycopg.Error) as exc:
        return [Check("exactly-once", Verdict.FAIL, f"cannot gather the facts: {exc}")]
    return exactly_once_checks(facts)


def _gather(dsn: str, slot: str, kafka: KafkaConfig, topic: str, timeout: float) -> ExactlyOnceFacts:
    system_id = system_identifier(dsn)
    with open_connection(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text, (SELECT confirmed_flush_lsn::text"
                           " FROM pg_replication_slots WHERE slot_name = %s)", (slot,)).fetchone()
    assert row is not None
    settings = producer_settings(kafka)
    shape = describe_topic(settings, topic, timeout)
    # After the slot; not waiting for the running relay's open transaction to end.
    views = read_views(settings, topic, timeout, wait=False) if shape is not None else None
    return ExactlyOnceFacts(
        system_id=system_id, slot=slot, topic=topic,
        transactional_id=transactional_id(system_id, slot), topic_shape=shape,
        topic_problems=topic_problems(*shape) if shape is not None else [],
        records=views.committed_records() if views is not None else [],
        slot_confirmed=Lsn.parse(row[1]) if row[1] else None, server_lsn=Lsn.parse(row[0]),
        views=views)
