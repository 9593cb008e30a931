"""Kafka Connect schemas (JsonConverter's schema block) as Protobuf, the way Confluent's
ProtobufData does for Debezium's ``ProtobufConverter`` (its defaults: no wrappers for
optional fields, no enhanced schema support).

Owns the translation for captured tables (docs/table-cdc.md, registry formats):
``proto_schema`` turns the Connect schema that ``debezium-json`` writes beside the payload
(cdc_relay/capture/envelope.py) into

* the ``.proto`` text Confluent's ProtobufSchema prints for it, which is what the
  converter registers: ``syntax = "proto3"``, the Connect name's namespace as the
  package, the rest as the message (``Envelope``, ``Key``); a struct field's type is a
  message nested where it is first met (``Value`` in ``Envelope``,
  ``VariableScaleDecimal`` in ``Value``) and named by it afterwards; fields numbered
  1, 2, … in order; proto3 fields without labels (a null is an unset field), arrays
  ``repeated``; int8/int16 ``int32`` with ``connect.type`` in ``confluent.field_meta``,
  Connect's ``Decimal`` a ``confluent.type.Decimal`` with ``precision``/``scale``;
* the FileDescriptorProto of the same file, from which ``message_class`` builds the
  runtime class (google.protobuf's descriptor pool: no protoc).

``fill`` puts the payload (JsonConverter's form) into a message: bytes decoded from
base64, a decimal as ``confluent.type.Decimal`` (unscaled big-endian bytes, the number's
precision and scale, as Confluent's DecimalUtils writes it). What Protobuf cannot hold
(a NULL array element, a map, Connect's Date/Time/Timestamp) is a ValueError naming it.

Must not: talk to the registry or Kafka (pure data).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from cdc_relay.sink.registry.connect_avro import DECIMAL

_DECIMAL_FILE = "confluent/type/decimal.proto"
_SCALARS = {"int8": "int32", "int16": "int32", "int32": "int32", "int64": "int64",
            "float32": "float", "float64": "double", "boolean": "bool", "string": "string",
            "bytes": "bytes"}
_F = descriptor_pb2.FieldDescriptorProto
_PROTO_TYPES = {"int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "float": _F.TYPE_FLOAT,
                "double": _F.TYPE_DOUBLE, "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING,
                "bytes": _F.TYPE_BYTES}


@dataclass
class _Message:
    name: str
    full: str  # its full Protobuf name, for the descriptor
    lines: list[str] = field(default_factory=list)
    nested: list[_Message] = field(default_factory=list)
    proto: descriptor_pb2.DescriptorProto = field(default_factory=descriptor_pb2.DescriptorProto)


@dataclass(frozen=True)
class ProtoSchema:
    """One Connect schema as Protobuf: the registered ``text``, the ``file`` descriptor,
    the message's full name."""

    text: str
    file: descriptor_pb2.FileDescriptorProto
    full_name: str


def proto_schema(connect: dict[str, Any]) -> ProtoSchema:
    """The Protobuf schema of the (struct) Connect schema ``connect``."""
    if connect.get("type") != "struct":
        raise ValueError(f"a {connect.get('type')} key or value has no Protobuf message form")
    package, _, name = (connect.get("name") or "ConnectDefault1").rpartition(".")
    builder = _Builder(package)
    top = builder.message(connect, name, "." + ".".join(p for p in (package, name) if p))
    file = descriptor_pb2.FileDescriptorProto(name=f"{package or name}.{name}.proto",
                                              package=package, syntax="proto3")
    if builder.decimal:
        file.dependency.append(_DECIMAL_FILE)
    file.message_type.append(top.proto)
    head = ['syntax = "proto3";'] + ([f"package {package};"] if package else [])
    if builder.decimal:
        head += ["", f'import "{_DECIMAL_FILE}";']
    text = "\n".join([*head, "", *_render(top)]) + "\n"
    return ProtoSchema(text, file, top.full.lstrip("."))


def _render(message: _Message) -> list[str]:
    out = [f"message {message.name} {{"] + ["  " + line for line in message.lines]
    if message.nested:
        out.append("")
        for nested in message.nested:
            out += ["  " + line for line in _render(nested)]
    return [*out, "}"]


class _Builder:
    """One translation: the messages already defined (by Connect name), the imports."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.defined: dict[str, str] = {}  # Connect name -> full Protobuf name
        self.decimal = False

    def message(self, connect: dict[str, Any], name: str, full: str) -> _Message:
        out = _Message(name, full)
        out.proto.name = name
        self.defined[connect.get("name") or full] = full
        for number, item in enumerate(connect.get("fields", []), start=1):
            self._field(out, item, number)
        return out

    def _field(self, parent: _Message, item: dict[str, Any], number: int) -> None:
        repeated, kind = False, item
        if item["type"] == "array":
            repeated, kind = True, item["items"]
        text_type, proto = self._type(parent, kind, item["field"])
        proto.name, proto.number = item["field"], number
        proto.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
        parent.proto.field.append(proto)
        line = f"{'repeated ' if repeated else ''}{text_type} {item['field']} = {number}"
        meta = _meta(kind)
        if meta:
            line += " [(confluent.field_meta) = {"
            parent.lines += [line, "  params: ["]
            parent.lines += ",\n".join(meta).split("\n")
            parent.lines += ["  ]", "}];"]
        else:
            parent.lines.append(line + ";")

    def _type(self, parent: _Message, kind: dict[str, Any], column: str
              ) -> tuple[str, descriptor_pb2.FieldDescriptorProto]:
        name = kind.get("name")
        if name == DECIMAL:
            self.decimal = True
            return "confluent.type.Decimal", _F(type=_F.TYPE_MESSAGE, type_name=".confluent.type.Decimal")
        if name and name.startswith("org.apache.kafka.connect.data."):
            raise ValueError(f"column {column!r}: Connect's {name} has no Protobuf form here; "
                             "use Debezium's default time.precision.mode (adaptive)")
        if kind["type"] in ("array", "map"):
            raise ValueError(f"column {column!r}: a {kind['type']} of {kind['type']}s or a map "
                             "has no Protobuf form here")
        if kind["type"] != "struct":
            scalar = _SCALARS[kind["type"]]
            return scalar, _F(type=_PROTO_TYPES[scalar])
        short = (name or f"{column}Struct").rpartition(".")[2]
        full = self.defined.get(name or "")
        if full is None:
            nested = self.message(kind, short, f"{parent.full}.{short}")
            parent.nested.append(nested)
            parent.proto.nested_type.append(nested.proto)
            full = nested.full
        return short, _F(type=_F.TYPE_MESSAGE, type_name=full)


def _meta(kind: dict[str, Any]) -> list[str]:
    """``confluent.field_meta`` params, as the printer writes them (decimals value first)."""
    if kind.get("name") == DECIMAL:
        parameters = kind.get("parameters", {})
        found = [(key, parameters[param]) for key, param in (
            ("precision", "connect.decimal.precision"), ("scale", "scale")) if param in parameters]
        return [f'    {{\n      value: "{value}",\n      key: "{key}"\n    }}' for key, value in found]
    if kind["type"] in ("int8", "int16"):
        return [f'    {{\n      key: "connect.type",\n      value: "{kind["type"]}"\n    }}']
    return []


def message_class(schema: ProtoSchema) -> Any:
    """The runtime message class of ``schema``, from its descriptor (no protoc)."""
    from confluent_kafka.schema_registry.confluent.type import decimal_pb2

    pool = descriptor_pool.DescriptorPool()
    if _DECIMAL_FILE in schema.file.dependency:
        decimal = descriptor_pb2.FileDescriptorProto()
        decimal_pb2.DESCRIPTOR.CopyToProto(decimal)
        pool.Add(decimal)
    pool.Add(schema.file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.full_name))


def fill(message: Any, connect: dict[str, Any], value: dict[str, Any]) -> Any:
    """``message`` with the struct payload ``value`` (JsonConverter's form) set in it."""
    for item in connect.get("fields", []):
        name, got = item["field"], value.get(item["field"])
        if got is None:
            continue
        if item["type"] == "array":
            if any(element is None for element in got):
                raise ValueError(f"column {name!r} holds a NULL array element, which a "
                                 "Protobuf repeated field cannot hold")
            target = getattr(message, name)
            for element in got:
                if item["items"]["type"] == "struct" or item["items"].get("name") == DECIMAL:
                    _set_message(target.add(), item["items"], element)
                else:
                    target.append(_scalar(item["items"], element))
        elif item["type"] == "struct" or item.get("name") == DECIMAL:
            _set_message(getattr(message, name), item, got)
        else:
            setattr(message, name, _scalar(item, got))
    return message


def _set_message(target: Any, connect: dict[str, Any], value: Any) -> None:
    if connect.get("name") == DECIMAL:
        data = base64.b64decode(value)
        unscaled = int.from_bytes(data, "big", signed=True)
        target.value = data
        target.precision = len(str(abs(unscaled)))
        target.scale = int(connect.get("parameters", {}).get("scale", "0"))
        return
    target.SetInParent()  # present even when all its fields are null
    fill(target, connect, value)


def _scalar(connect: dict[str, Any], value: Any) -> Any:
    if connect["type"] == "bytes":
        return base64.b64decode(value)
    if connect["type"] in ("float32", "float64") and isinstance(value, str):
        return float(value)  # "NaN", "Infinity", "-Infinity" as JsonConverter writes them
    return value
