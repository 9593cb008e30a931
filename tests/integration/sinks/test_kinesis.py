"""``--sink kinesis`` end to end against moto's server: both modes, kill -9, an outage, a refused
event, a missing stream, refused credentials, doctor.

moto stores every record it is given and never throttles (docs/sinks.md, moto's gaps): a
replay after a crash is a second record with the same ``id`` header in its envelope, and
the per-record failure path is tested in unit tests with a fake client. The tests assert
that every event arrives and each aggregate's first arrivals are in commit order, shard by
shard.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from cdc_relay.local.moto_server import MotoServer
from cdc_relay.outbox import emit
from tests.integration.sinks import scenarios
from tests.integration.sinks.kinesis_support import KinesisReader, kinesis_args
from tests.integration.sinks.support import poll_rows
from tests.integration.wal_support import AGGREGATE_TYPES, assert_contract, init_db, write_workload
from tests.support import Msg, init_outbox, run_cli, wait_for


class KinesisReceiver:
    def __init__(self, moto: MotoServer, reader: KinesisReader) -> None:
        self.moto, self.reader = moto, reader

    def relay_args(self) -> tuple[str, ...]:
        return ("--brokers", self.moto.url, *kinesis_args(self.reader.prefix, "--sink-config",
                                                          "read_timeout=1"))

    def arrived(self) -> list[Msg]:
        return [m for t in AGGREGATE_TYPES for m in self.reader.stream(t)]

    def dead_letters(self) -> list[Msg]:
        return self.reader.stream("dlq")

    @contextmanager
    def down(self) -> Iterator[None]:
        self.moto.pause()
        try:
            yield
        finally:
            self.moto.resume()


@pytest.fixture
def kinesis(moto: MotoServer, topic_prefix: str) -> Iterator[KinesisReader]:
    reader = KinesisReader(moto.url, topic_prefix)
    reader.create(*AGGREGATE_TYPES, "dlq")
    try:
        yield reader
    finally:
        reader.close()


@pytest.fixture
def receiver(moto: MotoServer, kinesis: KinesisReader) -> KinesisReceiver:
    return KinesisReceiver(moto, kinesis)


def emit_big(dsn: str) -> str:
    """An event over Kinesis's 1 MiB per record."""
    with psycopg.connect(dsn) as conn:
        event_id = emit(conn, "order", "order-big", "OrderChanged", {"blob": "x" * 1_100_000})
        conn.commit()
    return str(event_id)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_both_modes_put_the_contract_keyed_by_aggregate_in_order_and_dead_letter_a_too_large_event(
        mode: str, db: str, receiver: KinesisReceiver, topic_prefix: str) -> None:
    init_db(db)
    with scenarios.start(mode, db, receiver) as relay:
        expected = write_workload(db, transactions=15, seed=31, max_events=10)
        big = emit_big(db)
        messages = scenarios.everything(receiver, expected.ids)
        if mode == "run":  # WAL mode sends the dead letter without its payload
            letter = scenarios.dead_letter_of(receiver, big)
        else:  # polling mode sends it whole, which no stream takes: the row is the dead letter
            wait_for(lambda: any(row[0] == big and row[3] for row in poll_rows(db)), timeout=60,
                     message="the row dead-lettered")
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    assert big not in scenarios.ids_of(messages)
    if mode == "run":
        assert b"message too large" in letter.headers["error"] and letter.value is None
        assert int(letter.headers["payload_omitted_bytes"]) > 1_000_000
    else:
        assert "dead letter not copied" in relay.stderr
    keys_on: dict[tuple[bytes | None, str], set[int]] = {}
    for m in messages:
        assert m.headers["_PartitionKey"] == m.key  # the aggregate id
        keys_on.setdefault((m.key, m.topic), set()).add(m.partition)
    assert all(len(shards) == 1 for shards in keys_on.values())  # an aggregate keeps its shard


@pytest.mark.slow
def test_kill_9_mid_stream_loses_nothing_and_keeps_each_aggregates_order(
        db: str, receiver: KinesisReceiver, topic_prefix: str) -> None:
    scenarios.kill_9_mid_stream(db, receiver, topic_prefix)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_a_paused_endpoint_is_waited_out_and_nothing_is_lost_or_reordered(
        mode: str, db: str, receiver: KinesisReceiver, topic_prefix: str) -> None:
    scenarios.outage_waited_out(mode, db, receiver, topic_prefix,
                                lambda err: "again" in err or "did not answer" in err
                                or "message timeout" in err)


@pytest.mark.slow
def test_a_missing_stream_holds_its_events_until_it_exists_and_dead_letters_none(
        db: str, receiver: KinesisReceiver, kinesis: KinesisReader, topic_prefix: str) -> None:
    init_db(db)
    kinesis.client.delete_stream(StreamName=f"{topic_prefix}.invoice")
    with scenarios.start("run", db, receiver) as relay:
        expected = write_workload(db, transactions=10, seed=5, max_events=8)
        assert any(e["aggregate_type"] == "invoice" for e in expected.events)
        wait_for(lambda: "does not exist" in relay.stderr, timeout=60,
                 message="the relay reporting the missing stream")
        kinesis.create("invoice")
        messages = scenarios.everything(receiver, expected.ids)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    assert receiver.dead_letters() == []


def test_doctor_checks_the_kinesis_endpoint_and_streams(
        db: str, moto: MotoServer, kinesis: KinesisReader, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    args = ("doctor", "--dsn", db, "--mode", "poll", "--brokers", moto.url,
            *kinesis_args(topic_prefix))
    ready = run_cli(*args)
    assert "PASS  broker: kinesis" in ready.stdout and ready.returncode == 0, ready.stdout
    assert f"{topic_prefix}.order" in ready.stdout
    kinesis.client.delete_stream(StreamName=f"{topic_prefix}.dlq")
    missing = run_cli(*args)
    assert "FAIL  broker: dead-letter stream" in missing.stdout and missing.returncode == 1


@pytest.mark.slow
def test_refused_credentials_stop_the_relay_with_exit_6_and_the_fix(
        db: str, topic_prefix: str, moto: MotoServer) -> None:
    # ``moto``: the session's server sets the AWS settings (region, test keys) in the
    # environment the relay inherits; the strict server below is this test's own.
    init_db(db)
    with MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as strict:
        result = run_cli("run", "--dsn", db, "--brokers", strict.url,
                         *kinesis_args(topic_prefix), timeout=90)
    assert result.returncode == 6, result.stderr
    assert "kinesis:PutRecords" in result.stderr and "Traceback" not in result.stderr


def test_an_illegal_dead_letter_stream_name_is_refused_at_start_up(moto: MotoServer) -> None:
    result = run_cli("poll", "--dsn", "postgresql://nobody@127.0.0.1:1/none", "--sink", "kinesis",
                     "--brokers", moto.url, "--dead-letter-topic", "dead letters")
    assert result.returncode == 2 and "not legal in Kinesis" in result.stderr
