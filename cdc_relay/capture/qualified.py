"""Captured tables' names as users write them: ``schema.table``, with PostgreSQL's quoting.

Owns the one grammar of the names ``--capture``, ``cdc-relay snapshot`` and a signal's
``data-collections`` take (docs/table-cdc.md, selecting tables): each part is an unquoted
identifier (letters, digits, ``_``, ``$``; taken as written, no case folding, as every
other name the relay takes) or a double-quoted one (``"my-table"``, ``"Sales"``; any
characters, ``""`` for a quote, case kept). ``split_list`` splits a comma-separated list
outside quotes; ``data_collection`` writes a name as Debezium's signals name it.
Must not: do I/O, or decide what a name selects (capture/selection.py).
"""

from __future__ import annotations

import re

from cdc_relay.config import validate_identifier
from cdc_relay.errors import ConfigError

__all__ = ["data_collection", "parse_pattern", "parse_qualified", "quote_part", "split_list",
           "sql_name"]

_SQL_PLAIN = re.compile(r"^[a-z_][a-z0-9_$]*$")  # what SQL reads back unquoted, unfolded
_MAX_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: a longer name would be truncated


def split_list(text: str) -> list[str]:
    """``text``'s comma-separated items (commas inside double quotes are a name's),
    stripped, empty ones dropped; ConfigError for an unclosed quote."""
    items: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted  # "" inside quotes toggles twice: still quoted
        if ch == "," and not quoted:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if quoted:
        raise ConfigError(f"invalid table list {text!r}: a double quote is not closed")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _quoted(item: str, start: int, what: str) -> tuple[str, int]:
    """The quoted identifier opening at ``start`` and the index after its closing quote."""
    out: list[str] = []
    i = start + 1
    while i < len(item):
        if item[i] == '"':
            if item[i + 1:i + 2] == '"':
                out.append('"')
                i += 2
                continue
            name = "".join(out)
            if not name or "\x00" in name or len(name.encode()) > _MAX_BYTES:
                raise ConfigError(f"invalid {what} {item!r}: a quoted name must have 1 to "
                                  f"{_MAX_BYTES} bytes")
            return name, i + 1
        out.append(item[i])
        i += 1
    raise ConfigError(f"invalid {what} {item!r}: a double quote is not closed")


def _parts(item: str, what: str) -> list[tuple[str, bool]]:
    """``item``'s dot-separated parts: (name, quoted)."""
    parts: list[tuple[str, bool]] = []
    i = 0
    while True:
        if item[i:i + 1] == '"':
            name, i = _quoted(item, i, what)
            parts.append((name, True))
        else:
            end = item.find(".", i)
            end = len(item) if end < 0 else end
            parts.append((item[i:end].strip(), False))
            i = end
        if i >= len(item):
            return parts
        if item[i] != ".":
            raise ConfigError(f"invalid {what} {item!r}: expected a dot after a quoted name")
        i += 1


def parse_pattern(item: str, what: str = "--capture item") -> tuple[str, str | None]:
    """``(schema, table)`` of ``schema.table``, ``(schema, None)`` of ``schema.*`` (an
    unquoted ``*``; ``"*"`` is a table's name)."""
    return _parse(item, what, wildcard=True, default_schema=None)


def parse_qualified(item: str, what: str = "--capture item", *,
                    default_schema: str | None = None) -> tuple[str, str]:
    """``(schema, table)`` of ``schema.table``; a bare ``table`` is ``default_schema``'s
    (ConfigError without one)."""
    schema, table = _parse(item, what, wildcard=False, default_schema=default_schema)
    assert table is not None  # no wildcard asked for
    return schema, table


def _parse(item: str, what: str, *, wildcard: bool,
           default_schema: str | None) -> tuple[str, str | None]:
    parts = _parts(item.strip(), what)
    if len(parts) == 1 and default_schema is not None:
        parts.insert(0, (default_schema, True))
    if len(parts) != 2:
        raise ConfigError(f"invalid {what} {item!r}: name the schema and the table, e.g. "
                          'public.customers, public."my-table" or public.*')
    (schema, schema_quoted), (table, table_quoted) = parts
    if not schema_quoted:
        validate_identifier(schema, f"{what} schema")
    if wildcard and not table_quoted and table == "*":
        return schema, None
    if not table_quoted:
        validate_identifier(table, f"{what} table")
    return schema, table


def quote_part(name: str) -> str:
    """``name`` as the grammar reads it back: as it is when it is an unquoted identifier
    (and not ``*``), else double-quoted."""
    try:
        return validate_identifier(name, "name")
    except ConfigError:
        return '"' + name.replace('"', '""') + '"'


def data_collection(item: str) -> str:
    """A ``cdc-relay snapshot`` argument as the signal's ``data-collections`` names it:
    Debezium's unquoted ``schema.table`` when both names are plain enough for a reader that
    splits at the first dot, else the quoted form (ConfigError for a malformed name)."""
    schema, table = parse_qualified(item, "table", default_schema="public")
    if "." in schema or '"' in schema + table or schema != schema.strip() \
            or table != table.strip():
        return f"{quote_part(schema)}.{quote_part(table)}"
    return f"{schema}.{table}"


def sql_name(schema: str, table: str) -> str:
    """``schema.table`` for a SQL statement in a fix a user pastes (``ALTER TABLE
    "Sales"."Orders" ...``): a part quoted unless SQL reads it back as it is."""
    return ".".join(part if _SQL_PLAIN.match(part) else '"' + part.replace('"', '""') + '"'
                    for part in (schema, table))
