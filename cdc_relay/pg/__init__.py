"""The PostgreSQL edge: connecting and wording its errors (``db``), and the catalog SQL the
features share (``slots``: the one slot query and the one idle-slot query; ``schema``: the
outbox's migrations and trigger; ``partitions``: a partitioned outbox's tree;
``identity``: the system identifier). No relay logic: the features above call these, and
nothing here imports a mode, a sink or a tool (docs/design.md, layers)."""
