"""WAL mode: the relay over one logical replication slot (docs/design.md, WAL mode).

One subpackage per feature: ``stream`` (the replication stream, one session, the loop
of sessions, the delivery mode), ``backfill`` (``--snapshot initial``: snapshot, publish
the rows, cut over to streaming), ``exactly_once`` (``--exactly-once``: Kafka
transactions and the checkpoint). Beside them, the slot's modules: ``setup`` creates and
checks the slot and the publication, ``continuity`` records the slot's history and
notices a loss, ``recovery`` (``--on-slot-loss recover``) republishes the retained rows
with the backfill - two modules rather than a room, since setup and the backfill read
the records while the recovery runs the backfill.
"""
