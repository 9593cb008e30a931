"""The RabbitMQ sink: pika's SelectConnection on a daemon thread, with asynchronous publisher confirms.

Why this shape: pika's BlockingConnection waits for one confirm per ``basic_publish``
once confirms are on - one round trip per event. SelectConnection delivers Basic.Ack /
Basic.Nack (often ``multiple``) to a callback while many messages are in flight, but
runs its own I/O loop; that loop runs on one daemon thread per sink generation, behind
``BackgroundSink`` (sink/background.py), so the relay keeps its single loop. Messages
reach the I/O thread through a deque and one ``add_callback_threadsafe`` per burst, and
are published in produce order on one channel (one channel keeps publish order).

Each message: exchange ``exchange`` (topic, durable, declared if missing unless
``declare_exchange=false``), or the dead-letter exchange for the dead-letter routing
key; routing key = the message's topic; persistent (delivery_mode 2); ``mandatory``;
properties ``message_id`` (event id), ``type`` (event type), ``timestamp`` (seconds),
``content_type`` (the message's ``content-type`` header, which the CloudEvents formats
set; else ``application/json``); headers = the message contract's headers plus
``aggregate_id``. The dead-letter queue is declared and bound so dead letters always
have somewhere to go.

Outcomes: Basic.Ack -> delivered. Basic.Nack -> RETRIABLE. A Basic.Return (no queue
bound for the routing key; RabbitMQ sends it before the Ack of the same message) ->
PERMANENT, so the event is dead-lettered as an illegal Kafka topic would be. A Return
carries no delivery tag: it is matched to the oldest unconfirmed publish with the same
routing key and message id (two such publishes route alike, so the match is sound). A
lost connection or a channel closed by the broker -> the sink is FATAL. Only sink/
imports pika.
"""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import pika
from pika import spec
from pika.adapters.select_connection import SelectConnection

from cdc_relay.errors import BrokerError, ConfigError, ExitCode, mask_secrets
from cdc_relay.model import Message
from cdc_relay.sink.background import BackgroundSink
from cdc_relay.sink.base import (
    Cause,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    Sink,
    SinkFactory,
)
from cdc_relay.sink.config import RabbitMqConfig, SinkProbe

_log = logging.getLogger("cdc_relay.rabbitmq")
_SHORTSTR = 255  # AMQP short strings (routing key, message_id, type) are at most 255 bytes


def connection_parameters(config: RabbitMqConfig) -> pika.URLParameters:
    """pika's parameters for the URL, with the sink's heartbeat, blocking timeout and TLS."""
    params = pika.URLParameters(config.url)
    if "heartbeat=" not in config.url:
        params.heartbeat = config.heartbeat
    # A connection blocked by a resource alarm for longer than the message timeout is closed:
    # the same as a stalled broker.
    params.blocked_connection_timeout = config.message_timeout_ms / 1000
    if config.tls_ca_file or config.tls_cert_file:
        context = ssl.create_default_context(cafile=config.tls_ca_file)
        if config.tls_cert_file:
            context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
        params.ssl_options = pika.SSLOptions(context, params.host)
    return params


def properties(message: Message) -> pika.BasicProperties:
    """The AMQP properties and headers of a message (see the module docstring)."""
    headers: dict[str, Any] = {k: v.decode("utf-8", "replace") for k, v in message.headers}
    headers["aggregate_id"] = (message.key or b"").decode("utf-8", "replace")
    event_type = headers.get("event_type")
    message_id = headers.get("id")
    return pika.BasicProperties(
        content_type=headers.get("content-type", "application/json"), delivery_mode=2,
        headers=headers,
        message_id=message_id if message_id and len(message_id.encode()) <= _SHORTSTR else None,
        type=event_type if event_type and len(event_type.encode()) <= _SHORTSTR else None,
        timestamp=message.timestamp_ms // 1000 if message.timestamp_ms is not None else None,
    )


class RabbitMqSink(BackgroundSink):
    """One RabbitMQ connection and confirm-mode channel (one generation) as a Sink."""

    kind = "rabbitmq"

    def __init__(self, config: RabbitMqConfig, on_delivery: DeliveryHandler, *,
                 generation: int = 1, logger: logging.Logger | None = None) -> None:
        super().__init__(on_delivery, generation=generation, max_in_flight=config.max_in_flight,
                         message_timeout=config.message_timeout_ms / 1000, logger=logger or _log)
        self._config = config
        try:
            self._params = connection_parameters(config)
        except (ValueError, TypeError, OSError, ssl.SSLError) as exc:
            raise ConfigError(f"invalid RabbitMQ settings for {mask_secrets(config.url)}: "
                              f"{mask_secrets(str(exc))} (check --brokers and the tls_* "
                              "--sink-config files)") from exc
        self._outbox: deque[tuple[int, Message]] = deque()
        self._scheduled = False
        self._settled = threading.Event()  # ready, or failed before getting there
        self._ready = False
        self._closing = False
        self._conn: SelectConnection | None = None
        self._channel: Any = None
        self._thread: threading.Thread | None = None
        self._steps: list[Callable[[], object]] = []
        # I/O thread only: delivery tag -> (seq, routing key, message id), oldest first.
        self._tag = 0
        self._unconfirmed: dict[int, tuple[int, str, str | None]] = {}
        self._tags: deque[int] = deque()
        self._returned: dict[int, str] = {}

    # -- relay thread ----------------------------------------------------------------
    def warm_up(self, timeout: float) -> None:
        """Connect, open a confirm-mode channel, declare; raise BrokerError if that fails.

        After a failed attempt (and nothing produced) it tries again with a new connection,
        no sooner than the reconnect backoff allows. Credentials or permissions the broker
        refuses raise AccessRefused (never retried).
        """
        where = mask_secrets(self._config.url)
        if not self._ready and self._retry_allowed():
            if not self._may_reconnect(timeout):
                self._raise_failure(f"RabbitMQ at {where}")
            self._stop()
            self._thread = self._conn = self._channel = None
            self._closing = False
            self._settled.clear()
            self._clear_failure()
        self._start()
        if not self._settled.wait(timeout):
            raise BrokerError(f"RabbitMQ at {where} did not answer within {timeout:g} s (check "
                              "--brokers and that the broker is running)")
        self._raise_failure(f"RabbitMQ at {where}")

    def _refuse(self, message: Message) -> DeliveryError | None:
        if len(message.topic.encode()) > _SHORTSTR:
            return DeliveryError(ErrorKind.PERMANENT, f"routing key {message.topic[:60]!r}... is "
                                 "longer than 255 bytes")
        if len(message.value or b"") > self._config.max_message_bytes:
            return DeliveryError(ErrorKind.PERMANENT, f"message too large: {len(message.value or b'')} "
                                 f"bytes > max_message_bytes {self._config.max_message_bytes}",
                                 Cause.TOO_LARGE)
        return None

    def _submit(self, seq: int, message: Message) -> None:
        self._start()
        self._outbox.append((seq, message))
        if not self._scheduled:
            self._scheduled = True
            assert self._conn is not None
            self._conn.ioloop.add_callback_threadsafe(self._drain)

    def _start(self) -> None:
        if self._thread is not None:
            return
        self._conn = SelectConnection(self._params, on_open_callback=self._on_open,
                                      on_open_error_callback=self._on_open_error,
                                      on_close_callback=self._on_closed)
        self._thread = threading.Thread(target=self._conn.ioloop.start, daemon=True,
                                        name=f"rabbitmq-sink-{self.generation}")
        self._thread.start()

    def _stop(self) -> None:
        self._closing = True
        conn, thread = self._conn, self._thread
        if conn is None or thread is None:
            return
        conn.ioloop.add_callback_threadsafe(self._shut)
        thread.join(5.0)
        if not thread.is_alive():
            conn.ioloop.close()  # its wake-up socket pair

    # -- I/O thread ------------------------------------------------------------------
    def _shut(self) -> None:
        conn = self._conn
        assert conn is not None
        if not (conn.is_closed or conn.is_closing):
            with contextlib.suppress(Exception):  # already closing: stop the loop below
                conn.close()
                return  # _on_closed stops the loop
        conn.ioloop.stop()

    def _fail_io(self, reason: str, *, refused: bool = False) -> None:
        self._fail(mask_secrets(reason), refused=refused)
        self._settled.set()
        conn = self._conn
        if conn is not None and not (conn.is_closed or conn.is_closing):
            try:
                conn.close()
            except Exception:
                conn.ioloop.stop()

    def _on_open(self, conn: SelectConnection) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, conn: SelectConnection, error: BaseException) -> None:
        if is_refusal(error):
            self._fail_io(f"{refusal_text(error)} (check the user and password in --brokers, "
                          "and that the user may access the vhost: rabbitmqctl "
                          "set_permissions)", refused=True)
        else:
            self._fail_io(f"cannot connect: {_describe(error)} (check --brokers: host, port, "
                          "vhost, and that RabbitMQ runs)")
        conn.ioloop.stop()

    def _on_closed(self, conn: SelectConnection, reason: BaseException) -> None:
        if not self._closing:
            self._fail_io(f"connection lost: {reason or type(reason).__name__}")
        self._settled.set()
        conn.ioloop.stop()

    def _on_channel(self, channel: Any) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        config = self._config
        step = self._next
        steps: list[Callable[[], object]] = [
            partial(channel.confirm_delivery, ack_nack_callback=self._on_confirm, callback=step)]
        for exchange in dict.fromkeys([config.exchange, config.dlx]):
            steps.append(partial(channel.exchange_declare, exchange, "topic",
                                 passive=not config.declare_exchange, durable=True, callback=step))
        if config.dead_letter_queue:
            queue_name = config.dead_letter_queue
            steps.append(partial(channel.queue_declare, queue_name, durable=True, callback=step))
            steps.append(partial(channel.queue_bind, queue_name, config.dlx,
                                 config.dead_letter_routing_key, callback=step))
        self._steps = steps
        self._next()

    def _next(self, _frame: object = None) -> None:
        if self._steps:
            self._steps.pop(0)()
            return
        self._ready = True
        self._settled.set()
        self._drain()

    def _on_channel_closed(self, _channel: Any, reason: BaseException) -> None:
        if self._closing:
            return
        if getattr(reason, "reply_code", None) == _ACCESS_REFUSED:
            self._fail_io(f"{reason} (grant the user configure and write permissions on the "
                          "exchanges: rabbitmqctl set_permissions)", refused=True)
            return
        hint = ""
        if not self._ready and not self._config.declare_exchange:
            hint = (f" (with declare_exchange=false the exchange {self._config.exchange!r} must "
                    "exist: declare it, or drop that setting)")
        self._fail_io(f"the broker closed the channel: {reason}{hint}")

    def _drain(self) -> None:
        self._scheduled = False
        if not self._ready or self._fatal is not None:
            return
        outbox, channel, config = self._outbox, self._channel, self._config
        try:
            while outbox:
                seq, message = outbox.popleft()
                topic = message.topic
                props = properties(message)
                exchange = config.dlx if topic == config.dead_letter_routing_key else config.exchange
                channel.basic_publish(exchange, topic, message.value, props, mandatory=True)
                self._tag += 1
                self._unconfirmed[self._tag] = (seq, topic, props.message_id)
                self._tags.append(self._tag)
        except Exception as exc:
            self._fail_io(f"publish failed: {exc or type(exc).__name__}")

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag, unconfirmed, tags = method.delivery_tag, self._unconfirmed, self._tags
        taken: list[int] = []
        if method.multiple:
            while tags and tags[0] <= tag:
                t = tags.popleft()
                if t in unconfirmed:
                    taken.append(t)
        elif tag in unconfirmed:
            taken.append(tag)
        nacked = isinstance(method, spec.Basic.Nack)
        acked: list[int] = []
        for t in taken:
            seq = unconfirmed.pop(t)[0]
            returned = self._returned.pop(t, None)
            if nacked:
                self._report([seq], DeliveryError(ErrorKind.RETRIABLE, "RabbitMQ nacked the "
                             "message: the broker could not store it (retry)"))
            elif returned is not None:
                self._report([seq], DeliveryError(ErrorKind.PERMANENT, returned))
            else:
                acked.append(seq)
        while tags and tags[0] not in unconfirmed:  # single acks leave their tags behind
            tags.popleft()
        if acked:
            self._report(acked, None)

    def _on_return(self, _channel: Any, method: Any, props: Any, _body: bytes) -> None:
        reason = (f"unroutable: no queue is bound to exchange {method.exchange!r} for routing key "
                  f"{method.routing_key!r} ({method.reply_code} {method.reply_text})")
        for t in self._tags:
            entry = self._unconfirmed.get(t)
            if (entry is not None and t not in self._returned and entry[1] == method.routing_key
                    and entry[2] == props.message_id):
                self._returned[t] = reason
                return
        self._log.warning("RabbitMQ returned a message no publish matches: %s", reason,
                          extra={"sink": self.kind})


_ACCESS_REFUSED = 403  # AMQP reply code: the user may not do this
_NOT_ALLOWED = 530  # e.g. no access to the vhost
_REFUSALS = (pika.exceptions.ProbableAuthenticationError,
             pika.exceptions.ProbableAccessDeniedError, pika.exceptions.AuthenticationError)


_OS_ERROR = re.compile(r"(\w+Error)\((\d+), '([^']+)'\)")


def _describe(error: BaseException) -> str:
    """pika's connection errors nest the cause in reprs: name the socket error if any."""
    found = _OS_ERROR.search(repr(error))
    if found:
        return f"{found.group(3).lower()} ({found.group(1)})"
    return mask_secrets(str(error) or type(error).__name__)


def is_refusal(error: BaseException) -> bool:
    """Whether a failed connection is RabbitMQ refusing the credentials or the vhost."""
    if isinstance(error, _REFUSALS):
        return True
    code = getattr(error, "reply_code", None)
    if code in (_ACCESS_REFUSED, _NOT_ALLOWED):
        return True
    # pika wraps the handshake's failure: AMQPConnectionWorkflowFailed(exceptions=[...])
    inner = getattr(error, "exceptions", None) or ()
    return any(is_refusal(e) for e in inner if isinstance(e, BaseException) and e is not error)


def refusal_text(error: BaseException) -> str:
    """One line for a refused login (pika's own text carries object reprs)."""
    code = getattr(error, "reply_code", None)
    if code == _NOT_ALLOWED:
        return f"access to the vhost refused ({getattr(error, 'reply_text', '')})"
    return "login refused (ACCESS_REFUSED: wrong user or password)"


def rabbitmq_sink_factory(config: RabbitMqConfig, *,
                          logger: logging.Logger | None = None) -> SinkFactory:
    """A factory of RabbitMqSinks, numbering their generations."""
    generation = 0

    def build(on_delivery: DeliveryHandler) -> Sink:
        nonlocal generation
        generation += 1
        return RabbitMqSink(config, on_delivery, generation=generation, logger=logger)

    return build


def probe(config: RabbitMqConfig, timeout: float) -> list[SinkProbe]:
    """Doctor: can we connect and log in, and does the exchange exist? Changes nothing."""
    where = mask_secrets(config.url)
    try:
        conn = pika.BlockingConnection(connection_parameters(config))
    except Exception as exc:
        return [SinkProbe("rabbitmq", False, f"cannot connect to {where}: "
                          f"{mask_secrets(str(exc) or type(exc).__name__)}",
                          "check --brokers (host, port, user, password, vhost) and that RabbitMQ runs",
                          ExitCode.REFUSED if isinstance(exc, _REFUSALS) else ExitCode.UNAVAILABLE)]
    found = [SinkProbe("rabbitmq", True, f"connected to {where}")]
    try:
        channel = conn.channel()
        try:
            channel.exchange_declare(config.exchange, "topic", passive=True)
            found.append(SinkProbe("exchange", True, f"exchange {config.exchange!r} exists"))
        except pika.exceptions.ChannelClosedByBroker as exc:
            if config.declare_exchange:
                found.append(SinkProbe("exchange", None, f"exchange {config.exchange!r} does not "
                             f"exist yet ({exc.reply_text}); the relay declares it",
                             "the user needs the configure permission on it"))
            else:
                found.append(SinkProbe("exchange", False, f"exchange {config.exchange!r} does not "
                             "exist and declare_exchange=false",
                             f"declare the topic exchange {config.exchange!r} or drop declare_exchange"))
    finally:
        conn.close()
    return found
