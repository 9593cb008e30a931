"""Protobuf through a schema registry as ``.proto`` text, framed as Confluent's serializers frame it.

Owns three things the outbox's Protobuf values and keys (cdc_relay/sink/registry/encoder.py)
and captured tables (formats.py) share:

* ``frame``: the Confluent wire format of an encoded message: a zero byte, the 4-byte
  big-endian schema id, the message indexes (zigzag varints: their count, then each; the
  first message of the file, ``[0]``, as a single zero byte), the message;
* ``schema_id``: a schema's id under a subject: registered (``auto.register.schemas``, the
  default), looked up (``auto.register.schemas=false``) or the subject's latest version
  (``use.latest.version=true``);
* ``TextProtobufSerializer``: a drop-in for confluent-kafka's ProtobufSerializer that
  registers the message's file as ``.proto`` text (cdc_relay/sink/registry/proto_text.py)
  instead of a base64 serialized descriptor, which Apicurio Registry cannot parse when it
  checks a compatibility rule. Imported files are registered as schema references, each
  under its file name, as confluent-kafka's serializer does; Protobuf's well-known types
  and Confluent's own (``google/protobuf/``, ``google/type/``, ``confluent/``) are not
  (the registries know them). The id is kept per subject: the registry is asked once.

Registry errors (``SchemaRegistryError``, the HTTP client's) pass through: the caller sorts them.

Must not: produce, or decide what a failure means.
"""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.serialization import SerializationContext

from cdc_relay.sink.registry.proto_text import proto_text

_BUILTIN = ("google/protobuf/", "google/type/", "confluent/")


def frame(schema_id: int, indexes: list[int], body: bytes) -> bytes:
    """``body`` (an encoded message) in the Confluent wire format."""
    head = bytearray(b"\0" + schema_id.to_bytes(4, "big"))
    if indexes == [0]:
        head.append(0)
    else:
        for number in (len(indexes), *indexes):
            _varint(head, (number << 1) ^ (number >> 63))
    return bytes(head) + body


def _varint(out: bytearray, value: int) -> None:
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def message_indexes(descriptor: Any) -> list[int]:
    """Where ``descriptor`` (a message's) is in its file: top-level index, then nested ones."""
    found: list[int] = []
    current = descriptor
    while current.containing_type is not None:
        parent = current.containing_type
        found.insert(0, list(parent.nested_types).index(current))
        current = parent
    found.insert(0, list(current.file.message_types_by_name.values()).index(current))
    return found


def schema_id(client: SchemaRegistryClient, conf: dict[str, Any], subject: str, schema: Schema) -> int:
    """The id of ``schema`` under ``subject``, as ``conf``'s serializer settings say."""
    normalize = bool(conf.get("normalize.schemas", False))
    if conf.get("use.latest.version", False):
        return int(client.get_latest_version(subject).schema_id or 0)
    if conf.get("auto.register.schemas", True):
        return int(client.register_schema(subject, schema, normalize_schemas=normalize))
    return int(client.lookup_schema(subject, schema, normalize_schemas=normalize).schema_id or 0)


class TextProtobufSerializer:
    """``(message, context) -> bytes`` for messages of ``message_class``, registered as text."""

    def __init__(self, message_class: Any, client: SchemaRegistryClient, conf: dict[str, Any]) -> None:
        self.message_class = message_class
        self.client = client
        self.conf = conf
        descriptor = message_class.DESCRIPTOR
        self.full_name = str(descriptor.full_name)
        self.indexes = message_indexes(descriptor)
        self.text = proto_text(_file_proto(descriptor.file))  # ValueError: not printable
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, message: Any, context: SerializationContext) -> bytes | None:
        if message is None:
            return None
        if not isinstance(message, self.message_class):
            raise ValueError(f"message must be of type {self.message_class.__name__}, not "
                             f"{type(message).__name__}")
        strategy = self.conf["subject.name.strategy"]
        subject = str(strategy(context, self.full_name))
        found = self._ids.get(subject)
        if found is None:
            with self._lock:
                references = self._references(self.message_class.DESCRIPTOR.file)
                schema = Schema(self.text, "PROTOBUF", references)
                found = self._ids[subject] = schema_id(self.client, self.conf, subject, schema)
        return frame(found, self.indexes, message.SerializeToString())

    def _references(self, file: Any) -> list[SchemaReference]:
        """``file``'s imports (but the well-known ones) as references, registered (or looked
        up) under their file names first, depth first."""
        found = []
        normalize = bool(self.conf.get("normalize.schemas", False))
        for dependency in file.dependencies:
            if dependency.name.startswith(_BUILTIN):
                continue
            schema = Schema(proto_text(_file_proto(dependency)), "PROTOBUF",
                            self._references(dependency))
            if self.conf.get("auto.register.schemas", True):
                self.client.register_schema(dependency.name, schema, normalize_schemas=normalize)
            registered = self.client.lookup_schema(dependency.name, schema, normalize_schemas=normalize)
            found.append(SchemaReference(dependency.name, dependency.name, registered.version))
        return found


def _file_proto(file: Any) -> Any:
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return proto
