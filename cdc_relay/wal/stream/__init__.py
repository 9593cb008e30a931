"""Streaming: read the slot, decode, route, produce, confirm (docs/design.md, WAL mode).

``protocol`` (the wire format), ``replication`` (the stream over psycopg's connection,
with the compiled reader ``_cstream``), ``session`` (one replication connection's worth),
``loop`` (sessions with reconnects), ``delivery`` (at-least-once or another mode)."""
