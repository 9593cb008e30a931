"""Which tables ``run --capture`` streams: patterns parsed and matched.

Owns the pattern grammar (``schema.table`` or ``schema.*``, comma-separated, the names
unquoted identifiers as every other name the relay takes) and ``Selection.matches``,
asked once per Relation message. Must not: do I/O (expanding patterns into the existing
tables is the PostgreSQL edge's, cdc_relay/pg/catalog.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cdc_relay.config import validate_identifier
from cdc_relay.errors import ConfigError

__all__ = ["Selection"]


@dataclass(frozen=True, slots=True)
class Selection:
    """Exact tables and whole schemas (``schema.*``)."""

    tables: frozenset[tuple[str, str]] = frozenset()
    schemas: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, patterns: tuple[str, ...] | str) -> Selection:
        """From ``--capture`` text (or its items); ConfigError naming a bad item."""
        items = patterns.split(",") if isinstance(patterns, str) else patterns
        tables: set[tuple[str, str]] = set()
        schemas: set[str] = set()
        for item in (part.strip() for part in items):
            if not item:
                continue
            schema, dot, name = item.partition(".")
            if not dot:
                raise ConfigError(f"invalid --capture item {item!r}: name the schema too, "
                                  "e.g. public.customers or public.*")
            validate_identifier(schema, "--capture schema")
            if name == "*":
                schemas.add(schema)
            else:
                tables.add((schema, validate_identifier(name, "--capture table")))
        if not tables and not schemas:
            raise ConfigError("--capture names no table: e.g. --capture public.customers")
        return cls(frozenset(tables), frozenset(schemas))

    def matches(self, schema: str, table: str) -> bool:
        """Whether ``schema.table`` is captured."""
        return schema in self.schemas or (schema, table) in self.tables

    def __str__(self) -> str:
        return ",".join(sorted([f"{s}.*" for s in self.schemas]
                               + [f"{s}.{t}" for s, t in self.tables]))


def in_option_order(option: str, tables: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``tables`` in the order of the ``--capture`` items that name them - the order
    Debezium snapshots ``table.include.list`` in - a ``schema.*`` item's by name; each once."""
    remaining = sorted(set(tables))
    out: list[tuple[str, str]] = []
    for item in (part.strip() for part in option.split(",")):
        schema, _, name = item.partition(".")
        for table in remaining:
            if table not in out and table[0] == schema and name in ("*", table[1]):
                out.append(table)
    return out + [t for t in remaining if t not in out]
