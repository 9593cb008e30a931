"""Outbox payloads the application encoded already (``--value-encoding pre-encoded``).

Owns the pass-through of a ``bytea`` payload that holds the Confluent wire format (a zero
byte, the 4-byte big-endian schema id, the encoded data: docs/messages.md, pre-encoded
payloads), as written by ``cdc_relay.registry_outbox.emit_encoded`` or any producer-side
serializer. Both modes hand over the column's text output (``\\x`` and hex, PostgreSQL's
default ``bytea_output``); ``wire_bytes`` turns it back into the bytes and checks the
frame, ``PreEncoded`` checks once per schema id that the registry knows the id and that
its type is the one ``--message-format`` names, and keeps the answer: after an id's first
event the registry is not called again for it. The bytes are produced unchanged.

What goes wrong: no bytea hex text, no magic byte, too short, an id the registry does not
know (HTTP 404), a schema of another type: ``Unencodable`` (the event's fault, a dead
letter with one line). Registry trouble (unreachable, 5xx, 401/403): ``RegistryTrouble``
(the event waits, the id is asked again next time).

Must not: decode or re-encode the data, produce, or decide what a failure means.
"""

from __future__ import annotations

import binascii
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from cdc_relay.config import RegistryConfig
from cdc_relay.sink.registry.encoder import (
    _HTTP_MODULES,
    RegistryTrouble,
    Unencodable,
    _registry_text,
)

MAGIC = 0
_FRAME = 5  # magic byte + 4-byte schema id
# --message-format -> the registry's schemaType (AVRO when the registry leaves it out)
SCHEMA_TYPES = {"avro": "AVRO", "json-schema": "JSON", "protobuf": "PROTOBUF"}


def wire_bytes(payload: bytes) -> tuple[bytes, int]:
    """(the bytes, their schema id) of a bytea payload's text output; Unencodable when it
    is not the Confluent wire format."""
    if not payload.startswith(b"\\x"):
        if payload.startswith(b"\\"):
            raise Unencodable("--value-encoding pre-encoded: the bytea payload is in the escape "
                              "output format: set bytea_output = 'hex' (PostgreSQL's default)")
        shown = payload[:20].decode("utf-8", "replace")
        raise Unencodable(f"--value-encoding pre-encoded: the payload is not bytea (its text "
                          f"starts {shown!r}, not \\x): make the outbox's payload column bytea")
    try:
        data = binascii.unhexlify(payload[2:])
    except (binascii.Error, ValueError) as exc:
        raise Unencodable(f"--value-encoding pre-encoded: the payload is not bytea hex "
                          f"output ({exc}); set bytea_output = 'hex'") from exc
    if len(data) < _FRAME or data[0] != MAGIC:
        raise Unencodable(f"--value-encoding pre-encoded: the payload ({len(data)} bytes, first "
                          f"byte {data[:1].hex() or 'none'}) is not in the Confluent wire format "
                          "(magic byte 0, 4-byte schema id, data)")
    return data, int.from_bytes(data[1:_FRAME], "big")


class PreEncoded:
    """Passes wire-format payloads through, each schema id checked once."""

    def __init__(self, config: RegistryConfig, client: SchemaRegistryClient) -> None:
        self.config = config
        self.client = client
        self._expected = SCHEMA_TYPES[config.message_format]
        self._verdicts: dict[int, str] = {}  # schema id -> "" (fine) or why not

    def value(self, payload: bytes) -> bytes:
        """The bytes to produce for ``payload`` (see the module docstring)."""
        data, schema_id = wire_bytes(payload)
        verdict = self._verdicts.get(schema_id)
        if verdict is None:
            verdict = self._verdicts[schema_id] = self._check(schema_id)
        if verdict:
            raise Unencodable(verdict)
        return data

    def _check(self, schema_id: int) -> str:
        """"" when the registry knows ``schema_id`` as a schema of our format, else why not;
        RegistryTrouble (not remembered) when it cannot be asked; Unencodable (not
        remembered: the id may be registered later) for an unknown id."""
        try:
            schema: Any = self.client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise Unencodable(f"--value-encoding pre-encoded: the payload names schema id "
                                  f"{schema_id}, which schema registry {self.config.url} does "
                                  f"not know ({exc.error_message})") from exc
            raise RegistryTrouble(_registry_text(self.config, exc)) from exc
        except Exception as exc:
            if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in _HTTP_MODULES:
                raise RegistryTrouble(f"schema registry {self.config.url} unreachable: {exc}") from exc
            raise
        found = schema.schema_type or "AVRO"
        if found != self._expected:
            return (f"--value-encoding pre-encoded: the payload names schema id {schema_id}, a "
                    f"{found} schema, but --message-format {self.config.message_format} "
                    f"expects {self._expected}")
        return ""
