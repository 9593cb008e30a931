"""The Kafka sink: confluent-kafka's Producer behind the Sink protocol.

Owns the producer's lifecycle - one Producer per sink generation, produce, poll, flush,
warm-up and close - and the routing of its delivery reports to the loop's handler. The
producer settings and the classification of librdkafka errors are
``sink/kafka/client.py``. It must not decide what to do about a failure (dead-letter,
replay, count an attempt): the loops do that.

``fatal_error`` (not in the Sink protocol; read with ``getattr``) is set by a fatal
error from ``error_cb`` - so it is noticed with nothing in flight - and by a report or
``produce()`` error that is ``err.fatal()``, ``_FATAL`` or ``_FENCED``. A timed-out
message is FATAL for that message only: the loop replaces the producer anyway.

Delivery reports: each message's callback comes from the sink's ``Reports`` - the
compiled one of sink/kafka/_creports.c where it is built, else the pure ``Reports`` below,
which does the same - so a success reaches the current handler without a Python frame
of the sink's, and a failure reaches ``_on_failure`` (docs/design.md, "The compiled
delivery report").

Generations: every sink built by the factory owns one Producer and carries the
factory's generation number (1, 2, ...). Its delivery callbacks are bound to it, so a
report can only reach the handler while *this* sink is polled. ``close()`` flushes
(acks found then are reported as usual), then purges what is left and swallows the
purge reports: after ``close()`` no failure of that generation reaches the handler -
every undelivered token of it is simply "not delivered" (a counted log line says how
many), so a discarded producer never triggers a second restart (docs/design.md, failure rules).

Secrets: settings are logged through ``describe_settings`` (secret-valued keys masked)
and every librdkafka line and error text passes through ``mask_secrets``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from functools import partial
from types import MethodType, ModuleType
from typing import TYPE_CHECKING, NoReturn, Protocol

# warm_up's list_topics builds its answer from confluent_kafka.admin's classes, which the
# C extension imports on first use: on the warm-up thread, while the main thread imports
# psycopg. Two threads importing at once hand the GIL back and forth at every file read,
# each waiting out a switch interval; so it is imported here, with this module
# (docs/design.md, start-up).
import confluent_kafka.admin  # noqa: F401
from confluent_kafka import KafkaError, KafkaException, Producer

from cdc_relay import accel
from cdc_relay.config import KafkaConfig
from cdc_relay.errors import AccessRefused, BrokerError, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.base import (
    BatchHandler,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    ProduceRejected,
    QueueFull,
    Sink,
    SinkFactory,
)
from cdc_relay.sink.kafka.client import (
    REFUSAL_CODES,
    classify,
    describe_error,
    describe_settings,
    exception_text,
    kills_producer,
    masking_logger,
    new_producer,
    producer_settings,
    raised_error,
    refusal_text,
)

_log = logging.getLogger("cdc_relay.sink.kafka")

# One message's delivery callback, as confluent-kafka calls it: (error, message).
ReportCallback = Callable[[KafkaError | None, object], None]


class Reports:
    """A sink's delivery reports: the pure twin of sink/kafka/_creports.c's ``Reports``.

    ``callback(token)`` is the message's delivery callback. A success is counted in
    ``delivered`` and goes to what is current when the report is served, not when the
    message was produced: with a ``batch`` handler its token is kept, and ``hand_over()``
    (the sink calls it once its poll returns) passes the kept tokens to ``batch(tokens)``;
    else ``handler(token, None)``. Anything else first hands over the successes kept
    before it, then goes to ``failure(token, error, message)``.
    """

    __slots__ = ("_batch", "_done", "callback", "delivered", "failure", "handler")

    def __init__(self, handler: DeliveryHandler,
                 failure: Callable[[int, KafkaError, object], None]) -> None:
        self.handler = handler
        self.failure = failure
        self.delivered = 0
        self._batch: BatchHandler | None = None
        self._done: list[int] = []
        # partial(partial, f)(token) is partial(f, token): no Python frame per message
        self.callback: Callable[[int], ReportCallback] = partial(partial, self._report)

    @property
    def batch(self) -> BatchHandler | None:
        """batch(tokens), or None: what the successes of a poll are handed to."""
        return self._batch

    @batch.setter
    def batch(self, batch: BatchHandler | None) -> None:
        if self._done:
            raise RuntimeError("Reports.batch changed with successes not handed over: "
                               "call hand_over() first")
        self._batch = batch

    def hand_over(self) -> None:
        """Pass the successes kept since the last hand-over to ``batch(tokens)``, if any."""
        done = self._done
        if done:
            self._done = []
            self._batch(done)  # type: ignore[misc]  # kept only with a batch handler

    def _report(self, token: int, error: KafkaError | None, message: object) -> None:
        if error is None:
            self.delivered += 1
            if self._batch is not None:
                self._done.append(token)
            else:
                self.handler(token, None)
        else:
            self.hand_over()
            self.failure(token, error, message)


def _reports_in(module: ModuleType | None) -> type[Reports]:
    return Reports if module is None else module.Reports


def reports_class() -> type[Reports]:
    """The compiled Reports where built and chosen (accel.py), else the pure one."""
    return _reports_in(accel.extension("_creports"))


class KafkaSink:
    """One confluent-kafka Producer (one generation) as a Sink; see the module docstring."""

    def __init__(self, config: KafkaConfig, on_delivery: DeliveryHandler, *,
                 generation: int = 1, logger: logging.Logger | None = None) -> None:
        self.generation = generation
        self._log = logger or _log
        # Where each report goes; ``delivered`` counts those handed over (poll's delta).
        module = accel.extension("_creports")
        self._reports = _reports_in(module)(on_delivery, self._on_failure)
        self._callback = self._reports.callback
        self._open = True
        self._suppressed = 0
        self._fatal: DeliveryError | None = None
        self._refusal: tuple[int, str] | None = None  # (code, text): a login or cluster ACL refused
        self._brokers = config.brokers
        settings = producer_settings(config)
        self._log.debug("Kafka producer generation %d: %s", generation,
                        describe_settings(settings))
        self._librdkafka_log = masking_logger(self._log)
        self._producer: Producer | None = new_producer(settings, self._librdkafka_log,
                                                        error_cb=self._on_error)
        self._produce = self._producer.produce
        # The compiled produce (sink/kafka/_creports.c, Sender): this class's produce without its
        # Python frame, for an exact Message; it hands anything else to that method.
        self._sender = None if module is None else module.Sender(
            self._produce, self._reports, Message, MethodType(KafkaSink.produce, self),
            self._rejected)
        if self._sender is not None:
            self.produce = self._sender.send  # type: ignore[method-assign]

    @property
    def refusal_code(self) -> int | None:
        """The librdkafka code of a refused login or cluster ACL, once one was seen."""
        return None if self._refusal is None else self._refusal[0]

    @property
    def fatal_error(self) -> DeliveryError | None:
        """The producer-wide fatal error, if one was raised (then build a new sink)."""
        return self._fatal

    def produce(self, message: Message, token: int) -> None:
        """Queue ``message``; its report (``token``, error) is handed over by a later poll."""
        try:
            # All positional, in the order of confluent-kafka's keyword list (topic, value,
            # key, partition, callback, on_delivery, timestamp, headers): its keyword
            # parsing costs ~1,000 instructions per keyword, 30% of the call
            # (docs/design.md, WAL mode's hot path). The contract tests read the
            # timestamp, headers and partition back from the broker.
            self._produce(
                message.topic,
                message.value,
                message.key,
                -1 if message.partition is None else message.partition,
                self._callback(token),
                None,
                message.timestamp_ms or 0,
                message.headers,  # type: ignore[arg-type]  # list is invariant
            )
        except (BufferError, KafkaException) as exc:
            self._rejected(exc, message.topic)

    def _rejected(self, exc: BaseException, topic: str | None = None) -> NoReturn:
        """Raise the Sink protocol's error for what the producer's produce raised (a missing
        or forbidden ``topic`` named with its grant, as in a delivery report)."""
        if isinstance(exc, BufferError):
            raise QueueFull("the producer queue is full") from None
        if not isinstance(exc, KafkaException):
            raise exc  # e.g. ProduceRejected once closed, or a TypeError: as it is
        error = exc.args[0] if exc.args else None
        if not isinstance(error, KafkaError):
            raise ProduceRejected(DeliveryError(ErrorKind.FATAL, str(exc))) from exc
        if error.code() == KafkaError._QUEUE_FULL:
            raise QueueFull("the producer queue is full") from exc
        rejected = classify(error, topic)
        if kills_producer(error):
            self._set_fatal(rejected)
        raise ProduceRejected(rejected) from exc

    def poll(self, timeout: float) -> int:
        """Serve delivery reports (and librdkafka logs/errors) for up to ``timeout`` s."""
        if self._producer is None:
            return 0
        reports = self._reports
        before = reports.delivered
        try:
            self._producer.poll(timeout)
        except (KafkaException, SystemError) as exc:
            self._raised(exc)
        finally:
            reports.hand_over()
        return reports.delivered - before

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for everything queued to be reported; return what remains."""
        if self._producer is None:
            return 0
        try:
            return self._producer.flush(timeout)
        except (KafkaException, SystemError) as exc:
            self._raised(exc)
            return len(self._producer)
        finally:
            self._reports.hand_over()

    def _raised(self, exc: KafkaException | SystemError) -> None:
        """confluent-kafka raises a fatal error from poll/flush (error_cb is not called for
        it): the producer is dead. A refused cluster ACL (the idempotent producer id) or
        login is AccessRefused; any other fatal error is ``fatal_error`` for the loop."""
        error = raised_error(exc)
        if error is None and isinstance(exc, SystemError):
            # A fatal error met inside the call can leave a bare SystemError ("returned NULL
            # without setting an exception"); the error callback says what it was, at the
            # latest on the next poll.
            if self._refusal is None and self._fatal is None and self._producer is not None:
                with contextlib.suppress(KafkaException, SystemError):
                    self._producer.poll(0)
            logged = self._librdkafka_log.fatal
            if self._refusal is None and logged is not None and "authorization failed" in logged:
                self._refusal = (KafkaError.CLUSTER_AUTHORIZATION_FAILED, logged)
            if self._refusal is not None:
                raise AccessRefused(refusal_text(self._brokers, *self._refusal)) from exc
            if self._fatal is None and logged is not None:
                self._set_fatal(DeliveryError(ErrorKind.FATAL, logged))
            if self._fatal is not None:
                return  # fatal_error says it: the loop replaces the producer
        if error is None:
            raise exc
        if error.code() in REFUSAL_CODES:
            self._refusal = (error.code(), describe_error(error))
            # not _set_fatal: its log line would repeat the one line the exit prints
            self._fatal = self._fatal or DeliveryError(ErrorKind.FATAL, describe_error(error))
            raise AccessRefused(refusal_text(self._brokers, *self._refusal)) from exc
        self._set_fatal(classify(error))

    def pending(self) -> int:
        """Messages queued or in flight (including reports not yet served)."""
        return len(self._producer) if self._producer is not None else 0

    def set_handler(self, handler: DeliveryHandler, delivered: BatchHandler | None = None) -> None:
        """Hand the reports served from now on to ``handler``, the successes of each poll
        to ``delivered(tokens)`` when given."""
        reports = self._reports
        reports.hand_over()  # none are kept between polls; this keeps it so
        reports.handler = handler
        reports.batch = delivered

    def warm_up(self, timeout: float) -> None:
        """Connect and get the idempotent producer its id before the first message.

        librdkafka requests the producer id on a 500 ms timer, or when a metadata
        response arrives from a connected (non-bootstrap) broker. Without help the first
        ack therefore takes ~0.5 s (docs/design.md, WAL mode). Asking for metadata until a
        real broker - not the bootstrap connection - answers triggers the request at
        once (~60 ms here). Raises BrokerError if no broker answers within ``timeout``.
        """
        producer = self._producer
        if producer is None:
            raise BrokerError(f"Kafka producer generation {self.generation} is closed")
        deadline = time.monotonic() + timeout
        problem = "no broker answered"
        while (remaining := deadline - time.monotonic()) > 0:
            if self._refusal is not None:  # from error_cb: SASL/SSL login refused
                raise AccessRefused(refusal_text(self._brokers, *self._refusal))
            try:
                metadata = producer.list_topics(timeout=remaining)
            except KafkaException as exc:
                problem = exception_text(exc)
                if exc.args and isinstance(exc.args[0], KafkaError) and (
                        exc.args[0].code() in REFUSAL_CODES):
                    self._refusal = (exc.args[0].code(), problem)
                    continue
                producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
                continue
            if metadata.orig_broker_id >= 0:
                return
            producer.poll(0.005)
        raise BrokerError(
            f"Kafka at {mask_secrets(self._brokers)} did not answer within {timeout:.1f} s: "
            f"{problem} (check --brokers and that the broker is running)"
        )

    def close(self, timeout: float) -> None:
        """Flush for up to ``timeout`` s, then drop what is left without reporting it."""
        producer = self._producer
        if producer is None:
            return
        try:
            remaining = producer.flush(timeout)
        except (KafkaException, SystemError):
            # A producer in a fatal state (a transactional id or the idempotent producer id
            # refused) raises instead - a bare SystemError when the error was met inside the
            # call: closing must not hide the error that ended the run.
            remaining = len(producer)
        finally:
            self._reports.hand_over()
        self._open = False
        if remaining:
            with contextlib.suppress(KafkaException):
                producer.purge(in_queue=True, in_flight=True, blocking=True)
            try:
                producer.poll(0)  # acks already received still count; purge reports are dropped
            finally:
                self._reports.hand_over()
        self._producer = None
        self._produce = self._produce_after_close
        if self._sender is not None:
            self._sender.produce = self._produce_after_close
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

    def _on_failure(self, token: int, error: KafkaError, message: object) -> None:
        """A report with an error (a success never comes here: see ``Reports``)."""
        if not self._open:
            self._suppressed += 1
            return
        topic = getattr(message, "topic", None)
        failure = classify(error, topic() if callable(topic) else None)
        if kills_producer(error):
            self._set_fatal(failure)
        reports = self._reports
        reports.delivered += 1
        reports.handler(token, failure)

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in REFUSAL_CODES:
            self._refusal = (error.code(), describe_error(error))
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
