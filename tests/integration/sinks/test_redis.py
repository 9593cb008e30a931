"""``--sink redis`` end to end against a redis-server of the session's own: both modes,
kill -9, an outage, a refused event, refused credentials, doctor.

Redis Streams keep no deduplication: a replay after a crash is a second entry with the same
``id`` field (consumers drop it, docs/sinks.md), so the tests assert that every event
arrives and each aggregate's first arrivals are in commit order.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from cdc_relay.local.message_brokers import RedisServer
from cdc_relay.outbox import emit
from tests.integration.sinks import scenarios
from tests.integration.sinks.redis_support import RedisReader, redis_args
from tests.integration.wal_support import init_db, write_workload
from tests.support import Msg, init_outbox, run_cli, wait_for


class RedisReceiver:
    def __init__(self, server: RedisServer, reader: RedisReader, *extra: str) -> None:
        self.server, self.reader, self.extra = server, reader, extra

    def relay_args(self) -> tuple[str, ...]:
        return ("--brokers", self.server.url, *redis_args(self.reader.prefix, "--sink-config",
                                                          "read_timeout=1", *self.extra))

    def arrived(self) -> list[Msg]:
        return self.reader.everything()

    def dead_letters(self) -> list[Msg]:
        return self.reader.stream("dlq")

    @contextmanager
    def down(self) -> Iterator[None]:
        self.server.pause()
        try:
            yield
        finally:
            self.server.resume()


@pytest.fixture
def receiver(redis_server: RedisServer, redis_reader: RedisReader) -> RedisReceiver:
    return RedisReceiver(redis_server, redis_reader)


def blocked_event(reader: RedisReader) -> Callable[[str], str]:
    """An event whose stream's key holds a string: Redis answers its XADD with WRONGTYPE."""
    def emit_blocked(dsn: str) -> str:
        reader.client.set(f"{reader.prefix}.blocked", "not a stream")
        with psycopg.connect(dsn) as conn:
            event_id = emit(conn, "blocked", "blocked-1", "BlockedChanged", {"n": 1})
            conn.commit()
        return str(event_id)
    return emit_blocked


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_both_modes_deliver_the_contract_in_aggregate_order_and_dead_letter_a_wrongtype_stream(
        mode: str, db: str, receiver: RedisReceiver, redis_reader: RedisReader,
        topic_prefix: str) -> None:
    messages, letter = scenarios.deliver_both_modes(mode, db, receiver, topic_prefix,
                                                    blocked_event(redis_reader))
    assert b"WRONGTYPE" in letter.headers["error"]
    assert letter.headers["original_topic"] == f"{topic_prefix}.blocked".encode()
    for m in messages:
        assert int(m.headers["timestamp"]) > 0 and m.headers["aggregate_id"] == m.key


@pytest.mark.slow
def test_kill_9_mid_stream_loses_nothing_and_keeps_each_aggregates_order(
        db: str, receiver: RedisReceiver, topic_prefix: str) -> None:
    scenarios.kill_9_mid_stream(db, receiver, topic_prefix)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_a_paused_redis_is_waited_out_and_nothing_is_lost_or_reordered(
        mode: str, db: str, receiver: RedisReceiver, topic_prefix: str) -> None:
    scenarios.outage_waited_out(mode, db, receiver, topic_prefix,
                                lambda err: "again" in err or "did not answer" in err)


@pytest.mark.slow
def test_maxlen_trims_each_stream_to_about_n_entries(
        db: str, redis_server: RedisServer, redis_reader: RedisReader, topic_prefix: str) -> None:
    init_db(db)
    receiver = RedisReceiver(redis_server, redis_reader, "--sink-config", "maxlen=10")
    with scenarios.start("run", db, receiver) as relay:
        expected = write_workload(db, transactions=30, seed=3, max_events=10, rollback_every=0)
        last = str(expected.events[-1]["id"])
        wait_for(lambda: last in scenarios.ids_of(redis_reader.everything()), timeout=60,
                 message="the last event")
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    lengths = [redis_reader.client.xlen(f"{topic_prefix}.{t}") for t in ("order", "customer")]
    assert all(n < len(expected.events) for n in lengths)  # trimmed ("~": whole macro nodes)


def test_doctor_checks_redis_and_says_which_keys_are_not_streams(
        db: str, redis_server: RedisServer, redis_reader: RedisReader, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    args = ("doctor", "--dsn", db, "--mode", "poll", "--brokers", redis_server.url,
            *redis_args(topic_prefix))
    fine = run_cli(*args)
    assert "PASS  broker: redis" in fine.stdout and fine.returncode == 0, fine.stdout
    redis_reader.client.set(f"{topic_prefix}.dlq", "a string")
    wrong = run_cli(*args)
    assert "FAIL  broker: dead-letter stream" in wrong.stdout and wrong.returncode == 1
    assert "not a stream" in wrong.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_a_wrong_password_stops_either_mode_with_exit_6_and_the_fix(
        mode: str, db: str, topic_prefix: str) -> None:
    init_db(db)
    with RedisServer(password="right") as strict:
        url = strict.url.replace(":right@", ":wrong@")
        result = run_cli(mode, "--dsn", db, "--brokers", url, *redis_args(topic_prefix),
                         timeout=90)
    assert result.returncode == 6, result.stderr
    assert "refused the relay" in result.stderr and "wrong" not in result.stderr
    assert "Traceback" not in result.stderr


def test_an_amqp_address_with_sink_redis_is_refused_at_start_up() -> None:
    result = run_cli("poll", "--dsn", "postgresql://nobody@127.0.0.1:1/none", "--sink", "redis",
                     "--brokers", "amqp://guest:guest@127.0.0.1:5672/")
    assert result.returncode == 2 and "redis://" in result.stderr


