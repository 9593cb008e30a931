"""The wal2json options the replication source passes to ``START_REPLICATION`` for the outbox.

Owns ``plugin_options`` (what the walsender formats, and why each option is set) and
``escape_add_tables`` (a name as wal2json's ``add-tables`` parser reads it, also used by
table CDC). Both are re-exported by decoding/wal2json.py. Must not: do I/O, import a
driver, or decode anything (decoding/wal2json.py does).
"""

from __future__ import annotations

from cdc_relay.config import TableRef
from cdc_relay.model import MESSAGE_PREFIX

# Characters wal2json's add-tables parser treats specially (list and schema separators,
# the escape itself, the "*" wildcard, and whitespace, which ends a name).
_ADD_TABLES_SPECIAL = frozenset(",.\\* \t\n\r\f\v")


def escape_add_tables(name: str) -> str:
    """``name`` with the characters wal2json's add-tables parser treats specially escaped."""
    return "".join("\\" + ch if ch in _ADD_TABLES_SPECIAL else ch for ch in name)

def plugin_options(table: TableRef, *, partitioned: bool = False) -> list[tuple[str, str]]:
    """The wal2json options to pass to ``START_REPLICATION`` for the outbox ``table``.

    Chosen so the walsender, which is the throughput bound (~100k rows/s for wal2json),
    does as little work per row as possible, and so nothing the relay needs is left to a
    default that a wal2json upgrade could change:

    * ``format-version 2``: one message per row (bounded memory; v1 builds one string per
      transaction, up to the server's 1 GB limit).
    * ``include-transaction 1``: the B/C pairs carry the commit positions to confirm;
      a transaction without outbox rows still yields an empty pair, which lets an idle
      slot advance.
    * ``include-xids 1``, ``include-lsn 1``: xids, and ``nextlsn`` on C (the commit end
      to confirm; without it the C message's stream position is used, which is equal);
      the row and commit ``lsn`` fields help when reading a dump.
    * ``include-schemas 1``: the decoder checks schema and table of every row.
    * ``include-types 0``: drops a catalog lookup and a ``format_type`` call per column
      per row on the server, and ~20 bytes per column on the wire; the decoder only
      needs names and values. (The payload column must be json, jsonb or text.)
    * ``include-timestamp 0``, ``include-type-oids 0``: not needed (these are the
      defaults; stated so they stay off).
    * ``actions insert``: UPDATE, DELETE and TRUNCATE of outbox rows are ignored by
      contract (docs/design.md, WAL mode), so wal2json does not even format them. Safe: B/C still come
      for every transaction.
    * ``add-tables <schema.table>``: only the outbox table's rows are formatted; other
      tables' rows cost the walsender a name comparison, not a JSON document. Not for a
      partitioned outbox (``partitioned``): its rows arrive under partition names no
      list fixed at start can follow, so every table's inserts come and the decoder
      picks the outbox's (more walsender work; pgoutput filters on the server).
    * ``add-msg-prefixes cdc-relay``: only the logical decoding messages of
      ``outbox.emit_message`` (the tableless outbox) pass; other tools' messages are
      dropped by wal2json (``filter-msg-prefixes`` would need to list every other prefix).
      ``actions`` does not filter messages.
    """
    tables = f"{escape_add_tables(table.schema)}.{escape_add_tables(table.name)}"
    return [
        ("format-version", "2"),
        ("include-transaction", "1"),
        ("include-xids", "1"),
        ("include-lsn", "1"),
        ("include-schemas", "1"),
        ("include-types", "0"),
        ("include-timestamp", "0"),
        ("include-type-oids", "0"),
        ("actions", "insert"),
        *([] if partitioned else [("add-tables", tables)]),
        ("add-msg-prefixes", MESSAGE_PREFIX),
    ]
