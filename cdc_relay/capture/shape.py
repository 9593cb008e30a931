"""What the capture room knows of a captured table: its columns, key and replica identity.

Plain values, read from the catalog at start-up (cdc_relay/pg/catalog.py) and again when
a Relation message shows a table changed: pgoutput's Relation message names the columns
and their types, but not what Debezium's schema also says - nullability (``optional``),
the primary key (the message key; the Relation's key flags are the replica identity's),
column defaults (``default``) and an enum's labels (``allowed``).

``identity_problem`` is the verdict on a replica identity that ``run``, ``init`` and
``doctor`` report.

Must not: do I/O (the PostgreSQL edge fills these), or interpret values (capture/types.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ColumnShape:
    """One column: ``type_oid`` / ``typmod`` as pg_attribute has them (the array type's for
    an array, whose ``element_oid`` is then set), ``default`` as ``pg_get_expr`` prints
    the column default, ``labels`` an enum's (or an enum array element's) labels in order."""

    name: str
    type_oid: int
    typmod: int = -1
    type_name: str = ""
    not_null: bool = False
    default: str | None = None
    element_oid: int = 0
    labels: tuple[str, ...] | None = None


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


def identity_problem(shape: TableShape) -> str | None:
    """Why UPDATE/DELETE on the table fail once it is in a publication that publishes them,
    with the fix; None when its replica identity is fine."""
    if shape.replica_identity == "n":
        return (f"{shape.qualified} has REPLICA IDENTITY NOTHING: once it is in the publication, "
                f"UPDATE and DELETE on it fail. Fix: ALTER TABLE {shape.qualified} REPLICA "
                "IDENTITY DEFAULT (with a primary key) or FULL")
    if shape.replica_identity == "d" and not shape.key:
        return (f"{shape.qualified} has no primary key and REPLICA IDENTITY DEFAULT: once it is "
                f"in the publication, UPDATE and DELETE on it fail. Fix: add a primary key, or "
                f"ALTER TABLE {shape.qualified} REPLICA IDENTITY FULL")
    return None
