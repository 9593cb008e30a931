"""The confluent-kafka plumbing under the Kafka sink: settings, errors, building a Producer.

Owns the producer defaults and how the user's ``--producer-config`` overrides them, the
translation of librdkafka errors into the three ``ErrorKind``\\ s the loops act on, the
masking logger librdkafka writes through, building a Producer, and the broker probe
``doctor`` uses. It must not hold a producer beyond one call (the sink in
``sink/kafka/sink.py`` owns the producer's lifecycle) nor decide what to do about a failure
(dead-letter, replay, count an attempt): the loops do that. With the rest of ``sink/``
it is the only place that imports confluent_kafka.

Producer defaults (docs/design.md), each overridable with ``--producer-config`` (the user wins;
weakening acks or idempotence is logged as a warning):

* ``acks=all``, ``enable.idempotence=true``: no loss, no duplicates or reordering from
  the producer's own retries.
* ``message.timeout.ms`` from KafkaConfig (30 s, not librdkafka's 300 s: a timed-out
  message means "new producer, replay" - docs/design.md, failure rules).
* ``linger.ms=5`` (librdkafka's own default): batches fill under load at the cost of at
  most 5 ms latency at low rates; ``linger.ms=0`` trades throughput for latency.
* ``queue.buffering.max.messages=100000``, ``queue.buffering.max.kbytes=65536`` (64 MB
  instead of 1 GB): memory stays bounded, a full queue is QueueFull (backpressure).
* ``compression.type=none``, ``client.id=cdc-relay``.
* ``partitioner=murmur2_random``: the Java producer's partitioner (murmur2 of the key
  bytes, ``& 0x7fffffff``, modulo the partition count), so an aggregate lands on the
  partition Debezium or any Java producer would choose (librdkafka's own default,
  ``consistent_random``, hashes with CRC32). docs/messages.md, partitioning.

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
MSG_SIZE_TOO_LARGE, INVALID_MSG_SIZE, RECORD_LIST_TOO_LARGE    PERMANENT    this message
                                                               (TOO_LARGE)  is too large
INVALID_MSG, INVALID_RECORD, INVALID_TIMESTAMP,                PERMANENT    this message:
UNSUPPORTED_FOR_MESSAGE_FORMAT, POLICY_VIOLATION,                           dead-letter it
TOPIC_EXCEPTION (illegal topic), ``_INVALID_ARG``, ``_BAD_MSG``
``_UNKNOWN_TOPIC``, UNKNOWN_TOPIC_OR_PART,                     RETRIABLE    topic not
``_UNKNOWN_PARTITION``                                         (TOPIC_      created yet
                                                               MISSING)
TOPIC_AUTHORIZATION_FAILED                                     RETRIABLE    ACL glitch
                                                               (TOPIC_
                                                               FORBIDDEN)
any other error with ``err.retriable()``                       RETRIABLE    transient
anything else                                                  FATAL        unknown
=============================================================  ===========  ==============

Rows are checked top to bottom. Dead-lettering is a decision about the event, so it is
made only for errors the event itself causes (its size, its format, an illegal topic
name). A missing or forbidden topic is broker trouble - a topic not created yet, a brief
ACL glitch - and is retried, never dead-lettered: the event is fine and will be
deliverable once the operator fixes the broker. An error nobody classified replays with
a new producer instead: loud, but no event is diverted for a reason we do not understand.
``BufferError`` / ``_QUEUE_FULL`` from ``produce()`` is QueueFull.

Secrets: settings are logged through ``describe_settings`` (secret-valued keys masked)
and every librdkafka line and error text passes through ``mask_secrets``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from cdc_relay.config import KafkaConfig
from cdc_relay.errors import AccessRefused, BrokerError, ConfigError, mask_secrets
from cdc_relay.sink.base import Cause, DeliveryError, ErrorKind

_log = logging.getLogger("cdc_relay.sink.kafka")

DEFAULT_SETTINGS: dict[str, str] = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "queue.buffering.max.messages": "100000",
    "queue.buffering.max.kbytes": "65536",
    "compression.type": "none",
    "client.id": "cdc-relay",
    "partitioner": "murmur2_random",
}

_E = KafkaError
_TOO_LARGE_CODES = frozenset({_E.MSG_SIZE_TOO_LARGE, _E.INVALID_MSG_SIZE,
                              _E.RECORD_LIST_TOO_LARGE})
_PERMANENT_CODES = _TOO_LARGE_CODES | frozenset({
    _E.INVALID_MSG, _E.INVALID_RECORD, _E.INVALID_TIMESTAMP, _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    _E.POLICY_VIOLATION, _E.TOPIC_EXCEPTION, _E._INVALID_ARG, _E._BAD_MSG,
})
# Broker trouble about the topic, not the event's fault: retried, never dead-lettered.
_TOPIC_CAUSES = {
    _E._UNKNOWN_TOPIC: Cause.TOPIC_MISSING,
    _E.UNKNOWN_TOPIC_OR_PART: Cause.TOPIC_MISSING,
    _E._UNKNOWN_PARTITION: Cause.TOPIC_MISSING,
    _E.TOPIC_AUTHORIZATION_FAILED: Cause.TOPIC_FORBIDDEN,
}
_FATAL_CODES = frozenset({
    _E._FATAL, _E._FENCED, _E.UNKNOWN_PRODUCER_ID, _E.OUT_OF_ORDER_SEQUENCE_NUMBER,
    _E.INVALID_PRODUCER_EPOCH, _E.PRODUCER_FENCED, _E.INVALID_PRODUCER_ID_MAPPING,
    _E._GAPLESS_GUARANTEE, _E._MSG_TIMED_OUT, _E._TIMED_OUT, _E._TIMED_OUT_QUEUE,
    _E._PURGE_QUEUE, _E._PURGE_INFLIGHT, _E._DESTROY, _E.CLUSTER_AUTHORIZATION_FAILED,
    _E.SASL_AUTHENTICATION_FAILED, _E._AUTHENTICATION, _E._SSL, _E.INVALID_REQUIRED_ACKS,
    _E.UNSUPPORTED_VERSION, _E._STATE,
})
# The broker refused the credentials or the cluster ACL: AccessRefused at warm-up (exit 6).
REFUSAL_CODES = frozenset({_E.SASL_AUTHENTICATION_FAILED, _E._AUTHENTICATION,
                           _E.CLUSTER_AUTHORIZATION_FAILED})
# Producer-wide: the producer can never deliver again, whatever the message.
_PRODUCER_DEAD_CODES = frozenset({_E._FATAL, _E._FENCED})
TOPIC_FIX = "create the topic or grant the producer access"
_SECRET_KEY_PARTS = ("password", "secret", "sasl.oauthbearer.config", "ssl.key.pem",
                     "ssl.keystore")


ACL_DOC = "docs/operations.md, Kafka ACLs"


def classify(error: KafkaError, topic: str | None = None) -> DeliveryError:
    """Map a librdkafka error to the ErrorKind the loops act on (module docstring table);
    a missing or forbidden ``topic`` is named in the reason, with its fix."""
    code = error.code()
    reason = describe_error(error)
    if error.fatal():
        return DeliveryError(ErrorKind.FATAL, reason)
    if code in _PERMANENT_CODES:
        cause = Cause.TOO_LARGE if code in _TOO_LARGE_CODES else Cause.UNSPECIFIED
        return DeliveryError(ErrorKind.PERMANENT, reason, cause)
    topic_cause = _TOPIC_CAUSES.get(code)
    if topic_cause is not None:
        return DeliveryError(ErrorKind.RETRIABLE, topic_problem(topic_cause, topic, reason), topic_cause)
    if code in _FATAL_CODES or not error.retriable():
        return DeliveryError(ErrorKind.FATAL, reason)
    return DeliveryError(ErrorKind.RETRIABLE, reason)


def topic_problem(cause: Cause, topic: str | None, reason: str) -> str:
    """A missing or forbidden topic in words, with the fix (the ACL by Kafka's names)."""
    if topic is None:
        return f"{reason}: {TOPIC_FIX}"
    if cause is Cause.TOPIC_FORBIDDEN:
        return (f"not authorized to write to topic {topic}: grant WRITE on TOPIC {topic} to the "
                f"relay's user ({ACL_DOC}) [{reason}]")
    return (f"topic {topic} does not exist: create it, or let the broker create it "
            f"(auto.create.topics.enable and CREATE on TOPIC {topic}: {ACL_DOC}) [{reason}]")


def refusal_text(brokers: str, code: int | None, problem: str) -> str:
    """One line for a refused login or cluster ACL (``REFUSAL_CODES``), with its fix.

    A cluster ACL refused to a producer is, from Kafka 3.0 on, its idempotent producer id:
    allowed to any principal with WRITE on some topic, so the fix is that grant.
    """
    where = f"Kafka at {mask_secrets(brokers)}"
    if code == _E.CLUSTER_AUTHORIZATION_FAILED:
        return (f"{where} refused the relay's idempotent producer: {problem}: grant WRITE on "
                "TOPIC ... for the topics it writes to (Kafka 3.0+ then allows idempotence; "
                f"older brokers: IDEMPOTENT_WRITE on CLUSTER) to the relay's user ({ACL_DOC})")
    return (f"{where} refused the relay: {problem} (check sasl.username / sasl.password or the "
            "certificates in --producer-config, and the ACLs)")


def raised_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError a poll/flush raised: confluent-kafka raises a fatal error from them,
    and when a delivery report is served in the same call it surfaces as a SystemError
    caused by that KafkaException."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, KafkaException) and candidate.args and isinstance(
                candidate.args[0], KafkaError):
            return candidate.args[0]
    return None


def kills_producer(error: KafkaError) -> bool:
    """Whether ``error`` leaves the producer unable to deliver anything again."""
    return bool(error.fatal()) or error.code() in _PRODUCER_DEAD_CODES


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

    librdkafka's lines appear only while the producer is polled or flushed (docs/design.md,
    observability). ``demote`` logs them at DEBUG: for probes whose failure is reported otherwise.
    """

    # librdkafka repeats a connection failure for every broker and retry (hundreds of
    # lines a minute while a broker is down): one line per kind of message per window.
    _WINDOW = 30.0

    def __init__(self, logger: logging.Logger, *, demote: bool = False) -> None:
        self._logger = logger
        self._demote = demote
        self._seen: dict[str, tuple[float, int]] = {}  # digit-free text -> (first, repeats)
        # librdkafka's last "Fatal error" line: what a bare SystemError from poll/flush was
        self.fatal: str | None = None

    def log(self, level: int, msg: str, *args: Any) -> None:
        if args and "Fatal error" in str(args[-1]):
            self.fatal = mask_secrets(msg % args)  # confluent-kafka: "%s [%s] %s", fac, name, line
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


def masking_logger(logger: logging.Logger, *, demote: bool = False) -> _MaskingLogger:
    """A librdkafka ``logger`` setting: masked, one line per kind per window."""
    return _MaskingLogger(logger, demote=demote)


def new_producer(settings: dict[str, str], logger: logging.Logger | _MaskingLogger, *,
                 demote: bool = False,
                 error_cb: Callable[[KafkaError], None] | None = None) -> Producer:
    conf: dict[str, Any] = dict(settings)
    conf["logger"] = (logger if isinstance(logger, _MaskingLogger)
                      else _MaskingLogger(logger, demote=demote))
    if error_cb is not None:
        conf["error_cb"] = error_cb
    try:
        return Producer(conf)
    except KafkaException as exc:
        raise ConfigError(
            f"invalid producer configuration: {exception_text(exc)} "
            "(check --producer-config; see librdkafka's CONFIGURATION.md)"
        ) from exc


def exception_text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return mask_secrets(error.str())
    return mask_secrets(str(exc))


def check_brokers(config: KafkaConfig, timeout: float) -> None:
    """Raise BrokerError (one line, cause and fix) unless a broker answers a metadata request.

    Uses the relay's own producer settings, so SASL/SSL problems show up here too: a
    refused login is AccessRefused (``refusal_text``), told as soon as librdkafka reports it.
    A metadata request for every topic needs no ACL (the answer lists those the user may
    describe), so a least-privilege user passes.
    """
    refusals: list[tuple[int, str]] = []

    def on_error(error: KafkaError) -> None:
        if error.code() in REFUSAL_CODES:
            refusals.append((error.code(), describe_error(error)))

    producer = new_producer(producer_settings(config), _log, demote=True, error_cb=on_error)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                producer.list_topics(timeout=max(0.001, min(1.0, deadline - time.monotonic())))
                return
            except KafkaException as exc:
                producer.poll(0)  # serves error_cb
                if refusals:
                    raise AccessRefused(refusal_text(config.brokers, *refusals[0])) from exc
                if time.monotonic() >= deadline:
                    raise BrokerError(
                        f"cannot reach Kafka at {mask_secrets(config.brokers)}: "
                        f"{exception_text(exc)} (check --brokers, that the broker is running, "
                        "and the security settings)") from exc
    finally:
        producer.close()
