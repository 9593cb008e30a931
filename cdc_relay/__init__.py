"""cdc-relay: a transactional-outbox relay for PostgreSQL -> Kafka.

WAL mode streams committed outbox inserts from a logical replication slot and confirms
each LSN only after the broker acknowledged it; polling mode is the classic
``FOR UPDATE SKIP LOCKED`` relay. Users: README.md; maintainers: docs/design.md.
"""

__version__ = "0.1.0"
