"""WAL mode's dead letters: listed from the topic and replayed once the cause is fixed."""

from __future__ import annotations

import uuid

import orjson
import psycopg

from cdc_relay.local.broker import Broker
from cdc_relay.outbox import emit
from tests.integration.wal_support import init_db, start_relay
from tests.support import KafkaCollector, Msg, run_cli


def _ids(messages: list[Msg], topic: str) -> list[str]:
    return [m.headers["id"].decode() for m in messages if m.topic == topic]


def test_dead_letters_round_trip_from_the_topic(db: str, broker: Broker, topic_prefix: str) -> None:
    init_db(db)
    dlq = topic_prefix + ".dlq"
    with psycopg.connect(db) as conn:
        # An aggregate type that makes an illegal topic name: dead-lettered, then deleted.
        bad = str(emit(conn, "bad type", "a-1", "Odd", {"x": 1}))
        worse = str(emit(conn, "bad type", "a-2", "Odd", {"x": 2}))
        good = str(emit(conn, "order", "o-1", "Placed", {"x": 3}))
        conn.commit()
        conn.execute("DELETE FROM outbox_events")
        conn.commit()
    with start_relay(db, broker.bootstrap, topic_prefix) as relay, \
            KafkaCollector(broker.bootstrap, topic_prefix) as collector:
        first = collector.collect(until=lambda ms: {bad, worse} <= set(_ids(ms, dlq))
                                  and good in _ids(ms, topic_prefix + ".order"), timeout=60)
        assert relay.stop() == 0, relay.stderr

        listed = run_cli("dead-letters", "list", "--from-topic", dlq, "--brokers", broker.bootstrap,
                         "--format", "json")
        assert listed.returncode == 0, listed.stderr
        rows = orjson.loads(listed.stdout)
        assert {row["id"] for row in rows} == {bad, worse}
        assert all("contains" in row["error"] for row in rows)

        fixed = topic_prefix + ".fixed.{event_type}"
        replay = run_cli("dead-letters", "replay", "--from-topic", dlq, "--brokers",
                         broker.bootstrap, "--id", bad, "--topic-pattern", fixed)
        assert replay.returncode == 0, replay.stderr
        assert f"replayed {bad} to {topic_prefix}.fixed.Odd" in replay.stdout
        unknown = run_cli("dead-letters", "replay", "--from-topic", dlq, "--brokers",
                          broker.bootstrap, "--id", str(uuid.uuid4()), "--id", worse)
        assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
        assert "no dead letter with id" in unknown.stderr
        messages = collector.collect(until=lambda ms: bad in _ids(ms, topic_prefix + ".fixed.Odd"),
                                     timeout=60)
    [replayed] = [m for m in messages if m.topic == topic_prefix + ".fixed.Odd"]
    [original] = [m for m in first if m.topic == dlq and m.headers["id"].decode() == bad]
    assert replayed.key == original.key == b"a-1"
    assert replayed.value == original.value and orjson.loads(replayed.value or b"") == {"x": 1}
    assert replayed.headers == {"id": bad.encode(), "event_type": b"Odd",
                                "aggregate_type": b"bad type"}
    assert replayed.timestamp == original.timestamp
    # Nothing was removed from the topic: both dead letters are still listed.
    again = run_cli("dead-letters", "list", "--from-topic", dlq, "--brokers", broker.bootstrap,
                    "--format", "json")
    assert {row["id"] for row in orjson.loads(again.stdout)} == {bad, worse}


def test_bad_replay_input_is_one_line_and_exit_2(broker: Broker, topic_prefix: str) -> None:
    missing = run_cli("dead-letters", "replay", "--from-topic", topic_prefix + ".nothing",
                      "--brokers", broker.bootstrap, "--all")
    no_selection = run_cli("dead-letters", "replay", "--from-topic", topic_prefix + ".nothing",
                           "--brokers", broker.bootstrap)
    no_source = run_cli("dead-letters", "list")
    for result in (missing, no_selection, no_source):
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "does not exist" in missing.stderr
    assert "--id" in no_selection.stderr and "--from-topic" in no_source.stderr
