"""WAL mode: the relay over one logical replication slot (docs/design.md, WAL mode).

One subpackage per feature: ``stream`` (the replication stream, one session, the loop
of sessions, the delivery mode), ``backfill`` (``--snapshot initial``: snapshot, publish
the rows, cut over to streaming), ``exactly_once`` (``--exactly-once``: Kafka
transactions and the checkpoint), ``slot`` (``setup`` creates and checks the slot and
the publication, ``continuity`` records the slot's history and notices a loss). Above
the backfill, ``recovery`` (``--on-slot-loss recover``) republishes the retained rows
with it - not in ``slot``, since the backfill reads the slot's records while the
recovery runs the backfill. The rooms' order is a contract of ``make lint``.
"""
