"""The migration guides of docs/migration.md, end to end.

From polling mode (our poller, and a classic poller of another kind that sets
processed_at) stopped mid-backlog, then ``run --snapshot initial``; and from Debezium's
outbox event router: its table (``--columns debezium``), its slot reused with ``--slot``.
Debezium itself does not run here: its part is played by what it leaves behind - the
slot, confirmed up to some position behind what it had already published.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter

import psycopg
import pytest
from confluent_kafka import Producer

from cdc_relay.local.broker import Broker
from tests.integration.backfill_support import (
    assert_aggregate_order,
    assert_messages_match_rows,
    count,
    ids_of,
    init_no_slot,
    insert_rows,
    start_backfilling_relay,
    wait_streaming,
)
from tests.support import CliProcess, KafkaCollector, run_cli, wait_for

PROCESSED = "SELECT count(*) FROM outbox_events WHERE processed_at IS NOT NULL"


class ClassicPoller(threading.Thread):
    """The classic article's relay: claim a batch, produce it, wait, set processed_at."""

    def __init__(self, dsn: str, bootstrap: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.prefix = dsn, prefix
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn) as conn:
            while not self.halt.is_set():
                rows = conn.execute(
                    "SELECT id, aggregate_type, aggregate_id, event_type, payload::text,"
                    " floor(extract(epoch FROM created_at) * 1000)::bigint FROM outbox_events"
                    " WHERE processed_at IS NULL ORDER BY created_at LIMIT 100"
                    " FOR UPDATE SKIP LOCKED").fetchall()
                for event_id, agg_type, agg_id, event_type, payload, ms in rows:
                    self.producer.produce(f"{self.prefix}.{agg_type}", key=agg_id, value=payload,
                                          timestamp=ms, headers=[
                                              ("id", str(event_id)), ("event_type", event_type),
                                              ("aggregate_type", agg_type)])
                assert self.producer.flush(30) == 0
                conn.execute("UPDATE outbox_events SET processed_at = now() WHERE id = ANY(%s)",
                             ([r[0] for r in rows],))
                conn.commit()

    def stop(self) -> None:
        self.halt.set()
        self.join(60)


@pytest.mark.parametrize("poller", ["cdc-relay poll", "classic poller"])
def test_from_polling_a_poller_stopped_mid_backlog_then_snapshot_initial_loses_nothing(
    db: str, broker: Broker, topic_prefix: str, poller: str
) -> None:
    init_no_slot(db)
    backlog = insert_rows(db, 0, 6000, per_txn=500)
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        if poller == "cdc-relay poll":
            process = CliProcess(["poll", "--dsn", db, "--brokers", broker.bootstrap,
                                  "--topic-pattern", topic_prefix + ".{aggregate_type}"])
            wait_for(lambda: count(db, PROCESSED) >= 1000, timeout=60, message="polling")
            assert process.stop(signal.SIGTERM) == 0, process.stderr  # finishes its batch
        else:
            classic = ClassicPoller(db, broker.bootstrap, topic_prefix)
            classic.start()
            wait_for(lambda: count(db, PROCESSED) >= 1000, timeout=60, message="polling")
            classic.stop()
        left = count(db, "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL")
        assert 0 < left < len(backlog)  # stopped mid-backlog
        with start_backfilling_relay(db, broker.bootstrap, topic_prefix) as relay:
            wait_streaming(relay)
            live = insert_rows(db, 50_000, 200, per_txn=20)
            expected = set(backlog) | set(live)
            messages = collector.collect(until=lambda ms: set(ids_of(ms)) >= expected,
                                         timeout=90)
            assert relay.stop() == 0, relay.stderr
    published = ids_of(messages)
    assert set(published) == expected
    assert [i for i, n in Counter(published).items() if n > 1] == []  # the normal case
    assert_aggregate_order(messages)
    assert_messages_match_rows(db, messages, topic_prefix)


def test_from_debezium_its_slot_is_reused_and_only_unconfirmed_events_repeat(
    db: str, broker: Broker, topic_prefix: str
) -> None:
    columns = ("aggregatetype", "aggregateid", "type", "payload")
    with psycopg.connect(db, autocommit=True) as conn:  # what a Debezium deployment has
        conn.execute("CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),"
                     " aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,"
                     " type varchar(255) NOT NULL, payload jsonb)")
        conn.execute("CREATE PUBLICATION dbz_publication FOR TABLE outbox")
        conn.execute("SELECT pg_create_logical_replication_slot('debezium', 'pgoutput')")
    # Step 1 of the guide, while Debezium still runs: the bookkeeping columns.
    init_no_slot(db, "--table", "outbox", "--columns", "debezium", "--no-trigger")
    published_by_debezium = insert_rows(db, 0, 20, per_txn=10, table="outbox", cols=columns)
    confirmed_point = _current_lsn(db)
    published_by_debezium += insert_rows(db, 20, 20, per_txn=10, table="outbox", cols=columns)
    # Debezium had published those 40 but confirmed (flushed its offsets) only 20 of them.
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT pg_replication_slot_advance('debezium', %s::pg_lsn)",
                     (confirmed_point,))
    # Step 2: Debezium stopped; the application keeps writing.
    while_switching = insert_rows(db, 1000, 30, per_txn=10, table="outbox", cols=columns)
    with KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        relay = CliProcess(["run", "--dsn", db, "--brokers", broker.bootstrap,
                            "--table", "outbox", "--columns", "debezium", "--slot", "debezium",
                            "--plugin", "pgoutput", "--publication", "dbz_publication",
                            "--topic-pattern", topic_prefix + ".{aggregate_type}"])
        with relay:
            wait_streaming(relay)
            expected = set(published_by_debezium[20:]) | set(while_switching)
            messages = collector.collect(until=lambda ms: set(ids_of(ms)) >= expected,
                                         timeout=60)
            assert relay.stop() == 0, relay.stderr
    published = ids_of(messages)
    assert set(published) == expected  # nothing Debezium had confirmed comes again
    assert len(published) == len(set(published))
    assert_messages_match_rows(db, messages, topic_prefix, table="outbox",
                               agg_id="aggregateid", event_type="type")
    assert_aggregate_order(messages)
    # The refusal names the way out when the guide is misread (--snapshot initial + --slot).
    refused = run_cli("run", "--dsn", db, "--brokers", broker.bootstrap, "--table", "outbox",
                      "--columns", "debezium", "--slot", "debezium", "--plugin", "pgoutput",
                      "--publication", "dbz_publication", "--snapshot", "initial")
    assert refused.returncode == 2 and "--snapshot never" in refused.stderr


def _current_lsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])
