"""The transactional Kafka sink of exactly-once mode: KafkaSink plus Kafka transactions.

Owns the transactional producer's settings (``transactional.id`` from the source,
``transaction.timeout.ms``), the calls ``init_transactions`` / ``begin_transaction`` /
``commit_transaction`` / ``abort_transaction``, writing the checkpoint record as the last
message of each transaction, and the classification of their errors into
``TxnErrorKind`` (sink/transactions.py). Produce, poll, warm-up, close and the delivery
reports are KafkaSink's (sink/kafka/sink.py). It must not decide when a transaction closes
or what to do about a failure: wal/exactly_once/mode.py does.

librdkafka's rules it follows: ``init_transactions`` once per producer; after an
abortable error ``abort_transaction`` and carry on with the same producer; after a fatal
one (fenced included) the producer is dead. Aborting purges the transaction's
messages; their purge reports are swallowed (like those of ``close()``), so an abort
never looks like a failed delivery. Aborting before the first AddPartitionsToTxn
completed can go fatal (librdkafka#4849): that, too, is FATAL - a new producer.

A broker connection lost while a transaction is open makes that transaction doubtful
(``doubt``): a broker that restarts may come back without its state (a memory-only
Kafka-protocol broker does: a later commit "succeeds" and the records are gone), so the
relay aborts it and replays rather than commit it. Against Apache Kafka this costs one
replay of one transaction per connection loss.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import AccessRefused, ConfigError
from cdc_relay.sink.base import DeliveryHandler
from cdc_relay.sink.kafka.checkpoint import ensure_topic, read_views
from cdc_relay.sink.kafka.client import ACL_DOC, describe_error, producer_settings
from cdc_relay.sink.kafka.sink import KafkaSink
from cdc_relay.sink.transactions import CheckpointViews, TransactionalSink, TxnError, TxnErrorKind

_log = logging.getLogger("cdc_relay.sink.kafka")
_CONNECTION_LOST = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
# The broker refused the transactional id or the cluster ACL: retrying cannot fix it.
_REFUSED_CODES = frozenset({KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                            KafkaError.CLUSTER_AUTHORIZATION_FAILED})
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                           KafkaError.INVALID_PRODUCER_EPOCH})


@dataclass(frozen=True, slots=True)
class TxnSinkSettings:
    """The transactional part of the sink: who we are, where checkpoints go, how long a txn may take."""

    transactional_id: str
    checkpoint_topic: str = "cdc-relay.checkpoints"
    transaction_timeout_ms: int = 60_000


def classify_txn(error: KafkaError) -> TxnErrorKind:
    """Map a librdkafka error of a transaction call to what the relay must do."""
    if error.code() in _FENCED_CODES:
        return TxnErrorKind.FENCED
    if error.fatal():
        return TxnErrorKind.FATAL
    if error.txn_requires_abort():
        return TxnErrorKind.ABORTABLE
    if error.retriable():
        return TxnErrorKind.RETRIABLE
    return TxnErrorKind.FATAL


def transactional_config(config: KafkaConfig, txn: TxnSinkSettings) -> KafkaConfig:
    """``config`` with the transactional settings; ConfigError for settings that contradict them."""
    user = config.producer_config
    if "transactional.id" in user:
        raise ConfigError("--producer-config transactional.id is set by --exactly-once itself "
                          "(from the system identifier and the slot): remove it")
    if user.get("enable.idempotence", "true").lower() not in ("true", "1"):
        raise ConfigError("--exactly-once needs enable.idempotence=true: remove that --producer-config")
    settings = {"transaction.timeout.ms": str(txn.transaction_timeout_ms), **user,
                "transactional.id": txn.transactional_id}
    return replace(config, producer_config=settings)


def _txn_error(exc: KafkaException, what: str) -> TxnError:
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return TxnError(TxnErrorKind.FATAL, f"{what}: {exc}")
    return TxnError(classify_txn(error), f"{what}: {describe_error(error)}")


class TransactionalKafkaSink(KafkaSink):
    """A KafkaSink whose producer is transactional; see the module docstring."""

    def __init__(self, config: KafkaConfig, txn: TxnSinkSettings, on_delivery: DeliveryHandler, *,
                 generation: int = 1, logger: logging.Logger | None = None) -> None:
        self._txn_config = txn
        self._txn_kafka = transactional_config(config, txn)
        super().__init__(self._txn_kafka, on_delivery, generation=generation, logger=logger)
        self._initialized = False
        self._in_txn = False
        self._checkpoint_written = False  # in the open transaction (a retried commit keeps it)
        self._doubt: str | None = None  # why the open transaction cannot be trusted

    @property
    def initialized(self) -> bool:
        return self._initialized

    @property
    def in_transaction(self) -> bool:
        return self._in_txn

    @property
    def doubt(self) -> str | None:
        """Set when a broker connection was lost while the open transaction was open."""
        return self._doubt

    def _on_error(self, error: KafkaError) -> None:
        if self._in_txn and self._doubt is None and error.code() in _CONNECTION_LOST:
            self._doubt = f"broker connection lost during the transaction ({describe_error(error)})"
        super()._on_error(error)

    def init_transactions(self, timeout: float) -> None:
        """Fence older producers of this transactional.id; abort what they left open. The
        broker refusing the transactional id (or the cluster ACL) is AccessRefused (exit 6)."""
        try:
            self._live().init_transactions(timeout)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in _REFUSED_CODES:
                tid = self._txn_config.transactional_id
                raise AccessRefused(
                    f"Kafka refused the relay's transactional id {tid}: grant WRITE on "
                    f"TRANSACTIONAL_ID {tid} to the relay's user ({ACL_DOC}) "
                    f"[{describe_error(error)}]") from exc
            raise _txn_error(exc, "init_transactions failed") from exc
        self._initialized = True

    def read_checkpoint_views(self, timeout: float) -> CheckpointViews:
        """Ensure the checkpoint topic (create or check it), then read it back (both views)."""
        settings = producer_settings(self._txn_kafka)
        ensure_topic(settings, self._txn_config.checkpoint_topic, min(timeout, 15.0))
        return read_views(settings, self._txn_config.checkpoint_topic, timeout)

    def begin_transaction(self) -> None:
        try:
            self._live().begin_transaction()
        except KafkaException as exc:
            raise _txn_error(exc, "begin_transaction failed") from exc
        self._in_txn = True
        self._checkpoint_written = False
        self._doubt = None

    def commit_transaction(self, key: bytes, checkpoint: bytes, timeout: float) -> None:
        """Produce the checkpoint record, then commit (which flushes everything first)."""
        producer = self._live()
        deadline = time.monotonic() + timeout
        while not self._checkpoint_written:
            try:
                producer.produce(self._txn_config.checkpoint_topic, checkpoint, key)
                self._checkpoint_written = True
            except BufferError:
                if time.monotonic() > deadline:
                    raise TxnError(TxnErrorKind.RETRIABLE, "producer queue full") from None
                self.poll(0.05)
            except KafkaException as exc:
                raise _txn_error(exc, "cannot produce the checkpoint record") from exc
        try:
            producer.commit_transaction(max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            # Still open: retry the commit (retriable) or abort it (abortable).
            error = exc.args[0] if exc.args else None
            what = "commit_transaction failed"
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                # An event topic refused is named by its delivery report first; at the
                # commit it is the checkpoint topic (AddPartitionsToTxn names no topic).
                topic = self._txn_config.checkpoint_topic
                what = (f"not authorized to write to a topic of the transaction: grant WRITE on "
                        f"TOPIC {topic} (the checkpoint topic) to the relay's user ({ACL_DOC})")
            raise _txn_error(exc, what) from exc
        finally:
            self._reports.hand_over()  # the commit's flush served reports, as a poll
        self._in_txn = False

    def abort_transaction(self, timeout: float) -> None:
        """Abort; the purge reports of its messages never reach the handler."""
        producer = self._live()
        self._open = False  # KafkaSink drops (counts) failed reports while closed
        try:
            producer.abort_transaction(timeout)
            deadline = time.monotonic() + timeout
            while len(producer) and time.monotonic() < deadline:
                producer.poll(0.01)
        except KafkaException as exc:
            raise _txn_error(exc, "abort_transaction failed") from exc
        finally:
            self._reports.hand_over()
            self._open = True
        self._in_txn = False

    def _live(self) -> Producer:
        producer = self._producer
        if producer is None:
            raise TxnError(TxnErrorKind.FATAL, f"Kafka producer generation {self.generation} is closed")
        return producer


class TransactionalSinkFactory(Protocol):
    """A SinkFactory whose sinks are TransactionalKafkaSinks."""

    def __call__(self, on_delivery: DeliveryHandler) -> TransactionalKafkaSink: ...


def transactional_sink_factory(config: KafkaConfig, txn: TxnSinkSettings, *,
                               logger: logging.Logger | None = None) -> TransactionalSinkFactory:
    """A SinkFactory of TransactionalKafkaSinks, numbering their generations."""
    transactional_config(config, txn)  # ConfigError now, not at the first producer
    log = logger or _log
    generation = 0

    def build(on_delivery: DeliveryHandler) -> TransactionalKafkaSink:
        nonlocal generation
        generation += 1
        return TransactionalKafkaSink(config, txn, on_delivery, generation=generation, logger=log)

    return build


def _conforms(sink: TransactionalKafkaSink) -> TransactionalSink:
    return sink
