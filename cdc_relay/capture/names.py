"""Debezium's name adjustment for Avro (``schema.name.adjustment.mode``,
``field.name.adjustment.mode``): ``none`` (Debezium's default) or ``avro``.

Owns ``adjust_schema_name`` and ``adjust_field_name``: with ``avro``, a schema name
(``PREFIX.SCHEMA.TABLE.Value``) keeps letters, digits, ``_`` and ``.`` and has every other
character replaced by ``_`` (a first character that is no letter nor ``_`` too); a field
name keeps letters, digits and ``_``, has every other character replaced by ``_``, and
gets a ``_`` in front when it starts with a digit - as Debezium 3.6 writes them
(``my-table`` → ``my_table``, ``order-id`` → ``order_id``, ``1st`` → ``_1st``,
``größe`` → ``gr__e``; tests/integration/test_capture_avro_names.py compares). Topics keep
the table's own name but for what Kafka refuses in one (``topic_name``: Debezium's topic
naming strategy's sanitising, in every mode). With ``none`` nothing changes: an
Avro-illegal name then fails in the Avro serializer (a dead letter), where Debezium's
AvroConverter stops the connector.

Must not: know the formats that need it, or import a driver (pure).
"""

from __future__ import annotations

import re

NAME_ADJUSTMENT_MODES = ("none", "avro")
_SCHEMA_CHAR = re.compile(r"[^A-Za-z0-9_.]")
_FIELD_CHAR = re.compile(r"[^A-Za-z0-9_]")


def adjust_schema_name(name: str, mode: str) -> str:
    """``name`` (a Connect schema's full name) under ``schema.name.adjustment.mode``."""
    if mode == "none" or not name:
        return name
    head = name[0] if name[0] == "_" or (name[0].isascii() and name[0].isalpha()) else "_"
    return head + _SCHEMA_CHAR.sub("_", name[1:])


def adjust_field_name(name: str, mode: str) -> str:
    """``name`` (a column's) under ``field.name.adjustment.mode``."""
    if mode == "none" or not name:
        return name
    out = _FIELD_CHAR.sub("_", name)
    return "_" + out if out[0].isdigit() else out


_TOPIC_ILLEGAL = re.compile(r"[^A-Za-z0-9._-]")
MAX_TOPIC_LENGTH = 249  # Kafka's limit, and Debezium's cut


def topic_name(prefix: str, schema: str, table: str) -> str:
    """``PREFIX.SCHEMA.TABLE`` as Debezium's topic naming strategy makes it: each character
    Kafka does not allow in a topic (other than letters, digits, ``.``, ``_``, ``-``) is
    ``_`` and the name is cut at 249 characters (a quoted table ``"my table"`` →
    ``PREFIX.public.my_table``)."""
    return _TOPIC_ILLEGAL.sub("_", f"{prefix}.{schema}.{table}")[:MAX_TOPIC_LENGTH]
