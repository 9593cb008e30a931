"""``run --capture-truncate`` and the per-table metrics on the real stack: a TRUNCATE of a
captured table is one ``op: t`` event on its topic, and ``/metrics`` counts the captured
events by table and op and gives each table's lag."""

from __future__ import annotations

import json

import psycopg

from cdc_relay.local.helpers import free_port
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg, scrape, wait_for


def _ops(messages: list[Msg], topic: str) -> list[str | None]:
    return [None if m.value is None else json.loads(m.value)["op"]
            for m in messages if m.topic == topic]


def test_a_truncate_is_a_t_event_and_metrics_count_events_by_table_and_op(
        db: str, broker: object, topic_prefix: str) -> None:
    init_db(db, plugin="pgoutput")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text);"
                     "CREATE TABLE notes (id int PRIMARY KEY)")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    port = free_port()
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", extra=(
        "--capture", "public.items,public.notes", "--capture-prefix", topic_prefix,
        "--capture-truncate", "--metrics-port", str(port)))
    items, notes = f"{topic_prefix}.public.items", f"{topic_prefix}.public.notes"
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')")
            conn.execute("UPDATE items SET v = 'c' WHERE id = 1")
            conn.execute("DELETE FROM items WHERE id = 2")
            conn.execute("INSERT INTO notes VALUES (1)")
            conn.execute("TRUNCATE items, notes")
            conn.execute("INSERT INTO items VALUES (3, 'd')")
            published = conn.execute("SELECT pubtruncate FROM pg_publication WHERE pubname ="
                                     " 'cdc_relay_outbox'").fetchone()
        assert published == (True,)  # --capture-truncate made the publication publish them
        with KafkaCollector(bootstrap, topic_prefix) as collector:
            got = collector.collect(until=lambda ms: len(_ops(ms, items)) >= 7
                                    and len(_ops(ms, notes)) >= 2, timeout=60)
        assert _ops(got, items) == ["c", "c", "u", "d", None, "t", "c"]
        assert _ops(got, notes) == ["c", "t"]
        truncate = next(m for m in got if m.topic == items and m.value and b'"op":"t"' in m.value)
        value = json.loads(truncate.value or b"")
        assert (truncate.key, value["before"], value["after"]) == (None, None, None)
        assert value["source"]["table"] == "items"

        wanted = {"cdc_relay_captured_events_total{op=c,table=public.items}": 3.0,
                  "cdc_relay_captured_events_total{op=u,table=public.items}": 1.0,
                  "cdc_relay_captured_events_total{op=d,table=public.items}": 1.0,
                  "cdc_relay_captured_events_total{op=t,table=public.items}": 1.0,
                  "cdc_relay_captured_events_total{op=c,table=public.notes}": 1.0,
                  "cdc_relay_captured_events_total{op=t,table=public.notes}": 1.0}
        wait_for(lambda: all(scrape(port).get(k) == v for k, v in wanted.items()), timeout=30,
                 message="the per-table counters")
        metrics = scrape(port)
        assert "cdc_relay_captured_lag_seconds{table=public.items}" in metrics
        assert "cdc_relay_captured_lag_seconds{table=public.notes}" in metrics
    finally:
        relay.stop()


def test_a_snapshots_r_rows_are_counted_per_table_beside_the_streamed_changes(
        db: str, broker: object, topic_prefix: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text);"
                     "CREATE TABLE notes (id int PRIMARY KEY);"
                     "INSERT INTO items SELECT g, 'x' FROM generate_series(1, 25) g;"
                     "INSERT INTO notes VALUES (1), (2)")
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    port = free_port()
    relay = start_relay(db, bootstrap, topic_prefix, plugin="pgoutput", wait=False, extra=(
        "--capture", "public.items,public.notes", "--capture-prefix", topic_prefix,
        "--no-outbox", "--snapshot", "initial", "--metrics-port", str(port)))
    try:
        wait_for(lambda: "streaming from slot" in relay.stderr or not relay.running(), timeout=60,
                 message="the snapshot done, streaming")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("INSERT INTO items VALUES (26, 'y')")
        wanted = {"cdc_relay_captured_events_total{op=r,table=public.items}": 25.0,
                  "cdc_relay_captured_events_total{op=r,table=public.notes}": 2.0,
                  "cdc_relay_captured_events_total{op=c,table=public.items}": 1.0}
        wait_for(lambda: all(scrape(port).get(k) == v for k, v in wanted.items()), timeout=30,
                 message="the per-table counters, r rows included")
    finally:
        relay.stop()
