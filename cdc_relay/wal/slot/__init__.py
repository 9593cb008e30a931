"""WAL mode's slot: creating and checking it with its publication (``setup``), and its
history, which notices a lost slot (``continuity``). Below the backfill and the stream's
users; the recovery that republishes after a loss is wal/recovery.py, above the backfill."""
