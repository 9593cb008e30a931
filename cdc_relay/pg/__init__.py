"""The PostgreSQL edge: connecting and wording its errors (``db``), and the catalog SQL the
features share (``partitions``: a partitioned outbox's tree; ``identity``: the system
identifier). No relay logic: the features above call these."""
