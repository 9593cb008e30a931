"""``run --exactly-once`` on noida-db: every committed event once, atomic per PG transaction."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka import Producer

from cdc_relay.errors import BrokerError
from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.model import Lsn
from cdc_relay.pg.identity import system_identifier
from cdc_relay.sink.kafka.checkpoint import ensure_topic, read_views
from cdc_relay.wal.exactly_once.checkpoint import Checkpoint, checkpoint_key, choose
from tests.integration.eos_support import (
    READ_COMMITTED,
    assert_exactly_once,
    checkpoints,
    collect_exactly,
    start_eos_relay,
)
from tests.integration.wal_support import confirmed_flush, init_db, write_workload
from tests.support import KafkaCollector, run_cli, wait_for


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_committed_events_arrive_once_with_a_checkpoint_and_the_slot_follows(
        db: str, broker: ApacheKafka, topic_prefix: str, plugin: str) -> None:
    init_db(db, plugin=plugin)
    with start_eos_relay(db, broker.bootstrap, topic_prefix, plugin=plugin) as relay:
        expected = write_workload(db, transactions=30, seed=1)
        with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            messages = collect_exactly(collector, expected)
        assert_exactly_once(messages, expected)
        last_commit = max(expected.commit_lsn.values())
        wait_for(lambda: confirmed_flush(db) >= last_commit, timeout=20,
                 message="the slot confirmed past the last commit")
        assert relay.stop() == 0, relay.stderr
    assert checkpoints(messages), "no checkpoint record in the checkpoint topic"
    assert max(cp.lsn for cp in checkpoints(messages)) <= confirmed_flush(db)


def test_doctor_exactly_once_reports_the_checkpoint_topic_and_checkpoint(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    init_db(db)
    args = ("doctor", "--dsn", db, "--brokers", broker.bootstrap, "--exactly-once",
            "--checkpoint-topic", f"{topic_prefix}.checkpoints", "--format", "json")
    before = {c["name"]: c for c in orjson.loads(run_cli(*args).stdout)}
    assert before["checkpoint topic"]["verdict"] == "warn"  # not created yet
    with start_eos_relay(db, broker.bootstrap, topic_prefix) as relay:
        expected = write_workload(db, transactions=3, seed=2, rollback_every=0)
        wait_for(lambda: confirmed_flush(db) >= max(expected.commit_lsn.values()), timeout=20)
        assert relay.stop() == 0
    result = run_cli(*args)
    after = {c["name"]: c for c in orjson.loads(result.stdout)}
    assert after["checkpoint topic"]["verdict"] == "pass", result.stdout
    assert after["checkpoint"]["verdict"] == "pass" and "checkpoint 0/" in after["checkpoint"]["detail"]
    assert "TransactionalId cdc-relay." in after["transactional.id"]["detail"]


def test_another_clusters_checkpoint_is_refused_unless_reset(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    init_db(db)
    topic = f"{topic_prefix}.checkpoints"
    ensure_topic({"bootstrap.servers": broker.bootstrap}, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    foreign = Checkpoint("1234567890", "cdc_relay", Lsn.parse("FF/0"))
    producer.produce(topic, foreign.encode(), checkpoint_key(foreign.system_id, foreign.slot))
    assert producer.flush(10) == 0
    refused = start_eos_relay(db, broker.bootstrap, topic_prefix, wait=False)
    assert refused.proc.wait(60) == 2
    assert "another PostgreSQL cluster" in refused.stderr and "--reset-checkpoint" in refused.stderr
    assert "Traceback" not in refused.stderr
    with start_eos_relay(db, broker.bootstrap, topic_prefix, extra=("--reset-checkpoint",)) as relay:
        expected = write_workload(db, transactions=3, seed=5, rollback_every=0)
        with KafkaCollector(broker.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            assert_exactly_once(collect_exactly(collector, expected), expected)
        assert relay.stop() == 0


def test_a_slot_confirmed_past_a_checkpoint_read_committed_readers_miss_is_reported(
        db: str, broker: ApacheKafka, topic_prefix: str) -> None:
    """What issue 32 looked like from the broker (events confirmed, invisible to read_committed):
    doctor --exactly-once fails its "committed view" check and the relay's start-up logs it."""
    init_db(db)
    topic = f"{topic_prefix}.checkpoints"
    args = ("doctor", "--dsn", db, "--brokers", broker.bootstrap, "--exactly-once",
            "--checkpoint-topic", topic, "--format", "json")
    ensure_topic({"bootstrap.servers": broker.bootstrap}, topic)
    source = system_identifier(db), "cdc_relay"
    # A checkpoint the slot is already at, written in a transaction that did not commit.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": topic_prefix})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, Checkpoint(*source, Lsn(confirmed_flush(db))).encode(),
                     checkpoint_key(*source))
    producer.flush(10)
    producer.abort_transaction(10)
    result = run_cli(*args)
    view = {c["name"]: c for c in orjson.loads(result.stdout)}["committed view"]
    assert result.returncode != 0 and view["verdict"] == "fail", result.stdout
    assert "past checkpoint" in view["detail"] and "see no checkpoint of this source" in view["detail"]
    with start_eos_relay(db, broker.bootstrap, topic_prefix) as relay:
        [line] = [line for line in relay.stderr.splitlines() if "committed view" in line]
        assert "ERROR" in line and "the slot is confirmed at" in line
        assert relay.stop() == 0, relay.stderr


def test_the_checkpoint_read_waits_for_another_sources_open_transaction(
        broker: ApacheKafka, topic_prefix: str) -> None:
    """A committed checkpoint behind another source's open transaction is not missed: the
    read waits until the last stable offset reaches the end of the log (or says so)."""
    topic = f"{topic_prefix}.checkpoints"
    settings = {"bootstrap.servers": broker.bootstrap}
    ensure_topic(settings, topic)
    other = Producer({**settings, "transactional.id": f"{topic_prefix}-other"})
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(topic, b"{}", b"99/other")
    other.flush(10)  # open, before ours
    ours = Producer({**settings, "transactional.id": f"{topic_prefix}-ours"})
    ours.init_transactions(10)
    ours.begin_transaction()
    ours.produce(topic, Checkpoint("73", "s", Lsn(500)).encode(), checkpoint_key("73", "s"))
    ours.commit_transaction(10)
    with pytest.raises(BrokerError, match="last stable offset stays at 0, behind the end of its log"):
        read_views(settings, topic, timeout=0.5)
    other.commit_transaction(10)
    views = read_views(settings, topic, timeout=10)
    assert views.stable_offset >= 4 and len(views.logged) == 2
    assert choose(views.committed_records(), system_id="73", slot="s") == Checkpoint("73", "s", Lsn(500))
