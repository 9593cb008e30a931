"""What the capture room knows of a captured table: its columns, key and replica identity.

Plain values. The shape an event is encoded with is its moment's: ``shape_at`` takes the
columns, their type OIDs and typmods and the replica identity from pgoutput's Relation
message (sent before the first change after any DDL), and from the catalog only what the
message does not say - nullability (``optional``), column defaults (``default``) and the
primary key (the message key; the Relation's key flags are the replica identity's), by
column name, as read when the Relation arrived (cdc_relay/pg/catalog.py), like Debezium;
and a type's name, array element and enum labels (``allowed``), by type OID.

``identity_problem`` is the verdict on a replica identity that ``run``, ``init`` and
``doctor`` report.

Must not: do I/O (the PostgreSQL edge fills these), or interpret values (capture/types.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cdc_relay.capture.qualified import sql_name


@dataclass(frozen=True, slots=True)
class ColumnShape:
    """One column: ``type_oid`` / ``typmod`` as pg_attribute has them (the array type's for
    an array, whose ``element_oid`` is then set), ``default`` as ``pg_get_expr`` prints
    the column default, ``labels`` an enum's (or an enum array element's) labels in order.
    A domain's column has the domain's OID and ``base_oid`` / ``base_typmod`` its base type's
    (through nested domains; ``element_oid``, ``labels`` and ``type_name`` are the base
    type's, ``not_null`` includes the domain's NOT NULL)."""

    name: str
    type_oid: int
    typmod: int = -1
    type_name: str = ""
    not_null: bool = False
    default: str | None = None
    element_oid: int = 0
    labels: tuple[str, ...] | None = None
    base_oid: int = 0
    base_typmod: int = -1


@dataclass(frozen=True, slots=True)
class TableShape:
    """A table: columns in attribute order, the primary key's columns in the index's order
    (empty: no primary key, a null message key), the replica identity (``d`` default,
    ``f`` full, ``i`` index, ``n`` nothing)."""

    schema: str
    name: str
    columns: tuple[ColumnShape, ...]
    key: tuple[str, ...] = ()
    replica_identity: str = "d"

    @property
    def qualified(self) -> str:
        """``schema.table``."""
        return f"{self.schema}.{self.name}"


def identity_problem(shape: TableShape, plugin: str = "pgoutput") -> str | None:
    """Why UPDATE/DELETE on the table fail once it is in a publication that publishes them
    (with wal2json: why they are not streamed), with the fix; None when its replica
    identity is fine."""
    if plugin == "wal2json" and (shape.replica_identity == "n" or (
            shape.replica_identity == "d" and not shape.key)):
        what = "REPLICA IDENTITY NOTHING" if shape.replica_identity == "n" else \
            "no primary key and REPLICA IDENTITY DEFAULT"
        return (f"{shape.qualified} has {what}: wal2json skips its UPDATE and DELETE (a "
                f"warning in the server log), they are never streamed. Fix: ALTER TABLE "
                f"{sql_name(shape.schema, shape.name)} REPLICA IDENTITY FULL (or add a primary key)")
    if shape.replica_identity == "n":
        return (f"{shape.qualified} has REPLICA IDENTITY NOTHING: once it is in the publication, "
                "UPDATE and DELETE on it fail. Fix: ALTER TABLE "
                f"{sql_name(shape.schema, shape.name)} REPLICA IDENTITY DEFAULT (with a primary "
                "key) or FULL")
    if shape.replica_identity == "d" and not shape.key:
        return (f"{shape.qualified} has no primary key and REPLICA IDENTITY DEFAULT: once it is "
                f"in the publication, UPDATE and DELETE on it fail. Fix: add a primary key, or "
                f"ALTER TABLE {sql_name(shape.schema, shape.name)} REPLICA IDENTITY FULL")
    return None


@dataclass(frozen=True, slots=True)
class RelationColumn:
    """One column as a pgoutput Relation message describes it."""

    name: str
    type_oid: int
    typmod: int
    key: bool  # part of the replica identity


TypeLookup = Callable[[int, int], ColumnShape | None]  # (type OID, typmod) -> its type facts


def shape_at(schema: str, table: str, columns: tuple[RelationColumn, ...],
             replica_identity: str, catalog: TableShape | None, types: TypeLookup) -> TableShape:
    """The table at the moment of a Relation message (see the module docstring).

    A column the catalog lacks by that name (dropped or renamed since) is optional without
    a default, as Debezium makes it; the key is the catalog's primary key columns the
    Relation has. A column whose type the catalog has changed since takes the Relation's
    type, its name, element and labels from ``types`` (None: the OID alone, and a type
    without a mapping is a dead letter). A table the catalog lacks (dropped since) keys on
    the Relation's replica identity columns when that is the default one.
    """
    known = {} if catalog is None else {column.name: column for column in catalog.columns}
    shaped = []
    for column in columns:
        found = known.get(column.name)
        if found is not None and found.type_oid == column.type_oid:
            shaped.append(replace(found, typmod=column.typmod))
            continue
        facts = types(column.type_oid, column.typmod) or ColumnShape("", column.type_oid)
        shaped.append(replace(facts, name=column.name, type_oid=column.type_oid,
                              typmod=column.typmod, not_null=bool(found and found.not_null),
                              default=None if found is None else found.default))
    names = {column.name for column in columns}
    if catalog is not None:
        key = tuple(name for name in catalog.key if name in names)
    else:
        key = tuple(c.name for c in columns if c.key) if replica_identity == "d" else ()
    return TableShape(schema, table, tuple(shaped), key, replica_identity)
