"""The outbox's Protobuf values registered as ``.proto`` text (docs/messages.md, schema
registry): against a real Apicurio Registry a subject under BACKWARD takes a compatible new
version and refuses an incompatible one (the event waits, nothing skipped); imports are
references, the values read back by confluent-kafka's ProtobufDeserializer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_relay.local.apache_kafka import ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from cdc_relay.sink.registry.schemas import load_value_schemas
from tests.integration.test_schema_registry import by_id, emit_events, registry_args
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg, wait_for

pytestmark = pytest.mark.integration
protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools (a test dependency)")

MONEY = 'syntax = "proto3";\npackage shop.money;\nmessage Money { string currency = 1; int64 cents = 2; }\n'
ORDER = """syntax = "proto3";
package shop;
import "{money}";
import "google/protobuf/timestamp.proto";
message OrderCreated {{
  int64 id = 1;
  {note} note = 2;
  shop.money.Money total = 3;
  google.protobuf.Timestamp at = 4;
  {extra}
}}
"""
V1 = {"id": "7", "note": "grüße", "total": {"currency": "EUR", "cents": "250"}, "at": "2024-02-29T10:11:12Z"}
V2 = dict(V1, id="8", qty=3)
V3 = dict(V1, id="9", note="5")  # int64 as JSON strings, as Protobuf maps them


def descriptor_set(directory: Path, money: str, note: str = "string", extra: str = "") -> Path:
    """OrderCreated (importing ``money`` and Timestamp) compiled by protoc, imports included."""
    directory.mkdir()
    (directory / money).write_text(MONEY)
    (directory / "order.proto").write_text(ORDER.format(money=money, note=note, extra=extra))
    out = directory / "OrderCreated.desc"
    include = Path(protoc.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{directory}", f"-I{include}", "--include_imports",
                        f"--descriptor_set_out={out}", str(directory / "order.proto")]) == 0
    return out


def read(path: Path, msg: Msg, schema_id: int) -> dict[str, Any]:
    """The value as confluent-kafka's ProtobufDeserializer reads it with the schema's class
    (its Python version cannot parse the .proto text a registry hands out), the frame
    checked first: magic byte, the registered id, message index [0]."""
    from google.protobuf.json_format import MessageToDict

    value = msg.value or b""
    assert (value[0], int.from_bytes(value[1:5], "big"), value[5]) == (0, schema_id, 0)
    message = load_value_schemas("protobuf", (("OrderCreated", str(path)),))["OrderCreated"].message
    reader = ProtobufDeserializer(message, {"use.deprecated.format": False})
    return MessageToDict(reader(value, SerializationContext(msg.topic, MessageField.VALUE)))


def run_one(db: str, broker: ApacheKafka, registry: ApicurioRegistry, prefix: str, path: Path,
            payload: dict[str, Any], *extra: str) -> Msg:
    """One relay with ``path`` as OrderCreated's schema (and ``extra`` options); one event
    through it."""
    with start_relay(db, broker.bootstrap, prefix, plugin="pgoutput",
                     extra=(*registry_args(registry, "protobuf", f"OrderCreated={path}"), *extra)) as relay, \
            KafkaCollector(broker.bootstrap, prefix) as collector:
        (event,) = emit_events(db, ("o-1", "OrderCreated", payload))
        message = by_id(collector.collect(until=lambda ms: event in by_id(ms), timeout=60))[event]
        assert relay.stop() == 0, relay.stderr
    return message


def test_a_subject_under_backward_takes_a_compatible_version_and_refuses_an_incompatible_one(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    init_db(db, plugin="pgoutput")
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    subject, money = f"{topic_prefix}.order-value", f"{topic_prefix}_money.proto"
    v1 = descriptor_set(tmp_path / "v1", money)
    first = run_one(db, broker, schema_registry, topic_prefix, v1, V1)
    registered = client.get_latest_version(subject)
    assert registered.schema.schema_type == "PROTOBUF"
    assert (registered.schema.schema_str or "").startswith('syntax = "proto3";\npackage shop;\n')
    assert [(r.name, r.subject) for r in registered.schema.references or []] == [(money, money)]
    assert read(v1, first, int(registered.schema_id or 0)) == V1

    client.set_compatibility(subject, "BACKWARD")
    v2 = descriptor_set(tmp_path / "v2", money, extra="int32 qty = 5;")
    second = run_one(db, broker, schema_registry, topic_prefix, v2, V2)
    assert client.get_versions(subject) == [1, 2]
    assert read(v2, second, int(client.get_version(subject, 2).schema_id or 0)) == V2

    v3 = descriptor_set(tmp_path / "v3", money, note="int64")  # a field's type changed
    with start_relay(db, broker.bootstrap, topic_prefix, plugin="pgoutput",
                     extra=registry_args(schema_registry, "protobuf", f"OrderCreated={v3}")) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        (event,) = emit_events(db, ("o-1", "OrderCreated", V3))
        wait_for(lambda: "refused the schema as incompatible" in relay.stderr, timeout=60,
                 message="the refusal line")
        assert "the event waits" in relay.stderr
        assert event not in by_id(collector.collect(timeout=1.0))  # waits: not sent, not skipped
        assert client.get_versions(subject) == [1, 2]
        client.set_compatibility(subject, "NONE")  # the fix the line names: the rule
        third = by_id(collector.collect(until=lambda ms: event in by_id(ms), timeout=90))[event]
        assert relay.stop() == 0, relay.stderr
    assert client.get_versions(subject) == [1, 2, 3]
    assert read(v3, third, int(client.get_version(subject, 3).schema_id or 0)) == V3


def test_without_auto_registration_the_text_is_looked_up_under_the_topic_record_subject(
        db: str, broker: ApacheKafka, schema_registry: ApicurioRegistry, topic_prefix: str,
        tmp_path: Path) -> None:
    init_db(db, plugin="pgoutput")
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    path = descriptor_set(tmp_path / "v1", f"{topic_prefix}_money.proto")
    strategy = ("--subject-name-strategy", "topic-record")
    registered = run_one(db, broker, schema_registry, topic_prefix, path, V1, *strategy)
    subject = f"{topic_prefix}.order-shop.OrderCreated"
    schema_id = int(client.get_version(subject, 1).schema_id or 0)
    looked_up = run_one(db, broker, schema_registry, topic_prefix, path, dict(V1, id="8"),
                        *strategy, "--schema-registry-config", "auto.register.schemas=false")
    assert client.get_versions(subject) == [1]
    assert read(path, registered, schema_id) == V1
    assert read(path, looked_up, schema_id) == dict(V1, id="8")
