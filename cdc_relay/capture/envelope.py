"""Debezium's change event for one captured table: key, envelope and their schema blocks.

Owns ``TableCodec``: for a table's shape (capture/shape.py) and the columns of its
Relation message, the topic (``PREFIX.SCHEMA.TABLE``), the key (a struct of the primary
key's columns, in the key's order; no primary key: a null key), the row struct, the
envelope ``{before, after, source, transaction, op, ts_ms, ts_us, ts_ns}`` in Debezium
3's order, the ``source`` block, and - for ``debezium-json`` - the schema blocks
JsonConverter writes beside them (``PREFIX.SCHEMA.TABLE.Key`` / ``.Value`` /
``.Envelope`` version 2, ``io.debezium.connector.postgresql.Source``), serialized once
per table.

A value is written as JsonConverter writes it from Debezium's struct: NULL in a column
with a schema ``default`` becomes the default (``replace.null.with.default``), NULL (or
absence from an old row image) in a non-optional column becomes the type's fallback, an
unchanged TOASTed value the placeholder (docs/table-cdc.md, the contract).

Must not: do I/O, read a clock (the caller passes the processing time) or decide what
happens to a row it cannot encode: ``encode_row`` raises ValueError, the router makes
the dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc_relay.capture.headers import key_header
from cdc_relay.capture.jsonw import dumps
from cdc_relay.capture.modes import TypeModes
from cdc_relay.capture.names import adjust_field_name, adjust_schema_name, topic_name
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.capture.types import (
    DEFAULT_MODES,
    Mapping,
    Unsupported,
    literal_default,
    mapping_for,
    ordered,
)
from cdc_relay.model import UNCHANGED

_SNAPSHOT_VALUES = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"


def _f(kind: str, name: str, optional: bool, **extra: Any) -> dict[str, Any]:
    return ordered({"type": kind, **extra}, optional=optional, name=name)


SOURCE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        _f("string", "version", False), _f("string", "connector", False),
        _f("string", "name", False), _f("int64", "ts_ms", False),
        ordered({"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                 "parameters": {"allowed": _SNAPSHOT_VALUES}}, optional=True,
                default=(True, "false"), name="snapshot"),
        _f("string", "db", False), _f("string", "sequence", True), _f("int64", "ts_us", True),
        _f("int64", "ts_ns", True), _f("string", "schema", False), _f("string", "table", False),
        _f("int64", "txId", True), _f("int64", "lsn", True), _f("int64", "xmin", True),
        _f("string", "origin", True), _f("int64", "origin_lsn", True),
    ],
    "optional": False, "name": "io.debezium.connector.postgresql.Source", "version": 1,
    "field": "source",
}
TRANSACTION_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_f("string", "id", False), _f("int64", "total_order", False),
               _f("int64", "data_collection_order", False)],
    "optional": True, "name": "event.block", "version": 1, "field": "transaction",
}


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """What every event's ``source`` block says about the relay: Debezium's ``version``
    field, the logical name (``--capture-prefix``) and the database."""

    version: str
    name: str
    db: str


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    mapping: Mapping
    optional: bool
    default: tuple[bool, Any]


class TableCodec:
    """One captured table's events (see the module docstring).

    ``columns`` are the Relation message's column names in its order, the shape that of the
    Relation's moment (capture/shape.py, ``shape_at``), ``modes`` the type modes
    (capture/modes.py). ``problem`` is set (and nothing can be encoded) when a
    column's type has no mapping yet, or the Relation names a column the shape lacks.
    """

    def __init__(self, shape: TableShape, columns: tuple[str, ...], prefix: str,
                 schemas: bool, placeholder: str, *, modes: TypeModes = DEFAULT_MODES,
                 names: tuple[str, str] = ("none", "none")) -> None:
        self.shape = shape
        self._names = names  # (schema, field) name adjustment modes: capture/names.py
        self.topic = topic_name(prefix, shape.schema, shape.name)
        self.problem: str | None = None
        self._schemas = schemas
        self._placeholder = placeholder
        self._fields: list[_Field] = []
        by_name = {column.name: column for column in shape.columns}
        for name in columns:
            column = by_name.get(name)
            if column is None:
                self.problem = (f"column {name!r} of {shape.qualified} is not in its shape "
                                "(capture/shape.py, shape_at): a bug, please report it")
                return
            try:
                self._fields.append(_field(column, modes, names[1]))
            except Unsupported as exc:
                self.problem = (f"column {name!r} of {shape.qualified}: {exc} (docs/table-cdc.md, "
                                "types): its rows go to the dead-letter topic")
                return
        index = {name: i for i, name in enumerate(columns)}
        self._key = tuple(index[name] for name in shape.key if name in index)
        if len(self._key) != len(shape.key):
            self.problem = f"a primary key column of {shape.qualified} is not in its Relation"
            return
        self._key_schema, self._value_schema = self._schema_blocks(prefix)

    @property
    def has_key(self) -> bool:
        """False: the table has no primary key (a null message key)."""
        return bool(self._key)

    def row(self, image: list[bytes | object | None]) -> dict[str, Any]:
        """A row image as Debezium's struct; ValueError for a value it cannot read."""
        out: dict[str, Any] = {}
        for field, raw in zip(self._fields, image, strict=True):
            out[field.name] = self._value(field, raw)
        return out

    def _value(self, field: _Field, raw: bytes | object | None) -> Any:
        if raw is None:
            if field.default[0]:
                return field.default[1]
            return None if field.optional else field.mapping.fallback
        if raw is UNCHANGED:
            return field.mapping.placeholder(self._placeholder)
        assert isinstance(raw, bytes)
        try:
            value = field.mapping.convert(raw.decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"column {field.name!r} of {self.shape.qualified}: {exc}") from exc
        if value is None and field.default[0]:
            return field.default[1]
        return value

    def key(self, image: list[bytes | object | None]) -> dict[str, Any] | None:
        """The key struct of a row image (None: no primary key)."""
        if not self._key:
            return None
        return {self._fields[i].name: self._value(self._fields[i], image[i]) for i in self._key}

    def key_header(self, key: dict[str, Any]) -> bytes:
        """``key`` as a primary-key change's header carries it (capture/headers.py)."""
        decimals = {f.name: int(f.mapping.schema["parameters"]["scale"])
                    for f in (self._fields[i] for i in self._key)
                    if f.mapping.schema.get("name") == "org.apache.kafka.connect.data.Decimal"}
        return key_header(key, decimals)

    def key_bytes(self, key: dict[str, Any] | None) -> bytes | None:
        """The serialized key (None stays None: a null Kafka key)."""
        if key is None:
            return None
        if self._schemas:
            return dumps({"schema": self._key_schema, "payload": key})
        return dumps(key)

    def value_bytes(self, envelope: dict[str, Any]) -> bytes:
        """The serialized envelope."""
        if self._schemas:
            return dumps({"schema": self._value_schema, "payload": envelope})
        return dumps(envelope)

    def _schema_blocks(self, prefix: str) -> tuple[bytes, bytes]:
        base = adjust_schema_name(f"{prefix}.{self.shape.schema}.{self.shape.name}", self._names[0])
        fields = [ordered(f.mapping.schema, optional=f.optional, default=f.default, name=f.name)
                  for f in self._fields]
        key = {"type": "struct", "fields": [fields[i] for i in self._key], "optional": False,
               "name": f"{base}.Key"}
        row = {"type": "struct", "fields": fields, "optional": True, "name": f"{base}.Value"}
        envelope = {
            "type": "struct",
            "fields": [{**row, "field": "before"}, {**row, "field": "after"}, SOURCE_SCHEMA,
                       TRANSACTION_SCHEMA, _f("string", "op", False), _f("int64", "ts_ms", True),
                       _f("int64", "ts_us", True), _f("int64", "ts_ns", True)],
            "optional": False, "name": f"{base}.Envelope", "version": 2,
        }
        return dumps(key), dumps(envelope)


def _field(column: ColumnShape, modes: TypeModes, field_names: str) -> _Field:
    mapping = mapping_for(column, modes)
    return _Field(adjust_field_name(column.name, field_names), mapping, not column.not_null,
                  literal_default(column, mapping))


def source_block(info: SourceInfo, codec: TableCodec, *, commit_us: int, last_commit: int | None,
                 lsn: int, xid: int | None, snapshot: str = "false") -> dict[str, Any]:
    """The ``source`` struct of a change (``snapshot`` ``"false"``) or a snapshot's row, in
    Debezium's field order."""
    return {
        "version": info.version, "connector": "postgresql", "name": info.name,
        "ts_ms": commit_us // 1000, "snapshot": snapshot, "db": info.db,
        "sequence": dumps([None if last_commit is None else str(int(last_commit)), str(lsn)]).decode(),
        "ts_us": commit_us, "ts_ns": commit_us * 1000,
        "schema": codec.shape.schema, "table": codec.shape.name, "txId": xid, "lsn": lsn,
        "xmin": None, "origin": None, "origin_lsn": None,
    }
