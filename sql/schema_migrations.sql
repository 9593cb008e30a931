-- Bookkeeping of cdc-relay's migrations, one row per (outbox table, version) applied.
--
-- Not a numbered migration: app/init.py creates it first, under the advisory lock, to
-- learn which numbered migrations are pending. Names in braces are quoted identifiers.

CREATE TABLE IF NOT EXISTS {migrations} (
    table_name TEXT NOT NULL,
    version INT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
);
