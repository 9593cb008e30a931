"""The value schemas the user names per event type (``--value-schema``), read at start-up.

Owns reading them: ``EVENT_TYPE=FILE`` pairs, or a directory of ``<event type>.<ext>``
files (``.avsc`` for avro, ``.json`` for json-schema, ``.desc`` for protobuf: a
FileDescriptorSet, ``protoc --include_imports --descriptor_set_out=F.desc F.proto``; its
message is the first of the set's last file, or ``FILE#package.Message``). A schema that
cannot be read or parsed is a ConfigError naming the file, at start-up.

Must not: talk to the registry (cdc_relay/sink/registry/encoder.py does), or know Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_relay.errors import ConfigError

EXTENSIONS = {"avro": ".avsc", "json-schema": ".json", "protobuf": ".desc"}


@dataclass(frozen=True, slots=True)
class ValueSchema:
    """One event type's schema: ``text`` (Avro, JSON Schema) or ``message`` (a protobuf class)."""

    event_type: str
    path: Path
    text: str = ""
    message: Any = None


def load_value_schemas(message_format: str, items: tuple[tuple[str, str], ...]) -> dict[str, ValueSchema]:
    """event type -> its schema, from ``--value-schema`` items ((event type, path); an empty
    event type: a directory)."""
    found: dict[str, ValueSchema] = {}
    for event_type, location in items:
        if event_type:
            found[event_type] = _load(message_format, event_type, location)
            continue
        directory = Path(location)
        if not directory.is_dir():
            raise ConfigError(f"--value-schema {location}: not a directory; give EVENT_TYPE=FILE "
                              "or a directory of <event type>" + EXTENSIONS[message_format] + " files")
        for path in sorted(directory.glob("*" + EXTENSIONS[message_format])):
            found.setdefault(path.stem, _load(message_format, path.stem, str(path)))
    return found


def _load(message_format: str, event_type: str, location: str) -> ValueSchema:
    file, _, message_name = location.partition("#")
    path = Path(file)
    try:
        if message_format == "protobuf":
            return ValueSchema(event_type, path, message=_protobuf_class(path.read_bytes(), message_name))
        text = path.read_text(encoding="utf-8")
        _parse(message_format, text)
    except Exception as exc:  # the parsers raise their own classes: all mean "not a schema"
        raise ConfigError(f"--value-schema {event_type}={location}: cannot read a "
                          f"{message_format} schema from it: {exc}") from exc
    return ValueSchema(event_type, path, text=text)


def _parse(message_format: str, text: str) -> None:
    """Raise ValueError if ``text`` is not a schema of ``message_format``."""
    import json

    if message_format == "avro":
        from fastavro import parse_schema

        parse_schema(json.loads(text))
    else:
        from jsonschema.validators import validator_for

        schema = json.loads(text)
        validator_for(schema).check_schema(schema)


def _protobuf_class(data: bytes, name: str) -> Any:
    """The message class ``name`` (default: the first message of the last file) of the
    FileDescriptorSet ``data``."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(data).file
    if not files:
        raise ValueError("the FileDescriptorSet holds no file")
    pool = descriptor_pool.DescriptorPool()
    for proto in files:
        pool.Add(proto)
    if not name:
        last = files[-1]
        if not last.message_type:
            raise ValueError(f"{last.name} defines no message: name one with FILE#package.Message")
        name = (last.package + "." if last.package else "") + last.message_type[0].name
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
