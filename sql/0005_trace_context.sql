-- cdc-relay migration 0005 (optional): W3C trace context columns (docs/messages.md, trace context).
--
-- Applied only when asked (`cdc-relay init --with-trace-context`; cdc_relay/app/init.py
-- lists it in OPTIONAL_MIGRATIONS), then recorded like any other migration. Template:
-- names in braces are filled with quoted identifiers by cdc_relay/app/init.py.
--
-- cdc_relay.outbox.emit fills them (explicitly, or from the current OpenTelemetry span);
-- both relay modes copy them into the `traceparent` / `tracestate` headers. NULL means
-- no header. Adding a nullable column without a default rewrites nothing.

ALTER TABLE {table}
    ADD COLUMN IF NOT EXISTS traceparent TEXT,
    ADD COLUMN IF NOT EXISTS tracestate TEXT;

-- The dead-letter view is SELECT *: its column list was fixed when it was created, so it
-- is replaced to show the new columns (they come last, which CREATE OR REPLACE allows).
CREATE OR REPLACE VIEW {dead_letter_view} AS
    SELECT * FROM {table} WHERE dead_lettered_at IS NOT NULL;
