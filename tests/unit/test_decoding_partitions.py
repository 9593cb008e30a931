"""wal2json and a partitioned outbox: rows under partition names, decided once per table."""

from __future__ import annotations

import orjson
import pytest

from cdc_relay.config import TableRef
from cdc_relay.decoding.wal2json import Wal2JsonDecoder, plugin_options
from cdc_relay.errors import SourceLost
from cdc_relay.model import Lsn, OutboxColumns, OutboxEvent
from tests.unit.decoding_fixtures import WAL2JSON_PATHS

OUTBOX = TableRef("public", "outbox_events")


class FakeTree:
    """The catalog: which tables are partitions now; which no longer exist."""

    def __init__(self, partitions: set[tuple[str, str]], gone: set[tuple[str, str]] = frozenset()):
        self.partitions = partitions
        self.gone = gone
        self.asked: list[tuple[str, str]] = []
        self.fail = False

    def refresh(self, schema: str, table: str) -> tuple[frozenset[tuple[str, str]], bool]:
        if self.fail:
            raise SourceLost("catalog down")
        self.asked.append((schema, table))
        key = (schema, table)
        return frozenset(self.partitions), key in self.partitions or key in self.gone


def row(table: str, *, schema: str = "public", outbox_shaped: bool = True) -> bytes:
    columns = [{"name": "id", "value": "7616f707-0000-4000-8000-000000000001"},
               {"name": "aggregate_type", "value": "order"},
               {"name": "aggregate_id", "value": "o-1"},
               {"name": "event_type", "value": "Placed"},
               {"name": "payload", "value": '{"n": 1}'},
               {"name": "created_at", "value": "2026-01-10 00:00:00+00"}]
    if not outbox_shaped:
        columns = [{"name": "id", "value": 1}, {"name": "note", "value": "x"}]
    return orjson.dumps({"action": "I", "schema": schema, "table": table, "columns": columns})


@WAL2JSON_PATHS
def test_rows_of_partitions_are_events_and_each_table_is_looked_up_once(compiled: bool) -> None:
    tree = FakeTree({("public", "outbox_events_01"), ("public", "outbox_events_02")})
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), tree)
    for _ in range(3):
        assert isinstance(decoder.decode(row("outbox_events_01"), Lsn(10)), OutboxEvent)
    # The first lookup loaded the whole tree: the second partition needs no question.
    assert isinstance(decoder.decode(row("outbox_events_02"), Lsn(11)), OutboxEvent)
    assert tree.asked == [("public", "outbox_events_01")]


@WAL2JSON_PATHS
def test_a_partition_created_later_is_found_when_its_first_row_arrives(compiled: bool) -> None:
    tree = FakeTree({("public", "outbox_events_01")})
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), tree)
    assert decoder.decode(row("outbox_events_01"), Lsn(10)) is not None
    tree.partitions.add(("archive", "outbox_events_02"))  # CREATE TABLE ... PARTITION OF
    assert decoder.decode(row("outbox_events_02", schema="archive"), Lsn(11)) is not None


@WAL2JSON_PATHS
def test_a_known_partition_stays_known_after_it_is_dropped(compiled: bool) -> None:
    tree = FakeTree({("public", "outbox_events_01")})
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), tree)
    assert decoder.decode(row("outbox_events_01"), Lsn(10)) is not None
    tree.partitions.clear()  # DROP TABLE outbox_events_01; its rows are still in the stream
    decoder.reset()  # even across a reconnect
    assert decoder.decode(row("outbox_events_01"), Lsn(11)) is not None


@WAL2JSON_PATHS
def test_rows_of_a_dropped_table_with_the_outbox_s_columns_are_events(compiled: bool) -> None:
    tree = FakeTree(set(), gone={("public", "outbox_events_00")})
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), tree)
    assert decoder.decode(row("outbox_events_00"), Lsn(10)) is not None


@WAL2JSON_PATHS
def test_other_tables_are_ignored_and_only_outbox_shaped_ones_are_looked_up(compiled: bool) -> None:
    tree = FakeTree(set())
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), tree)
    assert decoder.decode(row("orders", outbox_shaped=False), Lsn(10)) is None
    assert decoder.decode(row("lookalike"), Lsn(11)) is None
    assert decoder.decode(row("lookalike"), Lsn(12)) is None
    assert tree.asked == [("public", "lookalike")]


@WAL2JSON_PATHS
def test_a_failed_lookup_raises_instead_of_skipping_the_row(compiled: bool) -> None:
    tree = FakeTree(set())
    tree.fail = True
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns(), tree)
    with pytest.raises(SourceLost):
        decoder.decode(row("outbox_events_01"), Lsn(10))


@WAL2JSON_PATHS
def test_without_a_catalog_only_the_outbox_s_own_name_counts(compiled: bool) -> None:
    decoder = Wal2JsonDecoder(OUTBOX, OutboxColumns())
    assert decoder.decode(row("outbox_events_01"), Lsn(10)) is None
    assert decoder.decode(row("outbox_events"), Lsn(11)) is not None


def test_a_partitioned_outbox_streams_without_add_tables() -> None:
    assert "add-tables" in dict(plugin_options(OUTBOX))
    options = dict(plugin_options(OUTBOX, partitioned=True))
    assert "add-tables" not in options and options["actions"] == "insert"
