"""Sources: the replication-protocol stream (WAL mode) and the polling claimer."""
