-- cdc-relay migration 0001: the outbox table, its polling index and dead letters (docs/design.md, the outbox table).
--
-- A template, not plain SQL: cdc_relay/app/init.py fills the names in braces with
-- psycopg.sql.Identifier values (quoted, validated) and nothing else. A literal brace
-- would have to be doubled. Every statement is idempotent.

CREATE TABLE IF NOT EXISTS {table} (
    {col_id} UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    {col_aggregate_type} VARCHAR(100) NOT NULL,
    {col_aggregate_id} VARCHAR(100) NOT NULL,
    {col_event_type} VARCHAR(100) NOT NULL,
    {col_payload} JSONB NOT NULL,
    attempts INT NOT NULL DEFAULT 0,
    {col_created_at} TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_at TIMESTAMPTZ,
    retry_after TIMESTAMPTZ,
    last_error TEXT,
    dead_lettered_at TIMESTAMPTZ
);

-- An outbox that already existed (a Debezium outbox table, say) gets the relay's
-- bookkeeping columns. On a fresh table this changes nothing.
ALTER TABLE {table}
    ADD COLUMN IF NOT EXISTS attempts INT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS {col_created_at} TIMESTAMPTZ NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS processed_at TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS retry_after TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS last_error TEXT,
    ADD COLUMN IF NOT EXISTS dead_lettered_at TIMESTAMPTZ;

-- The polling claim reads the oldest rows that are neither processed nor given up on;
-- the predicate matches its WHERE clause so the index holds only the pending backlog.
CREATE INDEX IF NOT EXISTS {pending_index} ON {table} ({col_created_at})
    WHERE processed_at IS NULL AND dead_lettered_at IS NULL;

-- Dead letters are an explicit state, so counting them (status, metrics) must not
-- scan the whole outbox. Rows enter this index only when given up on.
CREATE INDEX IF NOT EXISTS {dead_letter_index} ON {table} (dead_lettered_at)
    WHERE dead_lettered_at IS NOT NULL;

CREATE OR REPLACE VIEW {dead_letter_view} AS
    SELECT * FROM {table} WHERE dead_lettered_at IS NOT NULL;
