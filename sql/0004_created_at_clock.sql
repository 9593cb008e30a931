-- cdc-relay migration 0004: created_at defaults to the insert's own clock time.
--
-- now() is the transaction's start time, so every event of one transaction got the
-- same created_at and polling mode could only break the tie by heap position (ctid),
-- which is not insertion order once PostgreSQL reuses free space. clock_timestamp()
-- gives each insert its own, increasing time: the polling claim's ORDER BY created_at
-- then follows insertion order within a transaction, and the Kafka timestamp of each
-- event is when it was written. WAL mode does not depend on it (it follows the WAL).
-- Rows inserted with an explicit created_at are unaffected.

ALTER TABLE {table} ALTER COLUMN {col_created_at} SET DEFAULT clock_timestamp();
