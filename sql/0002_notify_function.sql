-- cdc-relay migration 0002: the polling wake-up function (docs/design.md, the outbox table and polling mode).
--
-- Template: names in braces are filled with quoted identifiers by cdc_relay/app/init.py.
--
-- The trigger that calls it is optional (init's notify_trigger; WAL mode does not need
-- it and it costs inserts: docs/design.md, polling mode), so app/init.py creates or drops the trigger
-- itself. It is FOR EACH STATEMENT: a poller only needs a wake-up, then claims the
-- rows itself, so one NOTIFY per INSERT statement is enough, and cheaper than one per
-- row. The payload is empty: identical notifications of one transaction are folded
-- into one by PostgreSQL. The channel comes as the trigger's argument, so one function
-- serves every outbox table of the schema and the channel name is decided in one place
-- (OutboxConfig.notify_channel).

CREATE OR REPLACE FUNCTION {notify_function}() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
