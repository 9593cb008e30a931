"""Encoding a captured table's change event as Debezium's registry converters do (docs/table-cdc.md).

Owns ``CaptureEncoder``: a CapturedMessage's key and value, made by the capture room as
JsonConverter's ``{"schema", "payload"}`` (the ``debezium-json`` form), become the
Confluent wire format of the Avro, JSON Schema or Protobuf schema Confluent's converters
derive from that schema (cdc_relay/sink/registry/formats.py). One schema and serializer
per distinct Connect schema (a table's key, its envelope, each version after an ALTER
TABLE), kept for the relay's life: the registry is asked once per schema and subject,
never per event. Subjects follow ``--subject-name-strategy``
(TopicNameStrategy: ``<topic>-key`` / ``<topic>-value``, as Debezium's default).

What goes wrong: a value that does not fit is ``Unencodable`` (a dead letter); registry
trouble (unreachable, 5xx, access) is ``RegistryTrouble`` (the event waits); the registry
refusing a table's new schema (HTTP 409, its compatibility rule) is ``SchemaRefused``:
the relay stops with one line naming the table, the columns and the rule, nothing past
the change confirmed, because waiting cannot make an incompatible schema compatible.

Must not: produce, or decide what happens to a failed event.
"""

from __future__ import annotations

import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from cdc_relay.config import RegistryConfig
from cdc_relay.errors import SchemaRefused
from cdc_relay.model import CapturedMessage
from cdc_relay.sink.registry.encoder import (
    _HTTP_MODULES,
    _STRATEGIES,
    Encoder,
    RegistryTrouble,
    Unencodable,
    _registry_text,
    _serializer_conf,
)
from cdc_relay.sink.registry.formats import FormatSchema, format_schema


def shared_capture_encoder(encoder: Encoder) -> CaptureEncoder:
    """The CaptureEncoder of ``encoder`` (its config and client), kept on it: one per
    Encoder, which the sink factory keeps across producer generations, so schema ids stay
    cached."""
    found = encoder.capture_encoder
    if not isinstance(found, CaptureEncoder):
        found = encoder.capture_encoder = CaptureEncoder(encoder.config, encoder.client)
    return found


class CaptureEncoder:
    """Key and value of captured tables' change events as registry-framed Avro, JSON Schema
    or Protobuf (``config.message_format``)."""

    def __init__(self, config: RegistryConfig, client: SchemaRegistryClient) -> None:
        self.config = config
        self.client = client
        self._conf = _serializer_conf(config)
        # Connect schema bytes -> its schema in the format (cdc_relay/sink/registry/formats.py)
        self._schemas: dict[bytes, FormatSchema] = {}

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
        fmt = self.config.message_format
        context = SerializationContext(message.topic, field)
        try:
            schema = self._schemas.get(schema_bytes)
            if schema is None:
                schema = self._schemas[schema_bytes] = format_schema(
                    fmt, framed["schema"], self.client, self._conf)
            return schema.encode(framed["payload"], context)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 409:
                raise self._refused(message, field, schema, exc) from exc
            if exc.http_status_code == 422:  # a schema the registry cannot take, ever
                raise Unencodable(f"schema registry {self.config.url} refused the {fmt} "
                                  f"schema of {message.aggregate_id} as invalid: "
                                  f"{exc.error_message}") from exc
            raise RegistryTrouble(_registry_text(self.config, exc)) from exc
        except (SerializationError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise Unencodable(f"the change of {message.aggregate_id} does not fit its "
                              f"{fmt} schema: {exc}") from exc
        except Exception as exc:
            if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in _HTTP_MODULES:
                raise RegistryTrouble(f"schema registry {self.config.url} unreachable: {exc}") from exc
            raise

    def _refused(self, message: CapturedMessage, field: MessageField, schema: FormatSchema | None,
                 exc: SchemaRegistryError) -> SchemaRefused:
        """The stop line: table, columns changed against the subject's latest version, rule."""
        assert schema is not None  # a 409 answers a registration, which needs the schema
        subject = str(_STRATEGIES[self.config.subject_strategy](
            SerializationContext(message.topic, field), schema.record_name))
        changes = self._changes(subject, schema)
        lsn = message.id.rpartition("@")[2]
        return SchemaRefused(
            f"schema registry {self.config.url} refused the new {field} schema of captured "
            f"table {message.aggregate_id} under subject {subject} (compatibility "
            f"{self._rule(subject)}): {changes}; registry said: {exc.error_message}. Stopped "
            f"at LSN {lsn}, nothing past it confirmed. Fix: make the change compatible (a "
            "nullable column, or one with a default) or change the subject's compatibility "
            "rule (PUT /config/<subject>), then restart")

    def _changes(self, subject: str, new: FormatSchema) -> str:
        try:
            old = self.client.get_latest_version(subject).schema.schema_str or ""
            before, after = new.columns(old), new.columns(new.text)
        except Exception:  # the line must be written even when the registry says no more
            return "the columns could not be compared (the latest version could not be read)"
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
