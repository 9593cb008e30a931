"""Which tables ``run --capture`` streams: patterns parsed and matched.

Owns the patterns (``schema.table`` or ``schema.*``, comma-separated; the names' grammar,
unquoted or double-quoted, is capture/qualified.py's) and ``Selection.matches``,
asked once per Relation message. A ``schema.*`` pattern never takes the relay's own
tables: its bookkeeping (``cdc_relay_*``) and the outbox it relays (``own``: the outbox's
rows are events, not a table's changes). Must not: do I/O (expanding patterns into the existing
tables is the PostgreSQL edge's, cdc_relay/pg/catalog.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cdc_relay.capture.qualified import parse_pattern, split_list
from cdc_relay.errors import ConfigError

__all__ = ["RELAY_TABLE_PREFIX", "Selection"]

RELAY_TABLE_PREFIX = "cdc_relay_"  # slots, signal, snapshot progress, backfill, migrations


@dataclass(frozen=True, slots=True)
class Selection:
    """Exact tables and whole schemas (``schema.*``); ``own``: the outbox table(s) the relay
    relays, which no pattern takes and naming is refused."""

    tables: frozenset[tuple[str, str]] = frozenset()
    schemas: frozenset[str] = frozenset()
    own: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def parse(cls, patterns: tuple[str, ...] | str,
              own: Iterable[tuple[str, str]] = ()) -> Selection:
        """From ``--capture`` text (or its items); ConfigError naming a bad item, or the
        outbox table (``own``) named."""
        items = split_list(patterns) if isinstance(patterns, str) else patterns
        tables: set[tuple[str, str]] = set()
        schemas: set[str] = set()
        for item in (part.strip() for part in items):
            if not item:
                continue
            schema, name = parse_pattern(item)
            if name is None:
                schemas.add(schema)
            else:
                tables.add((schema, name))
        if not tables and not schemas:
            raise ConfigError("--capture names no table: e.g. --capture public.customers")
        mine = frozenset(own)
        for schema, name in sorted(tables & mine):
            raise ConfigError(f"--capture names {schema}.{name}, the outbox table the relay "
                              "relays as events: leave it out (or relay no outbox: --no-outbox)")
        return cls(frozenset(tables), frozenset(schemas), mine)

    def matches(self, schema: str, table: str) -> bool:
        """Whether ``schema.table`` is captured (a pattern skips the relay's own tables)."""
        if (schema, table) in self.tables:
            return True
        return (schema in self.schemas and not table.startswith(RELAY_TABLE_PREFIX)
                and (schema, table) not in self.own)

    def __str__(self) -> str:
        return ",".join(sorted([f"{s}.*" for s in self.schemas]
                               + [f"{s}.{t}" for s, t in self.tables]))


def in_option_order(option: str, tables: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``tables`` in the order of the ``--capture`` items that name them - the order
    Debezium snapshots ``table.include.list`` in - a ``schema.*`` item's by name; each once."""
    remaining = sorted(set(tables))
    out: list[tuple[str, str]] = []
    for item in split_list(option):
        schema, name = parse_pattern(item)
        for table in remaining:
            if table not in out and table[0] == schema and name in (None, table[1]):
                out.append(table)
    return out + [t for t in remaining if t not in out]
