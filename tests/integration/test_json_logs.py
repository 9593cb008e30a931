"""``--log-format json``: every line a relay writes to stderr is one JSON object.

Start-up, traffic, a dead letter, librdkafka's own lines, SIGTERM and a final error line
are all covered; event-level lines carry the event fields, lifecycle lines the slot, LSNs
and counts, and no line shows the DSN's password (the test cluster trusts every login,
so a password in the DSN is accepted and ignored).
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from cdc_relay.local.broker import Broker
from cdc_relay.local.helpers import free_port
from cdc_relay.outbox import emit
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, run_cli, wait_for

SECRET = "s3cret-Value-42"
EVENT_FIELDS = ("event_id", "event_type", "aggregate_id", "attempt")


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line parsed; a line that is not a JSON object fails the test."""
    records = []
    for line in text.splitlines():
        record = orjson.loads(line)
        assert isinstance(record, dict), line
        records.append(record)
    return records


def test_every_line_of_a_run_is_json_with_event_and_lifecycle_fields(
        db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    dsn = f"{db} password={SECRET}"
    with start_relay(dsn, broker.bootstrap, topic_prefix,
                     extra=("--log-format", "json")) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        with psycopg.connect(db) as conn:
            for n in range(5):
                emit(conn, "order", "o-1", "OrderPlaced", {"n": n})
            bad = emit(conn, "bad type!", "b-7", "Weird", {"x": 1})  # illegal topic name
        collector.collect(count=6, timeout=30)
        assert relay.stop() == 0
    assert relay.stdout == ""
    assert SECRET not in relay.stderr
    records = json_lines(relay.stderr)
    assert {"ts", "level", "logger", "msg"} <= set(records[0])

    dead = [r for r in records if "dead-letter" in r["msg"]]
    assert dead, relay.stderr
    assert all(field in dead[0] for field in EVENT_FIELDS)
    assert dead[0]["event_id"] == str(bad) and dead[0]["aggregate_id"] == "b-7"
    assert dead[0]["event_type"] == "Weird" and dead[0]["attempt"] >= 1

    start = next(r for r in records if r["msg"].startswith("WAL mode"))
    assert start["slot"] == "cdc_relay" and start["plugin"] == "wal2json"
    assert any("confirmed_lsn" in r for r in records if "streaming" in r["msg"])
    assert any(r["msg"].startswith("SIGTERM") for r in records)
    stopped = records[-1]
    # 6 acknowledged messages: 5 events and the dead letter.
    assert (stopped["published"], stopped["dead_lettered"]) == (5, 1)
    assert stopped["slot"] == "cdc_relay" and "/" in stopped["confirmed_lsn"]


def test_librdkafka_lines_go_through_the_json_logger(db: str) -> None:
    init_db(db)
    with start_relay(db, f"127.0.0.1:{free_port()}", "unused", wait=False,
                     extra=("--log-format", "json")) as relay:
        wait_for(lambda: '"logger":"cdc_relay.kafka"' in relay.stderr, timeout=40,
                 message="a librdkafka line")
        assert relay.stop() == 0
    records = json_lines(relay.stderr)
    assert any(r["logger"] == "cdc_relay.kafka" and "Connect to" in r["msg"] for r in records)


def test_the_final_error_line_is_json_too(db: str) -> None:
    result = run_cli("run", "--dsn", f"{db} password={SECRET}", "--brokers", "127.0.0.1:9",
                     "--table", "nope", "--log-format", "json")
    assert result.returncode == 2
    (record,) = json_lines(result.stderr)
    assert record["level"] == "error" and record["exit_code"] == 2
    assert "public.nope does not exist" in record["msg"]
    assert SECRET not in result.stderr
