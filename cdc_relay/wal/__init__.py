"""WAL mode: the relay over one logical replication slot (docs/design.md, WAL mode).

One subpackage per feature: ``stream`` (the replication stream, one session, the loop
of sessions, the delivery mode), ``backfill`` (``--snapshot initial``: snapshot, publish
the rows, cut over to streaming), ``exactly_once`` (``--exactly-once``: Kafka
transactions and the checkpoint), ``continuity`` (slot-loss records and ``recover``).
``setup`` creates and checks the slot and the publication.
"""
