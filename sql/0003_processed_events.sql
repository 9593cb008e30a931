-- cdc-relay migration 0003: consumer-side deduplication (docs/design.md, the outbox table, cdc_relay/consumer.py).
--
-- Template: names in braces are filled with quoted identifiers by cdc_relay/app/init.py.
-- A consumer inserts the event id inside the transaction that applies the event; the
-- primary key makes a redelivered event a no-op.

CREATE TABLE IF NOT EXISTS {processed_events} (
    event_id UUID PRIMARY KEY,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
