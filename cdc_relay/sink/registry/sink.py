"""A Sink that encodes outbox messages through the schema registry before the Kafka sink.

Owns the hand-over between the router (which made the message with the raw key and
value: cdc_relay/formats.py) and the Kafka sink: it encodes the key and value
(cdc_relay/sink/registry/encoder.py) and produces the result through the wrapped sink.
What goes wrong becomes the Sink protocol's ``ProduceRejected`` (docs/design.md, failure
rules): a payload that cannot be encoded is ``PERMANENT`` (a dead letter with the reason),
registry trouble ``RETRIABLE`` with ``Cause.REGISTRY`` (the event waits: WAL mode resumes
from its watermark after a backoff, polling mode releases the row without an attempt; no
position is confirmed past it). A captured table's change (a CapturedMessage) is encoded
as Debezium's AvroConverter does (cdc_relay/sink/registry/captured.py); its new schema
refused by the registry is ``SchemaRefused``, which stops the relay; the registry
refusing the credentials (401, while encoding or at the warm-up's probe) is
``AccessRefused`` (exit 6), a 403 waits with the grant it needs
(cdc_relay/sink/registry/access.py). Dead letters (the
dead-letter topic) pass as they are: raw JSON, so a dead letter never depends on the
registry.

Must not: talk to the registry itself, or decide what a failure means beyond its kind.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from cdc_relay.model import CapturedMessage, Message
from cdc_relay.sink.base import (
    BatchHandler,
    Cause,
    DeliveryError,
    DeliveryHandler,
    ErrorKind,
    ProduceRejected,
    Sink,
    SinkFactory,
)
from cdc_relay.sink.registry.access import probe, refusal
from cdc_relay.sink.registry.captured import CaptureEncoder, shared_capture_encoder
from cdc_relay.sink.registry.encoder import Encoder, RegistryTrouble, Unencodable

_log = logging.getLogger("cdc_relay.kafka")


def _event_type(message: Message) -> str:
    for name, value in message.headers:
        if name == "event_type":
            return value.decode(errors="replace")
    return ""


class RegistrySink:
    """``inner`` (a KafkaSink) with the outbox's key and value encoded by ``encoder``."""

    def __init__(self, inner: Sink, encoder: Encoder, *, probe: bool = False) -> None:
        """``probe``: check the registry's credentials at the warm-up (the factory's first
        sink: a replacement producer does not ask again)."""
        self.inner = inner
        self._encoder = encoder
        self._dead_letter_topic = encoder.config.dead_letter_topic
        self._capture: CaptureEncoder | None = None
        self._probe = probe

    def _captured(self) -> CaptureEncoder:
        """The captured tables' encoder, made at the first captured change; shared by the
        factory's sinks through the Encoder, so its schema ids outlive a producer."""
        if self._capture is None:
            self._capture = shared_capture_encoder(self._encoder)
        return self._capture

    def produce(self, message: Message, token: int) -> None:
        """Encode ``message`` and queue it; ProduceRejected when it cannot be (module docstring)."""
        if message.topic != self._dead_letter_topic:
            try:
                if type(message) is CapturedMessage:
                    key, value = self._captured().encode(message)
                else:
                    key, value = self._encoder.encode(message, _event_type(message))
            except Unencodable as exc:
                raise ProduceRejected(DeliveryError(ErrorKind.PERMANENT, str(exc))) from exc
            except RegistryTrouble as exc:
                refused = refusal(self._encoder.config, exc)
                if isinstance(refused, Exception):
                    raise refused from exc  # wrong credentials: exit 6 (access.py)
                raise ProduceRejected(DeliveryError(ErrorKind.RETRIABLE, refused or str(exc),
                                                    Cause.REGISTRY)) from exc
            message = replace(message, key=key, value=value)
        self.inner.produce(message, token)

    def poll(self, timeout: float) -> int:
        return self.inner.poll(timeout)

    def flush(self, timeout: float) -> int:
        return self.inner.flush(timeout)

    def pending(self) -> int:
        return self.inner.pending()

    def close(self, timeout: float) -> None:
        self.inner.close(timeout)

    @property
    def fatal_error(self) -> DeliveryError | None:
        return self.inner.fatal_error

    def warm_up(self, timeout: float) -> None:
        """The producer's warm-up, then (the first sink) the registry's credentials (access.py)."""
        self.inner.warm_up(timeout)
        if self._probe:
            self._probe = False
            probe(self._encoder.config, self._encoder.client)

    def set_handler(self, handler: DeliveryHandler, delivered: BatchHandler | None = None) -> None:
        self.inner.set_handler(handler, delivered)

    def __getattr__(self, name: str) -> Any:
        """The wrapped sink's other attributes (``generation``, ``refusal_code``)."""
        return getattr(self.inner, name)


def registry_sink_factory(inner: SinkFactory, encoder: Encoder,
                          logger: logging.Logger | None = None) -> SinkFactory:
    """Sinks of ``inner`` wrapped in RegistrySinks sharing ``encoder`` (its schema ids stay
    cached across producer generations)."""
    (logger or _log).info("message format %s through schema registry %s; value schemas for: %s",
                          encoder.config.message_format, encoder.config.url,
                          ", ".join(encoder.event_types) or "none")

    first = [True]

    def build(on_delivery: DeliveryHandler) -> Sink:
        sink = RegistrySink(inner(on_delivery), encoder, probe=first[0])
        first[0] = False
        return sink

    return build
