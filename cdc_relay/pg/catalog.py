"""The captured tables as the catalog describes them (``run --capture``, ``init``, ``doctor``).

Owns the catalog queries of table CDC: expanding ``--capture`` patterns into existing
tables, a table's shape (columns with type, typmod, NOT NULL, default, enum labels, a
domain's base type;
primary key order; replica identity; capture/shape.py), and the facts ``init`` and
``doctor`` report: the SELECT privilege, ownership (adding a table to a publication needs
it) and what the publication covers. The verdict on a replica identity is pure
(capture/shape.py, ``identity_problem``).

Must not: change anything (the publication is wal/slot/publication.py's), or interpret values.
"""

from __future__ import annotations

from typing import Any

import psycopg

from cdc_relay.capture.selection import Selection
from cdc_relay.capture.shape import ColumnShape, TableShape
from cdc_relay.errors import ConfigError
from cdc_relay.pg.db import translate_error

_TABLES = """
SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname = ANY(%s) ORDER BY 1, 2"""
# A domain's base type, through nested domains: (base OID, its typmod, any NOT NULL).
_DOMAIN = """LEFT JOIN LATERAL (
  WITH RECURSIVE d(base, typmod, nn, depth) AS (
    SELECT t0.typbasetype, t0.typtypmod, t0.typnotnull, 0 FROM pg_type t0
    WHERE t0.oid = {oid} AND t0.typtype = 'd'
    UNION ALL
    SELECT b.typbasetype, CASE WHEN d.typmod >= 0 THEN d.typmod ELSE b.typtypmod END,
           d.nn OR b.typnotnull, d.depth + 1
    FROM d JOIN pg_type b ON b.oid = d.base WHERE b.typtype = 'd')
  SELECT base, typmod, nn FROM d ORDER BY depth DESC LIMIT 1) dom ON true
JOIN pg_type t ON t.oid = COALESCE(dom.base, {oid})
LEFT JOIN pg_type e ON e.oid = t.typelem"""
_FACTS = """format_type(t.oid, COALESCE(dom.typmod, {typmod})), {not_null} OR COALESCE(dom.nn, false),
       {default}, t.typelem, t.typtype, e.typtype,
       (SELECT array_agg(enumlabel ORDER BY enumsortorder) FROM pg_enum
        WHERE enumtypid = CASE WHEN t.typtype = 'e' THEN t.oid ELSE t.typelem END),
       COALESCE(dom.base, 0), COALESCE(dom.typmod, -1)"""
_COLUMNS = f"""
SELECT a.attname, a.atttypid, a.atttypmod, {_FACTS.format(typmod="a.atttypmod",
    not_null="a.attnotnull", default="pg_get_expr(d.adbin, d.adrelid)")}
FROM pg_attribute a {_DOMAIN.format(oid="a.atttypid")}
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"""
_TYPE = f"""
SELECT '', %(oid)s::oid, %(typmod)s, {_FACTS.format(typmod="%(typmod)s", not_null="false",
    default="NULL")}
FROM (SELECT 1) one {_DOMAIN.format(oid="%(oid)s::oid")}"""
_KEY = """
SELECT a.attname FROM pg_index i, unnest(i.indkey) WITH ORDINALITY k(attnum, n)
JOIN pg_attribute a ON a.attnum = k.attnum
WHERE i.indrelid = %s::regclass AND i.indisprimary AND a.attrelid = i.indrelid ORDER BY k.n"""


def _ident(schema: str, table: str) -> str:
    return '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'


def expand(conn: psycopg.Connection[Any], selection: Selection) -> list[tuple[str, str]]:
    """The existing tables ``selection`` names; ConfigError for a named table that does
    not exist (one line, exit 2)."""
    try:
        found = set()
        if selection.schemas:
            found = {(s, t) for s, t in conn.execute(_TABLES, (sorted(selection.schemas),))
                     if selection.matches(s, t)}
        for schema, table in sorted(selection.tables):
            row = conn.execute("SELECT to_regclass(%s)", (_ident(schema, table),)).fetchone()
            if row is None or row[0] is None:
                raise ConfigError(f"captured table {schema}.{table} does not exist: check "
                                  "--capture (schema-qualified names, e.g. public.customers)")
            found.add((schema, table))
    except psycopg.Error as exc:
        raise translate_error(exc, "looking up the captured tables") from exc
    return sorted(found)


def table_shape(conn: psycopg.Connection[Any], schema: str, table: str) -> TableShape | None:
    """The shape of ``schema.table``; None when it does not exist."""
    ident = _ident(schema, table)
    try:
        row = conn.execute("SELECT c.relreplident FROM pg_class c WHERE c.oid = "
                           "to_regclass(%s)", (ident,)).fetchone()
        if row is None:
            return None
        columns = tuple(_column(r) for r in conn.execute(_COLUMNS, (ident,)))
        key = tuple(r[0] for r in conn.execute(_KEY, (ident,)))
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading the catalog of {schema}.{table}") from exc
    return TableShape(schema, table, columns, key, str(row[0]))


def type_facts(conn: psycopg.Connection[Any], oid: int, typmod: int) -> ColumnShape | None:
    """A type's name, array element and enum labels by OID (a column without a name);
    None when no such type exists."""
    try:
        row = conn.execute(_TYPE, {"oid": oid, "typmod": typmod}).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading the catalog of type {oid}") from exc
    return None if row is None else _column(row)


def _column(row: tuple[Any, ...]) -> ColumnShape:
    (name, oid, typmod, type_name, not_null, default, elem, typtype, elem_type, labels,
     base, base_typmod) = row
    enum = typtype == "e" or (elem and elem_type == "e")
    return ColumnShape(name, oid, typmod, type_name, bool(not_null), default,
                       int(elem) if elem and type_name.endswith("[]") else 0,
                       tuple(labels) if enum and labels is not None else None,
                       int(base), int(base_typmod))


def lacks_select(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    """True when the current role may not SELECT the table (the catalog reads and a later
    snapshot need it)."""
    try:
        row = conn.execute("SELECT has_table_privilege(%s, 'SELECT')",
                           (_ident(schema, table),)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading the privileges on {schema}.{table}") from exc
    return not (row and row[0])


_PUBLICATION = """
SELECT p.puballtables, p.pubupdate AND p.pubdelete,
       (SELECT array_agg(t.schemaname || '.' || t.tablename) FROM pg_publication_tables t
        WHERE t.pubname = p.pubname)
FROM pg_publication p WHERE p.pubname = %s"""


def publication_coverage(conn: psycopg.Connection[Any],
                         publication: str) -> tuple[bool, frozenset[str]] | None:
    """The publication as captured tables need it: (publishes updates and deletes, the
    ``schema.table`` names it includes); None when it does not exist. A FOR ALL TABLES
    publication includes every table (``{"*"}``)."""
    try:
        row = conn.execute(_PUBLICATION, (publication,)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading publication {publication!r}") from exc
    if row is None:
        return None
    return bool(row[1]), frozenset(["*"] if row[0] else row[2] or ())


def owns(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    """True when the current role owns the table (or is a superuser): adding it to a
    publication needs that."""
    try:
        row = conn.execute("SELECT pg_has_role(c.relowner, 'USAGE') OR r.rolsuper FROM pg_class c,"
                           " pg_roles r WHERE c.oid = to_regclass(%s) AND r.rolname = current_user",
                           (_ident(schema, table),)).fetchone()
    except psycopg.Error as exc:
        raise translate_error(exc, f"reading the owner of {schema}.{table}") from exc
    return bool(row and row[0])


class CatalogLookup:
    """The capture decoder's ``shapes`` and ``types``: the start-up shapes, and the catalog
    (on a connection of its own, opened when first needed) for a table whose Relation
    message changed; a type's facts by OID, read once."""

    def __init__(self, dsn: str, shapes: dict[tuple[str, str], TableShape]) -> None:
        self._dsn = dsn
        self._shapes = dict(shapes)
        self._conn: psycopg.Connection[Any] | None = None
        self._types: dict[tuple[int, int], ColumnShape | None] = {}

    def __call__(self, schema: str, table: str) -> TableShape | None:
        """The shape: a start-up one once, the catalog's from then on."""
        shape = self._shapes.pop((schema, table), None)
        if shape is not None:
            return shape
        return table_shape(self._connection(), schema, table)

    def positions(self, schema: str, table: str) -> dict[str, int]:
        """The table's columns' attribute numbers by name, as the catalog has them now
        (wal2json's capture decoder places a change's absent columns by them)."""
        try:
            rows = self._connection().execute(
                "SELECT attname, attnum FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attnum > 0 AND NOT attisdropped", (_ident(schema, table),)).fetchall()
        except psycopg.Error as exc:
            raise translate_error(exc, f"reading the catalog of {schema}.{table}") from exc
        return {name: int(number) for name, number in rows}

    def types(self, oid: int, typmod: int) -> ColumnShape | None:
        """The facts of type ``oid`` (capture/shape.py, ``TypeLookup``)."""
        if (oid, typmod) not in self._types:
            self._types[(oid, typmod)] = type_facts(self._connection(), oid, typmod)
        return self._types[(oid, typmod)]

    def _connection(self) -> psycopg.Connection[Any]:
        from cdc_relay.pg.db import connect

        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self._dsn, autocommit=True)
        return self._conn
