"""Encoding a captured table's change event as Debezium's AvroConverter does (docs/table-cdc.md).

Owns ``CaptureEncoder``: a CapturedMessage's key and value, made by the capture room as
JsonConverter's ``{"schema", "payload"}`` (the ``debezium-json`` form), become the
Confluent wire format of the Avro schema Kafka Connect's AvroData derives from that
schema (cdc_relay/sink/registry/connect_avro.py), through confluent-kafka's
AvroSerializer. One serializer per distinct schema (a table's key, its envelope, each
version after an ALTER TABLE), kept for the relay's life: the registry is asked once per
schema and subject, never per event. Subjects follow ``--subject-name-strategy``
(TopicNameStrategy: ``<topic>-key`` / ``<topic>-value``, as Debezium's default).

What goes wrong: a value that does not fit is ``Unencodable`` (a dead letter); registry
trouble (unreachable, 5xx, access) is ``RegistryTrouble`` (the event waits); the registry
refusing a table's new schema (HTTP 409, its compatibility rule) is ``SchemaRefused``:
the relay stops with one line naming the table, the columns and the rule, nothing past
the change confirmed, because waiting cannot make an incompatible schema compatible.

Must not: produce, or decide what happens to a failed event.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from cdc_relay.config import RegistryConfig
from cdc_relay.errors import SchemaRefused
from cdc_relay.model import CapturedMessage
from cdc_relay.sink.registry.connect_avro import avro_datum, avro_schema, columns
from cdc_relay.sink.registry.encoder import (
    _HTTP_MODULES,
    _STRATEGIES,
    Encoder,
    RegistryTrouble,
    Serializer,
    Unencodable,
    _registry_text,
    _serializer_conf,
)


def shared_capture_encoder(encoder: Encoder) -> CaptureEncoder:
    """The CaptureEncoder of ``encoder`` (its config and client), kept on it: one per
    Encoder, which the sink factory keeps across producer generations, so schema ids stay
    cached."""
    found = encoder.capture_encoder
    if not isinstance(found, CaptureEncoder):
        found = encoder.capture_encoder = CaptureEncoder(encoder.config, encoder.client)
    return found


class CaptureEncoder:
    """Key and value of captured tables' change events as registry-framed Avro."""

    def __init__(self, config: RegistryConfig, client: SchemaRegistryClient) -> None:
        self.config = config
        self.client = client
        self._conf = _serializer_conf(config)
        # Connect schema bytes -> (its Connect schema, Avro schema text, serializer)
        self._serializers: dict[bytes, tuple[dict[str, Any], str, Serializer]] = {}

    def encode(self, message: CapturedMessage) -> tuple[bytes | None, bytes | None]:
        """(key, value) of ``message``; a tombstone's value stays None."""
        key = self._encode(message, message.key, MessageField.KEY)
        return key, self._encode(message, message.value, MessageField.VALUE)

    def _encode(self, message: CapturedMessage, data: bytes | None,
                field: MessageField) -> bytes | None:
        if data is None:
            return None
        try:
            framed = orjson.loads(data)
            schema_bytes = orjson.dumps(framed["schema"])
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise Unencodable(f"the {field} of {message.aggregate_id} is not JSON with a "
                              f"schema block: {exc} (a bug, please report it)") from exc
        entry = self._serializers.get(schema_bytes)
        if entry is None:
            connect = framed["schema"]
            text = json.dumps(avro_schema(connect), separators=(",", ":"))
            entry = (connect, text, AvroSerializer(self.client, text, conf=self._conf))
            self._serializers[schema_bytes] = entry
        connect, text, serializer = entry
        context = SerializationContext(message.topic, field)
        try:
            return serializer(avro_datum(connect, framed["payload"]), context)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 409:
                raise self._refused(message, field, text, exc) from exc
            raise RegistryTrouble(_registry_text(self.config, exc)) from exc
        except (SerializationError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise Unencodable(f"the change of {message.aggregate_id} does not fit its Avro "
                              f"schema: {exc}") from exc
        except Exception as exc:
            if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in _HTTP_MODULES:
                raise RegistryTrouble(f"schema registry {self.config.url} unreachable: {exc}") from exc
            raise

    def _refused(self, message: CapturedMessage, field: MessageField, text: str,
                 exc: SchemaRegistryError) -> SchemaRefused:
        """The stop line: table, columns changed against the subject's latest version, rule."""
        avro = json.loads(text)
        subject = str(_STRATEGIES[self.config.subject_strategy](
            SerializationContext(message.topic, field),
            f"{avro.get('namespace', '')}.{avro.get('name', '')}"))
        changes = self._changes(subject, avro)
        lsn = message.id.rpartition("@")[2]
        return SchemaRefused(
            f"schema registry {self.config.url} refused the new {field} schema of captured "
            f"table {message.aggregate_id} under subject {subject} (compatibility "
            f"{self._rule(subject)}): {changes}; registry said: {exc.error_message}. Stopped "
            f"at LSN {lsn}, nothing past it confirmed. Fix: make the change compatible (a "
            "nullable column, or one with a default) or change the subject's compatibility "
            "rule (PUT /config/<subject>), then restart")

    def _changes(self, subject: str, new: dict[str, Any]) -> str:
        try:
            old = json.loads(self.client.get_latest_version(subject).schema.schema_str or "{}")
        except Exception:  # the line must be written even when the registry says no more
            return "the columns could not be compared (the latest version could not be read)"
        before, after = columns(old), columns(new)
        said = [f"column {name!r} dropped" for name in before if name not in after]
        said += [f"column {name!r} added as {after[name]}" for name in after if name not in before]
        said += [f"column {name!r} changed from {before[name]} to {after[name]}"
                 for name in after if name in before and before[name] != after[name]]
        return ", ".join(said) or "no column differs (another part of the schema did)"

    def _rule(self, subject: str) -> str:
        for scope in (subject, None):
            try:
                return str(self.client.get_compatibility(scope))
            except Exception:  # no rule at this scope: try the global one
                continue
        return "unknown: the registry did not say"
