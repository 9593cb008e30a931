"""Incremental snapshots' PostgreSQL edge: the chunk reader, the state and signal tables."""
