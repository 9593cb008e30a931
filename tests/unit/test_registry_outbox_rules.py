"""The pure rules of the outbox's registry options: pre-encoded frames and their schema-id
check once per id (cdc_relay/sink/registry/pre_encoded.py), struct keys
(struct_key.py), access refusals (access.py), the options' validation, and
``emit_encoded``'s checks before any statement. Fakes only: no registry, no database."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdc_relay.config import RegistryConfig
from cdc_relay.errors import AccessRefused, ConfigError, ExitCode
from cdc_relay.model import Message
from cdc_relay.outbox_core import emit_bytes_steps
from cdc_relay.outbox_encoded import encode_payload
from cdc_relay.sink.registry.access import refusal, refused_line
from cdc_relay.sink.registry.encoder import RegistryTrouble, Unencodable
from cdc_relay.sink.registry.outbox_encoder import OutboxEncoder
from cdc_relay.sink.registry.pre_encoded import PreEncoded, wire_bytes

PRE = RegistryConfig(url="http://user:hunter2@registry", message_format="avro",
                     value_encoding="pre-encoded")
FRAME = b"\x00" + (42).to_bytes(4, "big") + b"\x02\x0e"


def hex_text(data: bytes) -> bytes:
    """A bytea column's text output, as both modes hand the payload over."""
    return b"\\x" + data.hex().encode()


class FakeSchema:
    def __init__(self, schema_type: str | None) -> None:
        self.schema_type = schema_type


class FakeClient:
    """get_schema answers from ``known`` (id -> schema type), else raises ``missing``."""

    def __init__(self, known: dict[int, str | None], missing: Exception | None = None) -> None:
        self.known = known
        self.missing = missing or SchemaRegistryError(404, 40403, "Schema not found")
        self.asked: list[int] = []

    def get_schema(self, schema_id: int) -> FakeSchema:
        self.asked.append(schema_id)
        if schema_id in self.known:
            return FakeSchema(self.known[schema_id])
        raise self.missing


def pre_encoded(client: FakeClient, config: RegistryConfig = PRE) -> PreEncoded:
    return PreEncoded(config, cast(SchemaRegistryClient, client))


def test_a_bytea_payload_in_the_wire_format_passes_through_unchanged() -> None:
    assert wire_bytes(hex_text(FRAME)) == (FRAME, 42)


@pytest.mark.parametrize(("payload", "reason"), [
    (b'{"id": 1}', "is not bytea"),
    (b"\\xzz", "is not bytea hex output"),
    (b"\\000\\000", "set bytea_output = 'hex'"),
    (hex_text(b"\x01" + FRAME[1:]), "first byte 01"),
    (hex_text(b"\x00\x00"), "(2 bytes"),
])
def test_a_payload_that_is_not_the_wire_format_is_unencodable_with_one_line(
        payload: bytes, reason: str) -> None:
    with pytest.raises(Unencodable, match="--value-encoding pre-encoded") as caught:
        wire_bytes(payload)
    assert reason in str(caught.value) and "\n" not in str(caught.value)


def test_the_registry_is_asked_once_per_schema_id_and_never_again() -> None:
    client = FakeClient({42: "AVRO", 43: None})  # a registry may leave AVRO's type out
    encoder = pre_encoded(client)
    other = b"\x00" + (43).to_bytes(4, "big") + b"\x00"
    for _ in range(3):
        assert encoder.value(hex_text(FRAME)) == FRAME
        assert encoder.value(hex_text(other)) == other
    assert client.asked == [42, 43]


def test_an_unknown_schema_id_is_a_dead_letter_and_asked_again_later() -> None:
    client = FakeClient({})
    encoder = pre_encoded(client)
    for _ in range(2):
        with pytest.raises(Unencodable, match="names schema id 42, which schema registry"):
            encoder.value(hex_text(FRAME))
    assert client.asked == [42, 42]  # it may be registered meanwhile


def test_a_schema_of_another_format_is_a_dead_letter_decided_once() -> None:
    client = FakeClient({42: "PROTOBUF"})
    encoder = pre_encoded(client)
    for _ in range(2):
        with pytest.raises(Unencodable, match="a PROTOBUF schema, but --message-format avro"):
            encoder.value(hex_text(FRAME))
    assert client.asked == [42]


def test_registry_trouble_while_checking_an_id_waits_and_is_not_remembered() -> None:
    client = FakeClient({}, missing=ConnectionRefusedError(111, "Connection refused"))
    encoder = pre_encoded(client)
    with pytest.raises(RegistryTrouble, match="unreachable"):
        encoder.value(hex_text(FRAME))
    client.known[42] = "AVRO"
    assert encoder.value(hex_text(FRAME)) == FRAME


def test_refused_credentials_while_encoding_are_access_refused_with_the_fix_and_no_password() -> None:
    trouble = RegistryTrouble("refused")
    trouble.__cause__ = SchemaRegistryError(401, -1, "Unknown Schema Registry Error: b'<html>'")
    refused = refusal(PRE, trouble)
    assert isinstance(refused, AccessRefused) and refused.exit_code == ExitCode.REFUSED
    line = str(refused)
    assert "(HTTP 401;" in line and "Fix: check basic.auth.user.info" in line
    assert "<html>" not in line and "retrying cannot fix this" in line
    assert "hunter2" not in line and "http://user:***@registry" in line


def test_a_forbidden_subject_waits_with_the_grant_it_needs() -> None:
    trouble = RegistryTrouble("refused")
    trouble.__cause__ = SchemaRegistryError(403, 40301, "User cannot access the resource")
    line = refusal(PRE, trouble)
    assert isinstance(line, str)
    assert "(HTTP 403: User cannot access the resource;" in line and "the event waits" in line
    assert "hunter2" not in line


def test_other_registry_trouble_is_no_access_refusal() -> None:
    trouble = RegistryTrouble("5xx")
    trouble.__cause__ = SchemaRegistryError(503, 50003, "busy")
    assert refusal(PRE, trouble) is None
    assert "bearer.auth.token" in refused_line(
        RegistryConfig(url="http://r", message_format="avro", value_encoding="pre-encoded",
                       client_config={"bearer.auth.token": "t"}), 401, "no")


def test_pre_encoded_needs_no_value_schema_and_refuses_one() -> None:
    assert PRE.value_schemas == ()
    with pytest.raises(ConfigError, match="drop --value-schema"):
        RegistryConfig(url="http://r", message_format="avro", value_encoding="pre-encoded",
                       value_schemas=(("A", "a.avsc"),))
    with pytest.raises(ConfigError, match="unknown value encoding"):
        RegistryConfig(url="http://r", message_format="avro", value_encoding="bytes",
                       value_schemas=(("A", "a.avsc"),))


def key_config(tmp_path: Path, schema: dict[str, Any] | str) -> RegistryConfig:
    path = tmp_path / "Key.avsc"
    path.write_text(schema if isinstance(schema, str) else json.dumps(schema))
    return RegistryConfig(url="http://r", message_format="avro", value_encoding="pre-encoded",
                          key_schema=str(path))


def test_a_struct_key_that_is_not_json_is_a_dead_letter_naming_the_key(tmp_path: Path) -> None:
    record = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]}
    encoder = OutboxEncoder(key_config(tmp_path, record),
                            cast(SchemaRegistryClient, FakeClient({42: "AVRO"})))
    message = Message("t", b"o-1", hex_text(FRAME), [])
    with pytest.raises(Unencodable, match="is not the JSON of the --key-schema"):
        encoder.encode(message, "OrderCreated")


def test_a_key_schema_that_is_no_schema_is_one_line_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--key-schema .*Key\.avsc: cannot read a avro schema"):
        OutboxEncoder(key_config(tmp_path, "{not json"),
                      cast(SchemaRegistryClient, FakeClient({})))


def test_emit_encoded_refuses_what_is_not_the_wire_format_before_any_statement() -> None:
    with pytest.raises(ValueError, match="did not return the Confluent wire format"):
        encode_payload(lambda value, ctx: b'{"id": 1}', {"id": 1}, "t")
    assert encode_payload(lambda value, ctx: FRAME, {"id": 1}, "t") == FRAME
    with pytest.raises(TypeError, match="must be bytes"):
        emit_bytes_steps("a", "1", "E", cast(bytes, "text"), style="format", where=lambda: "db")


def test_the_bytes_steps_insert_the_bytes_as_they_are() -> None:
    steps = emit_bytes_steps("order", "o-1", "OrderCreated", FRAME, style="format",
                             where=lambda: "db", traceparent=None)
    query = next(steps)
    params = cast(tuple[Any, ...], query.params)
    assert isinstance(params[0], uuid.UUID) and params[1:] == ("order", "o-1", "OrderCreated", FRAME)
    assert query.text.startswith('INSERT INTO "public"."outbox_events"')
