"""Message formats: how the key (aggregate id) and value (payload) become bytes (docs/messages.md).

Owns the three ``--message-format`` serializations, chosen to be byte-for-byte what a
Debezium outbox event router deployment emits for the same row, so consumers written
for Debezium keep working and the Java producer's partitioner (murmur2 of the
*serialized* key) puts an aggregate on the same partition:

* ``raw``: key = the aggregate id as UTF-8, value = the payload's JSON text as is. What
  Debezium emits with ``StringConverter`` for key and value.
* ``debezium-json``: Kafka Connect's ``JsonConverter`` with ``schemas.enable=true`` (the
  stock Debezium Connect image). The router's key is the aggregate id, a non-optional
  string; its value is the payload column, a non-optional string with the semantic type
  ``io.debezium.data.Json`` version 1 (json/jsonb columns; with the router's default
  ``table.expand.json.payload=false`` the payload stays its JSON *text*). Hence::

      key   {"schema":{"type":"string","optional":false},"payload":"<aggregate id>"}
      value {"schema":{"type":"string","optional":false,"name":"io.debezium.data.Json",
             "version":1},"payload":"<payload JSON text as a JSON string>"}

* ``debezium-json-schemaless``: ``JsonConverter`` with ``schemas.enable=false``: each is
  a JSON string, ``"<aggregate id>"`` and ``"<payload JSON text>"``.

The registry formats (``avro``, ``json-schema``, ``protobuf``) have the raw key and value
here: the Kafka sink encodes them through the schema registry (cdc_relay/sink/registry),
and a dead letter keeps these raw bytes. The CloudEvents formats (``cloudevents``,
``cloudevents-structured``) have the raw key here; their headers and envelope need the
whole event: cdc_relay/cloudevents.py.

JSON strings are escaped as Jackson (which JsonConverter uses) escapes them: ``"`` and
``\\`` with a backslash, ``\\b \\t \\n \\f \\r`` short, other characters below U+0020 as
``\\u00XX`` with upper-case hex, everything else (non-ASCII included) as raw UTF-8.
Schema fields appear in JsonConverter's order (type, optional, name, version), with no
whitespace.

Pure; must not do I/O. Encoders raise ValueError (UnicodeError) for text that has no
UTF-8 form; the router turns that into a dead letter.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["json_string", "key_encoder", "value_encoder"]

_ESCAPES: dict[int, str] = {code: f"\\u{code:04X}" for code in range(0x20)}
_ESCAPES.update({0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r",
                 0x22: '\\"', 0x5C: "\\\\"})

_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')  # what _ESCAPES changes

_KEY_HEAD = b'{"schema":{"type":"string","optional":false},"payload":'
_VALUE_HEAD = (
    b'{"schema":{"type":"string","optional":false,"name":"io.debezium.data.Json","version":1},'
    b'"payload":'
)


def json_string(text: str) -> bytes:
    """``text`` as a JSON string literal, escaped as Jackson escapes it (UTF-8 bytes)."""
    if _NEEDS_ESCAPE.search(text) is None:  # the common case: one C scan, no translate
        return ('"' + text + '"').encode()
    return ('"' + text.translate(_ESCAPES) + '"').encode()


# str.encode itself (UTF-8, strict): a C call, no Python frame per event.
_raw_key: Callable[[str], bytes] = str.encode


def _raw_value(payload: bytes) -> bytes:
    """The raw format sends the payload as it is (the router skips this call: raw_values)."""
    return payload


def _schema_key(aggregate_id: str) -> bytes:
    return _KEY_HEAD + json_string(aggregate_id) + b"}"


def _schema_value(payload: bytes) -> bytes:
    return _VALUE_HEAD + json_string(payload.decode()) + b"}"


def _schemaless_value(payload: bytes) -> bytes:
    return json_string(payload.decode())


# The CloudEvents formats keep the raw key and (binary mode) value; their attributes, and
# the structured envelope, are added by the router with cdc_relay/cloudevents.py.
_KEYS: dict[str, Callable[[str], bytes]] = {
    "raw": _raw_key,
    "cloudevents": _raw_key,
    "cloudevents-structured": _raw_key,
    "debezium-json": _schema_key,
    "debezium-json-schemaless": json_string,
    "avro": _raw_key,
    "json-schema": _raw_key,
    "protobuf": _raw_key,
}
_VALUES: dict[str, Callable[[bytes], bytes]] = {
    "raw": _raw_value,
    "cloudevents": _raw_value,
    "cloudevents-structured": _raw_value,
    "debezium-json": _schema_value,
    "debezium-json-schemaless": _schemaless_value,
    "avro": _raw_value,
    "json-schema": _raw_value,
    "protobuf": _raw_value,
}


def key_encoder(message_format: str) -> Callable[[str], bytes]:
    """aggregate id -> key bytes for ``message_format`` (a RouterConfig-validated name)."""
    return _KEYS[message_format]


def value_encoder(message_format: str) -> Callable[[bytes], bytes]:
    """payload JSON text (UTF-8) -> value bytes for ``message_format``."""
    return _VALUES[message_format]


def raw_values(message_format: str) -> bool:
    """True when ``message_format`` sends the payload unchanged (no encoder call needed)."""
    return _VALUES[message_format] is _raw_value
