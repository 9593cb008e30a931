"""Decoders: replication payload bytes -> Changes. Pure, no I/O."""
