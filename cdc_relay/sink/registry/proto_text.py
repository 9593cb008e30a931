"""A FileDescriptorProto printed as ``.proto`` source text (no protoc at run time).

Owns ``proto_text``: the text a schema registry parses for an outbox ``.desc`` schema
(docs/messages.md, schema registry). Apicurio Registry checks a compatibility rule on
``.proto`` text only (a serialized descriptor, which confluent-kafka's ProtobufSerializer
registers, it cannot parse), so the relay registers this text instead. Printed: syntax
(proto2, proto3), package, imports (public, weak), the standard options of every element,
messages (nested in descriptor order, so message indexes stay those of the descriptor),
enums, fields with their labels (proto2 ``optional``/``required``/``repeated``, proto3
``optional``), defaults, custom ``json_name``, maps, oneofs, reserved numbers and names,
extension ranges, ``extend`` blocks and services. Type names are printed fully qualified
(without the leading dot). Editions files and proto2 groups are refused (ValueError).
Custom options (extensions of the options messages) are not printed: they do not change
the wire format.

Must not: talk to the registry, or know Kafka (pure data).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {_F.TYPE_DOUBLE: "double", _F.TYPE_FLOAT: "float", _F.TYPE_INT64: "int64",
            _F.TYPE_UINT64: "uint64", _F.TYPE_INT32: "int32", _F.TYPE_FIXED64: "fixed64",
            _F.TYPE_FIXED32: "fixed32", _F.TYPE_BOOL: "bool", _F.TYPE_STRING: "string",
            _F.TYPE_BYTES: "bytes", _F.TYPE_UINT32: "uint32", _F.TYPE_SFIXED32: "sfixed32",
            _F.TYPE_SFIXED64: "sfixed64", _F.TYPE_SINT32: "sint32", _F.TYPE_SINT64: "sint64"}
_LABELS = {_F.LABEL_OPTIONAL: "optional ", _F.LABEL_REQUIRED: "required ",
           _F.LABEL_REPEATED: "repeated "}
_FIELD_MAX = 536870912  # exclusive end of "N to max" in a message's ranges (2^29)
_ENUM_MAX = 2147483647  # inclusive end of "N to max" in an enum's reserved ranges
_INDENT = "  "


def proto_text(file: descriptor_pb2.FileDescriptorProto) -> str:
    """The ``.proto`` source of ``file``; ValueError for what has no printed form here."""
    syntax = file.syntax or "proto2"
    if syntax not in ("proto2", "proto3"):
        raise ValueError(f"{file.name}: {syntax} files cannot be printed as .proto text here; "
                         "use syntax proto2 or proto3")
    printer = _Printer(syntax == "proto3")
    out = [f'syntax = "{syntax}";']
    if file.package:
        out.append(f"package {file.package};")
    imports = []
    for index, dependency in enumerate(file.dependency):
        kind = ("public " if index in file.public_dependency
                else "weak " if index in file.weak_dependency else "")
        imports.append(f'import {kind}"{dependency}";')
    options = _options(file.options)
    for block in (imports, options):
        if block:
            out += ["", *block]
    for message in file.message_type:
        out += ["", *printer.message(message)]
    for enum in file.enum_type:
        out += ["", *_enum(enum)]
    for block in _extends(printer, file.extension):
        out += ["", *block]
    for service in file.service:
        out += ["", *_service(service)]
    return "\n".join(out) + "\n"


class _Printer:
    def __init__(self, proto3: bool) -> None:
        self.proto3 = proto3

    def message(self, message: descriptor_pb2.DescriptorProto) -> list[str]:
        entries = {nested.name: nested for nested in message.nested_type if nested.options.map_entry}
        body = _options(message.options)
        body += self._fields(message, entries)
        for nested in message.nested_type:
            if not nested.options.map_entry:
                body += self.message(nested)
        for enum in message.enum_type:
            body += _enum(enum)
        for block in _extends(self, message.extension):
            body += block
        body += [f"extensions {_ranges(message.extension_range, _FIELD_MAX)};"
                 ] if message.extension_range else []
        body += _reserved(message.reserved_range, message.reserved_name, _FIELD_MAX)
        return _block(f"message {message.name}", body)

    def _fields(self, message: descriptor_pb2.DescriptorProto,
                entries: dict[str, descriptor_pb2.DescriptorProto]) -> list[str]:
        """The fields in order, a (real) oneof's fields in its block where its first is."""
        out: list[str] = []
        done: set[int] = set()
        for field in message.field:
            real = field.HasField("oneof_index") and not field.proto3_optional
            if not real:
                out.append(self.field(field, entries))
            elif field.oneof_index not in done:
                done.add(field.oneof_index)
                oneof = message.oneof_decl[field.oneof_index]
                members = [self.field(member, entries, in_oneof=True) for member in message.field
                           if member.HasField("oneof_index")
                           and member.oneof_index == field.oneof_index]
                out += _block(f"oneof {oneof.name}", _options(oneof.options) + members)
        return out

    def field(self, field: descriptor_pb2.FieldDescriptorProto,
              entries: dict[str, descriptor_pb2.DescriptorProto], in_oneof: bool = False) -> str:
        """One field's line."""
        if field.type == _F.TYPE_GROUP:
            raise ValueError(f"field {field.name}: proto2 groups cannot be printed as .proto "
                             "text here; use a message field")
        entry = entries.get(field.type_name.rpartition(".")[2]) if (
            field.type == _F.TYPE_MESSAGE and field.label == _F.LABEL_REPEATED) else None
        if entry is not None:
            key, value = entry.field[0], entry.field[1]
            head = f"map<{_type(key)}, {_type(value)}>"
        else:
            head = _label(field, self.proto3, in_oneof) + _type(field)
        return f"{head} {field.name} = {field.number}{_field_options(field)};"


def _label(field: descriptor_pb2.FieldDescriptorProto, proto3: bool, in_oneof: bool) -> str:
    if in_oneof:
        return ""
    if proto3:
        if field.label == _F.LABEL_REPEATED:
            return "repeated "
        return "optional " if field.proto3_optional else ""
    return _LABELS[field.label]


def _type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type in _SCALARS:
        return _SCALARS[field.type]
    return str(field.type_name).lstrip(".")


def _field_options(field: descriptor_pb2.FieldDescriptorProto) -> str:
    found = []
    if field.HasField("default_value"):
        found.append(f"default = {_default(field)}")
    if field.HasField("json_name") and field.json_name != _json_name(field.name):
        found.append(f"json_name = {_quoted(field.json_name)}")
    found += [f"{name} = {value}" for name, value in _option_values(field.options)]
    return f" [{', '.join(found)}]" if found else ""


def _default(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type == _F.TYPE_STRING:
        return _quoted(field.default_value)
    if field.type == _F.TYPE_BYTES:  # the descriptor holds it C-escaped already
        return f'"{field.default_value}"'
    return str(field.default_value)  # numbers, true/false, an enum value's name, inf/nan


def _json_name(name: str) -> str:
    """protoc's default JSON name: underscores dropped, the letter after one upper-cased."""
    out, upper = [], False
    for char in name:
        if char == "_":
            upper = True
        else:
            out.append(char.upper() if upper else char)
            upper = False
    return "".join(out)


def _enum(enum: descriptor_pb2.EnumDescriptorProto) -> list[str]:
    body = _options(enum.options)
    for value in enum.value:
        options = ", ".join(f"{name} = {text}" for name, text in _option_values(value.options))
        body.append(f"{value.name} = {value.number}{f' [{options}]' if options else ''};")
    body += _reserved(enum.reserved_range, enum.reserved_name, _ENUM_MAX, inclusive=True)
    return _block(f"enum {enum.name}", body)


def _extends(printer: _Printer, fields: Iterable[descriptor_pb2.FieldDescriptorProto]
             ) -> list[list[str]]:
    """``extend`` blocks, one per extendee in the order first met."""
    by_extendee: dict[str, list[str]] = {}
    for field in fields:
        by_extendee.setdefault(field.extendee.lstrip("."), []).append(printer.field(field, {}))
    return [_block(f"extend {extendee}", lines) for extendee, lines in by_extendee.items()]


def _service(service: descriptor_pb2.ServiceDescriptorProto) -> list[str]:
    body = _options(service.options)
    for method in service.method:
        head = (f"rpc {method.name} ({'stream ' if method.client_streaming else ''}"
                f"{method.input_type.lstrip('.')}) returns ("
                f"{'stream ' if method.server_streaming else ''}{method.output_type.lstrip('.')})")
        options = _options(method.options)
        body += _block(head, options) if options else [head + ";"]
    return _block(f"service {service.name}", body)


def _reserved(ranges: Iterable[Any], names: Iterable[str], top: int,
              inclusive: bool = False) -> list[str]:
    out = []
    if ranges:
        out.append(f"reserved {_ranges(ranges, top, inclusive)};")
    if names:
        out.append(f"reserved {', '.join(_quoted(name) for name in names)};")
    return out


def _ranges(ranges: Iterable[Any], top: int, inclusive: bool = False) -> str:
    """``1, 4 to 6, 9 to max``: descriptor ranges (end exclusive, but enums' inclusive)."""
    out = []
    for item in ranges:
        end = item.end if inclusive else item.end - 1
        if end == item.start:
            out.append(str(item.start))
        else:
            out.append(f"{item.start} to {'max' if end == top - (0 if inclusive else 1) else end}")
    return ", ".join(out)


def _options(options: Any) -> list[str]:
    return [f"option {name} = {value};" for name, value in _option_values(options)]


def _option_values(options: Any) -> list[tuple[str, str]]:
    """(name, printed value) of the standard options set in an options message."""
    found = []
    for field, value in options.ListFields():
        if field.is_extension or field.name == "uninterpreted_option":
            continue
        if field.type == field.TYPE_MESSAGE or field.is_repeated:
            continue  # features and the like: editions only
        if field.type == field.TYPE_STRING:
            text = _quoted(value)
        elif field.type == field.TYPE_BOOL:
            text = "true" if value else "false"
        elif field.type == field.TYPE_ENUM:
            text = field.enum_type.values_by_number[value].name
        else:
            text = repr(value)
        found.append((field.name, text))
    return found


def _quoted(text: str) -> str:
    out = []
    for char in text:
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif ord(char) < 32 or ord(char) == 127:
            out.append(f"\\{ord(char):03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _block(head: str, body: list[str]) -> list[str]:
    return [f"{head} {{", *(_INDENT + line for line in body), "}"]
