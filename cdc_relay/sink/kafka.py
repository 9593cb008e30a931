"""The Kafka sink: confluent-kafka's Producer behind the Sink protocol.

This module (with the rest of ``sink/``) is the only place that imports confluent_kafka.
It owns the producer defaults, the translation of librdkafka errors into the three
``ErrorKind``\\ s the loops act on, and the producer's lifecycle. It must not decide what
to do about a failure (dead-letter, replay, count an attempt): the loops do that.

Producer defaults (SPEC §4), each overridable with ``--producer-config`` (the user wins;
weakening acks or idempotence is logged as a warning):

* ``acks=all``, ``enable.idempotence=true``: no loss, no duplicates or reordering from
  the producer's own retries.
* ``message.timeout.ms`` from KafkaConfig (30 s, not librdkafka's 300 s: a timed-out
  message means "new producer, replay" - FIELD-NOTES pitfall 1).
* ``linger.ms=5`` (librdkafka's own default): batches fill under load at the cost of at
  most 5 ms latency at low rates; ``linger.ms=0`` trades throughput for latency.
* ``queue.buffering.max.messages=100000``, ``queue.buffering.max.kbytes=65536`` (64 MB
  instead of 1 GB): memory stays bounded, a full queue is QueueFull (backpressure).
* ``compression.type=none``, ``client.id=cdc-relay``.

Error classification (delivery reports, and KafkaException raised by ``produce()``):

=============================================================  ===========  ==============
error                                                          kind         why
=============================================================  ===========  ==============
``err.fatal()``, ``_FATAL``, ``_FENCED``                       FATAL        producer dead
UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE_NUMBER,             FATAL        idempotence
INVALID_PRODUCER_EPOCH, PRODUCER_FENCED,                                    state lost or
INVALID_PRODUCER_ID_MAPPING, ``_GAPLESS_GUARANTEE``                         fenced
``_MSG_TIMED_OUT``, ``_TIMED_OUT``, ``_TIMED_OUT_QUEUE``       FATAL        pitfall 1
``_PURGE_QUEUE``, ``_PURGE_INFLIGHT``, ``_DESTROY``            FATAL        dropped unsent
CLUSTER_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED,      FATAL        producer-wide
``_AUTHENTICATION``, ``_SSL``, INVALID_REQUIRED_ACKS,                       configuration
UNSUPPORTED_VERSION, ``_STATE``
MSG_SIZE_TOO_LARGE, INVALID_MSG, INVALID_MSG_SIZE,             PERMANENT    this message:
RECORD_LIST_TOO_LARGE, INVALID_RECORD, INVALID_TIMESTAMP,                   dead-letter it
UNSUPPORTED_FOR_MESSAGE_FORMAT, POLICY_VIOLATION,
TOPIC_EXCEPTION (illegal topic), ``_UNKNOWN_TOPIC``,
TOPIC_AUTHORIZATION_FAILED, ``_UNKNOWN_PARTITION``,
``_INVALID_ARG``, ``_BAD_MSG``
any other error with ``err.retriable()``                       RETRIABLE    transient
anything else                                                  FATAL        unknown
=============================================================  ===========  ==============

Rows are checked top to bottom. Dead-lettering is a decision about the event, so it is
made only for errors known to be about the message or its topic (the topic name comes
from event data: a missing or forbidden topic must not stall every other event). An
error nobody classified replays with a new producer instead: loud, but no event is
diverted for a reason we do not understand. ``BufferError`` / ``_QUEUE_FULL`` from
``produce()`` is QueueFull.

``fatal_error`` (not in the Sink protocol; read with ``getattr``) is set by a fatal
error from ``error_cb`` - so it is noticed with nothing in flight - and by a report or
``produce()`` error that is ``err.fatal()``, ``_FATAL`` or ``_FENCED``. A timed-out
message is FATAL for that message only: the loop replaces the producer anyway.

Generations: every sink built by the factory owns one Producer and carries the
factory's generation number (1, 2, ...). Its delivery callbacks are bound to it, so a
report can only reach the handler while *this* sink is polled. ``close()`` flushes
(acks found then are reported as usual), then purges what is left and swallows the
purge reports: after ``close()`` no failure of that generation reaches the handler -
every undelivered token of it is simply "not delivered" (a counted log line says how
many), so a discarded producer never triggers a second restart (FIELD-NOTES pitfall 2).

Secrets: settings are logged through ``describe_settings`` (secret-valued keys masked)
and every librdkafka line and error text passes through ``mask_secrets``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import BrokerError, ConfigError, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.base import (
    Delivery,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    ProduceRejected,
    QueueFull,
    Sink,
    SinkFactory,
)

_log = logging.getLogger("cdc_relay.sink.kafka")

DEFAULT_SETTINGS: dict[str, str] = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "queue.buffering.max.messages": "100000",
    "queue.buffering.max.kbytes": "65536",
    "compression.type": "none",
    "client.id": "cdc-relay",
}

_E = KafkaError
_PERMANENT_CODES = frozenset({
    _E.MSG_SIZE_TOO_LARGE, _E.INVALID_MSG, _E.INVALID_MSG_SIZE, _E.RECORD_LIST_TOO_LARGE,
    _E.INVALID_RECORD, _E.INVALID_TIMESTAMP, _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    _E.POLICY_VIOLATION, _E.TOPIC_EXCEPTION, _E._UNKNOWN_TOPIC, _E.TOPIC_AUTHORIZATION_FAILED,
    _E._UNKNOWN_PARTITION, _E._INVALID_ARG, _E._BAD_MSG,
})
_FATAL_CODES = frozenset({
    _E._FATAL, _E._FENCED, _E.UNKNOWN_PRODUCER_ID, _E.OUT_OF_ORDER_SEQUENCE_NUMBER,
    _E.INVALID_PRODUCER_EPOCH, _E.PRODUCER_FENCED, _E.INVALID_PRODUCER_ID_MAPPING,
    _E._GAPLESS_GUARANTEE, _E._MSG_TIMED_OUT, _E._TIMED_OUT, _E._TIMED_OUT_QUEUE,
    _E._PURGE_QUEUE, _E._PURGE_INFLIGHT, _E._DESTROY, _E.CLUSTER_AUTHORIZATION_FAILED,
    _E.SASL_AUTHENTICATION_FAILED, _E._AUTHENTICATION, _E._SSL, _E.INVALID_REQUIRED_ACKS,
    _E.UNSUPPORTED_VERSION, _E._STATE,
})
# Producer-wide: the producer can never deliver again, whatever the message.
_PRODUCER_DEAD_CODES = frozenset({_E._FATAL, _E._FENCED})
_SECRET_KEY_PARTS = ("password", "secret", "sasl.oauthbearer.config", "ssl.key.pem",
                     "ssl.keystore")


def classify(error: KafkaError) -> DeliveryError:
    """Map a librdkafka error to the ErrorKind the loops act on (module docstring table)."""
    code = error.code()
    if error.fatal():
        kind = ErrorKind.FATAL
    elif code in _PERMANENT_CODES:
        kind = ErrorKind.PERMANENT
    elif code in _FATAL_CODES:
        kind = ErrorKind.FATAL
    elif error.retriable():
        kind = ErrorKind.RETRIABLE
    else:
        kind = ErrorKind.FATAL
    return DeliveryError(kind, describe_error(error))


def describe_error(error: KafkaError) -> str:
    """``NAME: text`` of a librdkafka error, with secrets masked."""
    return mask_secrets(f"{error.name()}: {error.str()}")


def producer_settings(config: KafkaConfig) -> dict[str, str]:
    """The librdkafka properties of the relay's producer: defaults, then the user's."""
    settings = dict(DEFAULT_SETTINGS)
    settings["bootstrap.servers"] = config.brokers
    settings["message.timeout.ms"] = str(config.message_timeout_ms)
    settings.update(config.producer_config)
    return settings


def describe_settings(settings: dict[str, str]) -> str:
    """``key=value, ...`` for logs, secret-valued keys masked."""
    parts = []
    for key in sorted(settings):
        value = "***" if any(part in key for part in _SECRET_KEY_PARTS) else settings[key]
        parts.append(f"{key}={value}")
    return mask_secrets(", ".join(parts))


_DIGITS = re.compile(r"\d+")


class _MaskingLogger:
    """What confluent-kafka calls ``log(level, fmt, *args)`` on, masking secrets on the way.

    librdkafka's lines appear only while the producer is polled or flushed (FIELD-NOTES
    16). ``demote`` logs them at DEBUG: for probes whose failure is reported otherwise.
    """

    # librdkafka repeats a connection failure for every broker and retry (hundreds of
    # lines a minute while a broker is down): one line per kind of message per window.
    _WINDOW = 30.0

    def __init__(self, logger: logging.Logger, *, demote: bool = False) -> None:
        self._logger = logger
        self._demote = demote
        self._seen: dict[str, tuple[float, int]] = {}  # digit-free text -> (first, repeats)

    def log(self, level: int, msg: str, *args: Any) -> None:
        level = logging.DEBUG if self._demote else level
        if not self._logger.isEnabledFor(level):
            return
        text = mask_secrets(msg % args if args else msg)
        key = _DIGITS.sub("#", text)
        now = time.monotonic()
        first, repeats = self._seen.get(key, (0.0, 0))
        if now - first < self._WINDOW:
            self._seen[key] = (first, repeats + 1)
            return
        if len(self._seen) > 256:
            self._seen.clear()
        self._seen[key] = (now, 0)
        suffix = f" (and {repeats} similar line(s) in the last {self._WINDOW:g} s)" if repeats else ""
        self._logger.log(level, "%s%s", text, suffix)


def _new_producer(settings: dict[str, str], logger: logging.Logger, *, demote: bool = False,
                  error_cb: Callable[[KafkaError], None] | None = None) -> Producer:
    conf: dict[str, Any] = dict(settings)
    conf["logger"] = _MaskingLogger(logger, demote=demote)
    if error_cb is not None:
        conf["error_cb"] = error_cb
    try:
        return Producer(conf)
    except KafkaException as exc:
        raise ConfigError(
            f"invalid producer configuration: {_exception_text(exc)} "
            "(check --producer-config; see librdkafka's CONFIGURATION.md)"
        ) from exc


def _exception_text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return mask_secrets(error.str())
    return mask_secrets(str(exc))


def check_brokers(config: KafkaConfig, timeout: float) -> None:
    """Raise BrokerError (one line, cause and fix) unless a broker answers a metadata request.

    Uses the relay's own producer settings, so SASL/SSL problems show up here too.
    """
    producer = _new_producer(producer_settings(config), _log, demote=True)
    try:
        producer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerError(
            f"cannot reach Kafka at {mask_secrets(config.brokers)}: {_exception_text(exc)} "
            "(check --brokers, that the broker is running, and the security settings)"
        ) from exc
    finally:
        producer.close()


class KafkaSink:
    """One confluent-kafka Producer (one generation) as a Sink; see the module docstring."""

    def __init__(self, config: KafkaConfig, on_delivery: DeliveryHandler, *,
                 generation: int = 1, logger: logging.Logger | None = None) -> None:
        self.generation = generation
        self._log = logger or _log
        self._handler = on_delivery
        self._open = True
        self._delivered = 0  # reports handed to the handler (poll/flush return deltas)
        self._suppressed = 0
        self._fatal: DeliveryError | None = None
        self._brokers = config.brokers
        settings = producer_settings(config)
        self._log.debug("Kafka producer generation %d: %s", generation,
                        describe_settings(settings))
        self._producer: Producer | None = _new_producer(settings, self._log,
                                                        error_cb=self._on_error)
        self._produce = self._producer.produce
        self._report = self._on_delivery

    @property
    def fatal_error(self) -> DeliveryError | None:
        """The producer-wide fatal error, if one was raised (then build a new sink)."""
        return self._fatal

    def produce(self, message: Message, token: int) -> None:
        """Queue ``message``; its Delivery (with ``token``) is reported by a later poll."""
        try:
            self._produce(
                message.topic,
                message.value,
                message.key,
                on_delivery=partial(self._report, token),
                timestamp=message.timestamp_ms or 0,
                headers=message.headers,  # type: ignore[arg-type]  # list is invariant
            )
        except BufferError:
            raise QueueFull("the producer queue is full") from None
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError):
                raise ProduceRejected(DeliveryError(ErrorKind.FATAL, str(exc))) from exc
            if error.code() == KafkaError._QUEUE_FULL:
                raise QueueFull("the producer queue is full") from exc
            rejected = classify(error)
            if error.fatal() or error.code() in _PRODUCER_DEAD_CODES:
                self._set_fatal(rejected)
            raise ProduceRejected(rejected) from exc

    def poll(self, timeout: float) -> int:
        """Serve delivery reports (and librdkafka logs/errors) for up to ``timeout`` s."""
        if self._producer is None:
            return 0
        before = self._delivered
        self._producer.poll(timeout)
        return self._delivered - before

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for everything queued to be reported; return what remains."""
        if self._producer is None:
            return 0
        return self._producer.flush(timeout)

    def pending(self) -> int:
        """Messages queued or in flight (including reports not yet served)."""
        return len(self._producer) if self._producer is not None else 0

    def warm_up(self, timeout: float) -> None:
        """Connect and get the idempotent producer its id before the first message.

        librdkafka requests the producer id on a 500 ms timer, or when a metadata
        response arrives from a connected (non-bootstrap) broker. Without help the first
        ack therefore takes ~0.5 s (FIELD-NOTES pitfall 9). Asking for metadata until a
        real broker - not the bootstrap connection - answers triggers the request at
        once (~60 ms here). Raises BrokerError if no broker answers within ``timeout``.
        """
        producer = self._producer
        if producer is None:
            raise BrokerError(f"Kafka producer generation {self.generation} is closed")
        deadline = time.monotonic() + timeout
        problem = "no broker answered"
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                metadata = producer.list_topics(timeout=remaining)
            except KafkaException as exc:
                problem = _exception_text(exc)
                producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
                continue
            if metadata.orig_broker_id >= 0:
                return
            producer.poll(0.005)
        raise BrokerError(
            f"Kafka at {mask_secrets(self._brokers)} did not answer within {timeout:g} s: "
            f"{problem} (check --brokers and that the broker is running)"
        )

    def close(self, timeout: float) -> None:
        """Flush for up to ``timeout`` s, then drop what is left without reporting it."""
        producer = self._producer
        if producer is None:
            return
        remaining = producer.flush(timeout)
        self._open = False
        if remaining:
            producer.purge(in_queue=True, in_flight=True, blocking=True)
            producer.poll(0)  # acks already received still count; purge reports are dropped
        self._producer = None
        self._produce = self._produce_after_close
        unreported = len(producer)
        if unreported == 0:  # Producer.close() flushes without a timeout: only when empty
            producer.close()
        dropped = self._suppressed + unreported
        if dropped:
            self._log.info("Kafka producer generation %d closed; %d undelivered message(s) "
                           "dropped, never reported", self.generation, dropped)

    def _produce_after_close(self, *_args: object, **_kwargs: object) -> None:
        raise ProduceRejected(DeliveryError(
            ErrorKind.FATAL, f"Kafka producer generation {self.generation} is closed"))

    def _on_delivery(self, token: int, error: KafkaError | None, _message: object) -> None:
        if error is None:
            self._delivered += 1
            self._handler(Delivery(token))
            return
        if not self._open:
            self._suppressed += 1
            return
        failure = classify(error)
        if error.fatal() or error.code() in _PRODUCER_DEAD_CODES:
            self._set_fatal(failure)
        self._delivered += 1
        self._handler(Delivery(token, failure))

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._set_fatal(DeliveryError(ErrorKind.FATAL, describe_error(error)))
        elif self._open:
            self._log.warning("Kafka producer generation %d: %s", self.generation,
                              describe_error(error))

    def _set_fatal(self, error: DeliveryError) -> None:
        if self._fatal is None:
            self._fatal = error
            self._log.error("Kafka producer generation %d failed fatally: %s",
                            self.generation, error.reason)


class KafkaSinkFactory(Protocol):
    """A SinkFactory whose sinks are KafkaSinks (so callers see ``warm_up``, ``generation``)."""

    def __call__(self, on_delivery: DeliveryHandler) -> KafkaSink: ...


def kafka_sink_factory(config: KafkaConfig, *,
                       logger: logging.Logger | None = None) -> KafkaSinkFactory:
    """A factory of KafkaSinks, numbering their generations; warns once about weak settings."""
    log = logger or _log
    settings = producer_settings(config)
    if settings.get("enable.idempotence", "").lower() not in ("true", "1"):
        log.warning("enable.idempotence=%s: producer retries may duplicate or reorder the "
                    "events of an aggregate", settings.get("enable.idempotence"))
    if settings.get("acks", "").lower() not in ("all", "-1"):
        log.warning("acks=%s: a message the leader acknowledged can still be lost if it fails",
                    settings.get("acks"))
    generation = 0

    def build(on_delivery: DeliveryHandler) -> KafkaSink:
        nonlocal generation
        generation += 1
        return KafkaSink(config, on_delivery, generation=generation, logger=log)

    return build


if TYPE_CHECKING:  # mypy proves that KafkaSink is a Sink and the factory a SinkFactory

    def _conforms(factory: KafkaSinkFactory, sink: KafkaSink) -> tuple[SinkFactory, Sink]:
        return factory, sink
