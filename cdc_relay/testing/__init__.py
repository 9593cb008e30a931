"""Fakes of every loop Protocol, for unit tests: sink, replication source, batch source, monitor.

* ``FakeSink`` / ``FakeSinkFactory`` (``Sink``, ``SinkFactory``): an in-memory sink that
  can fail, hold back and reorder deliveries (its knobs: testing/sinks.py).
* ``FakeSlot`` / ``FakeSource`` (WAL mode's ``ReplicationSource``): a scripted slot that
  replays, like PostgreSQL, every transaction ending after its confirmed position.
* ``FakeOutbox`` (polling mode's ``BatchSource``): an in-memory outbox table.
* ``FakeMonitor`` (polling mode's ``Monitor``): a scripted number of NOTIFYs.

The fakes live by what they stand in for: ``sinks``, ``wal``, ``polling``; this module
only re-exports them, so ``from cdc_relay.testing import X`` is the one import path. Must
import no driver (the purity test checks).
"""

from __future__ import annotations

from cdc_relay.testing.polling import FakeMonitor, FakeOutbox, Row
from cdc_relay.testing.sinks import FakeSink, FakeSinkFactory, Reorder, reverse, shuffled
from cdc_relay.testing.wal import FakeSlot, FakeSource, Txn, wal2json_insert

__all__ = [
    "FakeMonitor",
    "FakeOutbox",
    "FakeSink",
    "FakeSinkFactory",
    "FakeSlot",
    "FakeSource",
    "Reorder",
    "Row",
    "Txn",
    "reverse",
    "shuffled",
    "wal2json_insert",
]
