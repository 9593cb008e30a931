"""Names and durations: SQL identifiers, slot names, ``schema.table``, the outbox's columns.

Owns the validation of every name that reaches SQL (identifiers, slot names, tables, the
column mapping) and of durations, and ``OutboxConfig`` (where the outbox lives). Pure: it
must not import a driver, read the environment, or touch a database; each problem is one
``ConfigError`` naming the option and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cdc_relay.errors import ConfigError
from cdc_relay.model import BOOKKEEPING_COLUMNS, OutboxColumns

# Unquoted-style identifiers only: letters, digits, underscore, dollar; at most 63 bytes
# (NAMEDATALEN - 1). Everything that reaches SQL is also quoted at the use site.
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def validate_identifier(name: str, what: str) -> str:
    """Return ``name`` if it is a safe SQL identifier, else raise ConfigError."""
    if not _IDENT_RE.match(name):
        raise ConfigError(
            f"invalid {what} {name!r}: use letters, digits and underscores "
            "(starting with a letter or underscore, at most 63 characters)"
        )
    return name


def validated_table(table: str | TableRef) -> TableRef:
    """A TableRef from ``"schema.table"`` text or a TableRef, both parts validated.

    TableRef's constructor does not validate, so a TableRef is re-checked here.
    """
    if isinstance(table, str):
        return TableRef.parse(table)
    validate_identifier(table.schema, "schema name")
    validate_identifier(table.name, "table name")
    return table


def validated_columns(columns: OutboxColumns | None) -> OutboxColumns:
    """OutboxColumns with every name a safe identifier and no two roles on one column."""
    columns = columns or OutboxColumns()
    names: dict[str, str] = {}
    for role in OutboxColumns.__dataclass_fields__:
        name = validate_identifier(getattr(columns, role), f"column name for {role}")
        if name in names:
            raise ConfigError(
                f"invalid column mapping: {role} and {names[name]} both map to {name!r}"
            )
        if name in BOOKKEEPING_COLUMNS:
            raise ConfigError(
                f"invalid column mapping: {role} maps to {name!r}, a column the relay "
                "itself uses; choose another name"
            )
        names[name] = role
    return columns


def validate_slot_name(name: str) -> str:
    """Replication slot names allow only lower-case letters, digits and underscores."""
    if not _SLOT_RE.match(name):
        raise ConfigError(
            f"invalid slot name {name!r}: use lower-case letters, digits and underscores "
            "(at most 63 characters)"
        )
    return name


def parse_duration(text: str, what: str = "duration") -> float:
    """Parse ``"250ms"``, ``"1s"``, ``"5m"``, ``"2h"``, ``"7d"``, ``"1w"`` into seconds.

    The unit is required (``0`` alone is allowed): a bare ``7`` meant seven days to one
    user and seven seconds to the code, so it is refused with an example.
    """
    match = _DURATION_RE.match(str(text))
    if match is None:
        raise ConfigError(
            f"invalid {what} {text!r}: expected a number with a unit, e.g. 500ms, 1s, 5m, 2h, 7d"
        )
    if match.group(2) is None and float(match.group(1)) != 0:
        raise ConfigError(
            f"invalid {what} {text!r}: a unit is required, e.g. {match.group(1)}s or "
            f"{match.group(1)}d (units: ms, s, m, h, d, w)"
        )
    return float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]


@dataclass(frozen=True, slots=True)
class TableRef:
    """A validated ``schema.table`` name."""

    schema: str = "public"
    name: str = "outbox_events"

    @classmethod
    def parse(cls, text: str) -> TableRef:
        """Parse ``table`` or ``schema.table``; both parts must be safe identifiers."""
        parts = text.split(".")
        if len(parts) == 1:
            return cls("public", validate_identifier(parts[0], "table name"))
        if len(parts) == 2:
            return cls(
                validate_identifier(parts[0], "schema name"),
                validate_identifier(parts[1], "table name"),
            )
        raise ConfigError(f"invalid table {text!r}: expected 'table' or 'schema.table'")

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class OutboxConfig:
    """Where the outbox lives and what its columns are called."""

    table: TableRef = field(default_factory=TableRef)
    columns: OutboxColumns = field(default_factory=OutboxColumns)
    # Columns read beyond the contract's (RouterConfig.extra_columns, in that order), and
    # the trace context columns the table has (polling mode reads only what exists; the
    # WAL decoders find traceparent/tracestate in each row themselves).
    extra_columns: tuple[str, ...] = ()
    trace_columns: tuple[str, ...] = ()

    @property
    def notify_channel(self) -> str:
        """The LISTEN/NOTIFY channel of the table's AFTER INSERT trigger."""
        return f"{self.table.schema}_{self.table.name}_inserted"[:63]


def parse_columns(text: str | None) -> OutboxColumns:
    """Parse ``--columns`` (``debezium`` or ``field=column,...``) into OutboxColumns."""
    if not text:
        return OutboxColumns()
    if text.strip().lower() == "debezium":
        return OutboxColumns.debezium()
    names = {}
    valid = set(OutboxColumns.__dataclass_fields__)
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in valid:
            raise ConfigError(
                f"invalid column mapping {item!r}: expected FIELD=COLUMN with FIELD one of "
                + ", ".join(sorted(valid))
            )
        names[key] = validate_identifier(value.strip(), f"column name for {key}")
    return OutboxColumns(**names)
