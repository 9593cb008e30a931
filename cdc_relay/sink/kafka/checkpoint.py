"""The checkpoint topic of exactly-once mode, on Kafka: create or check it, read it back.

Owns the topic's required shape - one partition (the records of one source stay in
order), ``cleanup.policy=compact`` alone (compaction keeps the latest record per source
however old; a ``delete`` policy would expire the checkpoint of an idle relay and make it
replay), created with the broker's default replication factor - and reading it back
twice: its committed records with a ``read_committed`` consumer up to the last stable
offset, and all its records (``read_uncommitted``) to compare with. It must not
interpret the records (cdc_relay/wal/exactly_once/checkpoint.py does) nor write them (the transactional
producer does, inside each transaction: sink/kafka/txn.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.cimpl import NewTopic

from cdc_relay.errors import BrokerError, ConfigError, mask_secrets
from cdc_relay.sink.kafka.client import ACL_DOC, _MaskingLogger, exception_text
from cdc_relay.sink.transactions import CheckpointViews, Record

_log = logging.getLogger("cdc_relay.sink.checkpoint")

REQUIRED_CONFIG = {"cleanup.policy": "compact"}
# The readers assign the partition and commit nothing, but librdkafka looks the group's
# coordinator up all the same: with ACLs that needs DESCRIBE on this group.
CHECKPOINT_GROUP = "cdc-relay-checkpoint-reader"
# librdkafka settings that are about producing only: a consumer or admin client refuses them.
_PRODUCER_ONLY = ("acks", "enable.idempotence", "linger.ms", "queue.buffering.", "compression.",
                  "message.timeout.ms", "transactional.id", "transaction.timeout.ms", "partitioner",
                  "batch.", "retries", "retry.backoff", "delivery.timeout.ms", "sticky.")


def client_settings(producer_settings: dict[str, str]) -> dict[str, Any]:
    """The connection and security settings of the producer, for an admin client or consumer
    (with a masking logger: librdkafka's lines never carry a secret)."""
    settings: dict[str, Any] = {k: v for k, v in producer_settings.items()
                                if not k.startswith(_PRODUCER_ONLY) and k != "client.id"}
    settings["logger"] = _MaskingLogger(_log, demote=True)
    return settings


def topic_problems(partitions: int, config: dict[str, str]) -> list[str]:
    """What is wrong with an existing checkpoint topic (empty when it fits)."""
    problems = []
    if partitions != 1:
        problems.append(f"it has {partitions} partitions, not 1")
    for key, wanted in REQUIRED_CONFIG.items():
        if config.get(key) != wanted:
            problems.append(f"{key}={config.get(key)}, not {wanted}")
    return problems


def describe_topic(settings: dict[str, str], topic: str,
                   timeout: float) -> tuple[int, dict[str, str]] | None:
    """``(partitions, config)`` of ``topic``, or None if it does not exist."""
    admin = AdminClient(client_settings(settings))
    try:
        # All topics: a metadata request naming the topic could auto-create it (delete policy).
        metadata = admin.list_topics(timeout=timeout)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return None
        resource = ConfigResource("topic", topic)
        configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
        return len(found.partitions), {name: str(entry.value) for name, entry in configs.items()}
    except KafkaException as exc:
        if _forbidden(exc):
            raise BrokerError(f"not authorized to describe the configs of the checkpoint topic "
                              f"{topic}: grant DESCRIBE_CONFIGS on TOPIC {topic} to the relay's "
                              f"user ({ACL_DOC}) [{exception_text(exc)}]") from exc
        raise BrokerError(f"cannot describe the checkpoint topic {topic!r}: {exception_text(exc)} "
                          "(check --brokers and that the relay may describe topics)") from exc


def _forbidden(exc: KafkaException) -> bool:
    """Whether the broker refused a topic ACL (not a cluster or login refusal)."""
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _read_refused(topic: str, reason: str) -> BrokerError:
    return BrokerError(f"not authorized to read the checkpoint topic {topic}: grant READ on TOPIC "
                       f"{topic} to the relay's user ({ACL_DOC}) [{reason}]")


def ensure_topic(settings: dict[str, str], topic: str, timeout: float = 15.0) -> None:
    """Create the checkpoint topic if missing; raise ConfigError if it exists with a wrong shape."""
    found = describe_topic(settings, topic, timeout)
    if found is None:
        admin = AdminClient(client_settings(settings))
        future = admin.create_topics([NewTopic(topic, 1, -1, config=dict(REQUIRED_CONFIG))],
                                     request_timeout=timeout)[topic]
        try:
            future.result(timeout)
            _log.info("created the checkpoint topic %s (1 partition, cleanup.policy=compact)", topic)
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise BrokerError(f"cannot create the checkpoint topic {topic!r}: "
                                  f"{exception_text(exc)} (create it with 1 partition and "
                                  "cleanup.policy=compact, or grant CREATE)") from exc
        found = describe_topic(settings, topic, timeout)
        if found is None:
            raise BrokerError(f"the checkpoint topic {topic!r} was created but is not visible")
    problems = topic_problems(*found)
    if problems:
        raise ConfigError(f"the checkpoint topic {topic!r} does not fit: {'; '.join(problems)} "
                          "(use a topic with 1 partition and cleanup.policy=compact: pass another "
                          "--checkpoint-topic, or fix it with kafka-configs --alter)")


def read_views(settings: dict[str, str], topic: str, timeout: float, *,
               wait: bool = True) -> CheckpointViews:
    """The checkpoint topic as its log holds it and as ``read_committed`` consumers see it.

    First every record up to the end of the log (``read_uncommitted``); then, once the
    last stable offset has reached that end - a transaction open there (another source's
    relay, or this one's before ``init_transactions``) ends within its interval - every
    committed record up to it: a committed record of ours behind another source's open
    transaction is never missed. wal/exactly_once/checkpoint.py's ``committed_view_behind`` compares
    the two readings. A last stable offset that stays behind is a BrokerError naming it.
    Without ``wait`` (doctor, beside a running relay whose transaction may be long) the
    committed records are read up to the last stable offset as it is.
    """
    deadline = time.monotonic() + timeout
    logged, end = _read(settings, topic, deadline, "read_uncommitted")
    committed, stable = _read(settings, topic, deadline, "read_committed",
                              at_least=end if wait else 0)
    return CheckpointViews(committed=committed, logged=logged, stable_offset=stable)


def _read(settings: dict[str, str], topic: str, deadline: float, isolation: str,
          at_least: int = 0) -> tuple[list[Record], int]:
    """The records of the topic's partition up to where a consumer of ``isolation`` stops
    (``read_committed``: the last stable offset, awaited until it reaches ``at_least``),
    with that offset."""
    consumer = Consumer({**client_settings(settings), "group.id": CHECKPOINT_GROUP,
                         "isolation.level": isolation, "enable.partition.eof": True,
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        partition = TopicPartition(topic, 0)
        high = _end_offset(consumer, partition, deadline, at_least)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        records: list[Record] = []
        while high > 0:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the checkpoint topic {topic!r} could not be read ({isolation}) to offset "
                    f"{high} in time; retrying")
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is None:
                records.append((message.offset() or 0, message.key(), message.value()))
            elif error.code() == KafkaError._PARTITION_EOF:
                if consumer.position([partition])[0].offset >= high:
                    break
            elif error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise _read_refused(topic, mask_secrets(error.str()))
            elif error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                raise BrokerError(f"not authorized to use the consumer group {CHECKPOINT_GROUP} "
                                  f"that reads the checkpoint topic {topic}: grant DESCRIBE on "
                                  f"GROUP {CHECKPOINT_GROUP} to the relay's user ({ACL_DOC}) "
                                  f"[{mask_secrets(error.str())}]")
            else:
                raise BrokerError(f"cannot read the checkpoint topic {topic!r}: "
                                  f"{mask_secrets(error.str())}")
        return records, high
    except KafkaException as exc:
        if _forbidden(exc):
            raise _read_refused(topic, exception_text(exc)) from exc
        raise BrokerError(f"cannot read the checkpoint topic {topic!r}: {exception_text(exc)}") from exc
    finally:
        consumer.close()


def _end_offset(consumer: Consumer, partition: TopicPartition, deadline: float,
                at_least: int) -> int:
    """Where ``consumer`` stops reading (its isolation level's end), once it is ``at_least``."""
    while True:
        _, high = consumer.get_watermark_offsets(
            partition, timeout=max(0.1, deadline - time.monotonic()), cached=False)
        if high >= at_least:
            return int(high)
        if time.monotonic() > deadline:
            raise BrokerError(
                f"the checkpoint topic {partition.topic!r}'s last stable offset stays at {high}, "
                f"behind the end of its log at {at_least}: a transaction open there blocks "
                "read_committed readers until it ends (transaction.timeout.ms at the latest); "
                "retrying")
        time.sleep(0.05)
