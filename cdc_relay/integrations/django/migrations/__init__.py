"""The outbox app's migrations: each applies cdc-relay's own sql/ migrations (see 0001)."""
