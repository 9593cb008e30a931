"""The RegistrySink (cdc_relay/sink/registry/sink.py) turns what the encoder says into the
Sink protocol's answers: a dead letter for an unencodable payload, a wait for registry
trouble, dead letters passed through as they are. Fakes only: no registry, no broker."""

from __future__ import annotations

from typing import Any, cast

import pytest

from cdc_relay.config import RegistryConfig, split_registry_config
from cdc_relay.errors import ConfigError, ExitCode, SchemaRefused
from cdc_relay.model import CapturedMessage, Message
from cdc_relay.sink.base import Cause, ErrorKind, ProduceRejected, Sink
from cdc_relay.sink.registry.captured import CaptureEncoder
from cdc_relay.sink.registry.encoder import Encoder, RegistryTrouble, Unencodable
from cdc_relay.sink.registry.sink import RegistrySink

CONFIG = RegistryConfig(url="http://registry", message_format="avro",
                        value_schemas=(("OrderCreated", "x.avsc"),), dead_letter_topic="dlq")


class FakeEncoder:
    config = CONFIG

    def __init__(self, outcome: Exception | None = None) -> None:
        self.outcome = outcome
        self.calls: list[str] = []

    def encode(self, message: Message, event_type: str) -> tuple[bytes, bytes]:
        self.calls.append(event_type)
        if self.outcome is not None:
            raise self.outcome
        return b"K" + (message.key or b""), b"V" + (message.value or b"")


class FakeSink:
    def __init__(self) -> None:
        self.produced: list[tuple[Message, int]] = []

    def produce(self, message: Message, token: int) -> None:
        self.produced.append((message, token))


def sink_with(encoder: FakeEncoder) -> tuple[RegistrySink, FakeSink]:
    inner = FakeSink()
    return RegistrySink(cast(Sink, inner), cast(Encoder, encoder)), inner


def outbox_message(topic: str = "outbox.event.order") -> Message:
    return Message(topic, b"o-1", b'{"id": 1}', [("id", b"e-1"), ("event_type", b"OrderCreated")])


def test_an_encoded_message_goes_to_the_kafka_sink_with_the_encoders_key_and_value() -> None:
    encoder = FakeEncoder()
    sink, inner = sink_with(encoder)
    sink.produce(outbox_message(), 7)
    ((message, token),) = inner.produced
    assert (message.key, message.value, token) == (b"Ko-1", b'V{"id": 1}', 7)
    assert encoder.calls == ["OrderCreated"]


def test_an_unencodable_payload_is_a_permanent_refusal_so_a_dead_letter() -> None:
    sink, inner = sink_with(FakeEncoder(Unencodable("the payload does not fit")))
    with pytest.raises(ProduceRejected) as refused:
        sink.produce(outbox_message(), 1)
    assert refused.value.error.kind is ErrorKind.PERMANENT
    assert "does not fit" in refused.value.error.reason
    assert inner.produced == []


def test_registry_trouble_is_retriable_with_the_registry_cause_so_the_event_waits() -> None:
    sink, inner = sink_with(FakeEncoder(RegistryTrouble("unreachable")))
    with pytest.raises(ProduceRejected) as refused:
        sink.produce(outbox_message(), 1)
    assert (refused.value.error.kind, refused.value.error.cause) == (ErrorKind.RETRIABLE, Cause.REGISTRY)
    assert inner.produced == []


def test_a_dead_letter_passes_as_the_router_made_it_without_the_registry() -> None:
    encoder = FakeEncoder(RegistryTrouble("unreachable"))
    sink, inner = sink_with(encoder)
    sink.produce(outbox_message("dlq"), 3)
    assert [m.value for m, _ in inner.produced] == [b'{"id": 1}']
    assert encoder.calls == []


def test_registry_settings_split_into_the_clients_and_the_serializers() -> None:
    client, serializer = split_registry_config(
        ["basic.auth.user.info=u:p", "auto.register.schemas=false", "ssl.ca.location=/ca.pem"])
    assert client == {"basic.auth.user.info": "u:p", "ssl.ca.location": "/ca.pem"}
    assert serializer == {"auto.register.schemas": "false"}


@pytest.mark.parametrize(("changes", "says"), [
    ({"value_schemas": ()}, "needs --value-schema"),
    ({"url": " "}, "needs --schema-registry URL"),
    ({"subject_strategy": "bogus"}, "unknown subject name strategy"),
    ({"message_format": "raw"}, "goes with --message-format"),
])
def test_an_incomplete_registry_configuration_is_one_line_naming_the_fix(
        changes: dict[str, Any], says: str) -> None:
    fields: dict[str, Any] = {"url": "http://r", "message_format": "avro",
                              "value_schemas": (("A", "a.avsc"),), **changes}
    with pytest.raises(ConfigError, match=says):
        RegistryConfig(**fields)


class RefusingCaptureEncoder(CaptureEncoder):
    def __init__(self) -> None:  # no client: it refuses before asking one
        self.seen: list[CapturedMessage] = []

    def encode(self, message: CapturedMessage) -> tuple[bytes | None, bytes | None]:
        self.seen.append(message)
        raise SchemaRefused("refused the new value schema of captured table public.items")


def test_a_captured_change_goes_through_the_capture_encoder_and_a_refusal_stops_the_relay() -> None:
    encoder = FakeEncoder()
    capture = RefusingCaptureEncoder()
    encoder.capture_encoder = capture  # type: ignore[attr-defined]
    sink, inner = sink_with(encoder)
    change = CapturedMessage("shop.public.items", b'{"schema":{},"payload":{}}', b"{}",
                             id="public.items@0/10", event_type="c", aggregate_id="public.items")
    with pytest.raises(SchemaRefused) as raised:  # not a ProduceRejected: nothing retries it
        sink.produce(change, 3)
    assert raised.value.exit_code == ExitCode.DATA
    assert capture.seen == [change] and encoder.calls == [] and inner.produced == []


def test_captured_tables_alone_need_no_value_schema() -> None:
    RegistryConfig(url="http://r", message_format="avro", outbox=False)
    with pytest.raises(ConfigError, match="needs --value-schema"):
        RegistryConfig(url="http://r", message_format="avro")
