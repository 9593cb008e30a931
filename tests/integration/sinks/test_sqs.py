"""``--sink sqs`` end to end against moto's server: both modes, kill -9, dead letters, missing queues, doctor.

moto keeps no record of a deduplication id once its message is deleted (docs/sinks.md,
moto's gaps), and these tests delete what they receive: a replay after a crash therefore
arrives twice here, where SQS would drop it within 5 minutes. The tests assert what SQS
and moto share - every event arrives, each aggregate's first arrivals in commit order -
and count copies only where the first copy is still in the queue.
"""

from __future__ import annotations

import os
import signal

import orjson
import psycopg
import pytest

from cdc_relay.local import moto_server
from cdc_relay.local.helpers import free_port, listens_on
from cdc_relay.local.moto_server import MotoServer
from cdc_relay.outbox import emit
from tests.integration.sinks.sqs_support import SqsReader, ids_of, sqs_args
from tests.integration.sinks.support import poll_rows
from tests.integration.wal_support import (
    AGGREGATE_TYPES,
    Expected,
    assert_contract,
    init_db,
    write_workload,
)
from tests.support import CliProcess, Msg, init_outbox, run_cli, wait_for

QUEUES = [f"{t}.fifo" for t in AGGREGATE_TYPES]


def start(mode: str, dsn: str, url: str, prefix: str, *extra: str) -> CliProcess:
    """``cdc-relay run`` or ``poll`` to moto; ``run`` returns once it is streaming."""
    common = ["--dsn", dsn, "--brokers", url, "--message-timeout", "10s", *sqs_args(prefix),
              *extra]
    if mode == "run":
        relay = CliProcess(["run", *common, "--status-interval", "200ms"])
        wait_for(lambda: "streaming from slot" in relay.stderr or not relay.running(),
                 timeout=60, message="the relay streaming")
    else:
        relay = CliProcess(["poll", *common, "--interval", "200ms"])
    assert relay.running(), relay.stderr
    return relay


def everything(sqs: SqsReader, ids: set[str], queues: list[str] = QUEUES) -> list[Msg]:
    return sqs.collect(queues, lambda got: ids_of(got) >= ids)


def emit_big(dsn: str, prefix: str, size: int) -> str:
    with psycopg.connect(dsn) as conn:
        event_id = emit(conn, "order", "order-big", "OrderChanged", {"blob": "x" * size})
        conn.commit()
    return str(event_id)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_both_modes_deliver_the_contract_in_aggregate_order_and_dead_letter_a_too_large_event(
        mode: str, db: str, moto_url: str, sqs: SqsReader, topic_prefix: str) -> None:
    init_db(db)
    sqs.create(*QUEUES, "dlq.fifo")
    sqs.client.set_queue_attributes(QueueUrl=sqs.queue_url("order.fifo"),
                                    Attributes={"MaximumMessageSize": "2048"})
    with start(mode, db, moto_url, topic_prefix) as relay:
        expected = write_workload(db, transactions=20, seed=31, max_events=10)
        big = emit_big(db, topic_prefix, 4096)
        messages = everything(sqs, expected.ids)
        dead = sqs.collect(["dlq.fifo"], lambda got: big in ids_of(got))
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    for m in messages:
        assert m.headers["_MessageGroupId"] == m.key  # the aggregate id
        assert m.headers["_MessageDeduplicationId"] == m.headers["id"]
    assert big not in ids_of(messages)
    [letter] = dead
    assert letter.headers["id"] == big.encode()
    assert b"too large" in letter.headers["error"]
    assert letter.headers["original_topic"] == f"{topic_prefix}-order.fifo".encode()
    if mode == "run":  # WAL mode omits a payload its broker refused as too large
        assert letter.value == b"null" and int(letter.headers["payload_omitted_bytes"]) > 4096
    else:  # polling mode sends it whole (the row keeps it as well)
        assert orjson.loads(letter.value or b"") == {"blob": "x" * 4096}
        rows = {row[0]: row for row in poll_rows(db)}
        assert rows[big][3] and all(rows[i][2] for i in expected.ids)  # dead-lettered, processed


@pytest.mark.slow
def test_kill_9_mid_stream_loses_nothing_and_keeps_each_aggregates_order(
        db: str, moto_url: str, sqs: SqsReader, topic_prefix: str) -> None:
    """SIGKILL while committed events are still on their way: the relay is frozen, and killed
    only if some committed event has not arrived yet (else thawed, and more is written)."""
    init_db(db)
    sqs.create(*QUEUES, "dlq.fifo")
    expected = Expected()
    relay = start("run", db, moto_url, topic_prefix)
    seeds = iter(range(100, 200))

    def kill_mid_stream() -> set[str] | None:
        write_workload(db, transactions=10, seed=next(seeds), expected=expected, max_events=8)
        os.kill(relay.proc.pid, signal.SIGSTOP)
        arrived = ids_of(everything_now(sqs))
        if arrived and not expected.ids <= arrived:
            relay.kill()
            return arrived
        os.kill(relay.proc.pid, signal.SIGCONT)
        return None

    with relay:
        arrived_at_kill = wait_for(kill_mid_stream, timeout=120, interval=0.1,
                                   message="a moment with events on their way")
    write_workload(db, transactions=5, seed=300, expected=expected, max_events=8)  # while down
    with start("run", db, moto_url, topic_prefix) as again:
        messages = everything(sqs, expected.ids)
        assert again.stop(signal.SIGTERM) == 0, again.stderr
    assert expected.ids - arrived_at_kill  # some events were still on their way at the kill
    assert_contract(messages, expected, topic_prefix)


def everything_now(sqs: SqsReader) -> list[Msg]:
    return [m for q in QUEUES for m in sqs.receive(q)]


@pytest.mark.slow
def test_a_missing_queue_holds_its_events_until_it_exists_and_dead_letters_none(
        db: str, moto_url: str, sqs: SqsReader, topic_prefix: str) -> None:
    init_db(db)
    sqs.create("order.fifo", "customer.fifo", "dlq.fifo")  # no invoice queue yet
    with start("run", db, moto_url, topic_prefix) as relay:
        expected = write_workload(db, transactions=10, seed=5, max_events=8)
        assert any(e["aggregate_type"] == "invoice" for e in expected.events)
        wait_for(lambda: "does not exist" in relay.stderr, timeout=60,
                 message="the relay reporting the missing queue")
        assert relay.running(), relay.stderr
        sqs.create("invoice.fifo")
        messages = everything(sqs, expected.ids)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    assert sqs.receive("dlq.fifo") == []
    assert f"{topic_prefix}-invoice.fifo" in relay.stderr
    assert f"aws sqs create-queue --queue-name {topic_prefix}-invoice.fifo" in relay.stderr
    assert "create the topic" not in relay.stderr


@pytest.mark.slow
def test_poll_mode_to_standard_queues_sends_no_group_or_dedup_id(
        db: str, moto_url: str, sqs: SqsReader, topic_prefix: str) -> None:
    init_db(db)
    queues = list(AGGREGATE_TYPES)
    sqs.create(*queues, "dlq")
    with CliProcess(["poll", "--dsn", db, "--brokers", moto_url, "--interval", "200ms",
                     *sqs_args(topic_prefix, fifo=False)]) as poller:
        expected = write_workload(db, transactions=8, seed=9, max_events=6)
        messages = everything(sqs, expected.ids, queues)
        assert poller.stop(signal.SIGTERM) == 0, poller.stderr
    by_id = {str(e["id"]): e for e in expected.events}
    assert ids_of(messages) == expected.ids
    for m in messages:
        event = by_id[m.headers["id"].decode()]
        assert orjson.loads(m.value or b"") == event["payload"]
        assert "_MessageGroupId" not in m.headers and "_MessageDeduplicationId" not in m.headers


def test_too_many_header_columns_and_illegal_queue_names_are_refused_at_start_up(
        moto_url: str) -> None:
    dsn = "postgresql://nobody@127.0.0.1:1/none"
    headers = run_cli("run", "--dsn", dsn, "--sink", "sqs", "--brokers", moto_url,
                      "--header", "a", "--header", "b")
    assert headers.returncode == 2 and "do not fit SQS's 10 message attributes" in headers.stderr
    assert "Traceback" not in headers.stderr
    dotted = run_cli("poll", "--dsn", dsn, "--sink", "sqs", "--brokers", moto_url,
                     "--topic-pattern", "outbox.{aggregate_type}")
    assert dotted.returncode == 2 and "not legal in SQS" in dotted.stderr


def test_doctor_checks_the_sqs_endpoint_and_queues(db: str, moto_url: str, sqs: SqsReader,
                                                   topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    args = ("doctor", "--dsn", db, "--mode", "poll", "--brokers", moto_url, *sqs_args(topic_prefix))
    missing = run_cli(*args)
    assert "PASS  broker: sqs" in missing.stdout, missing.stdout
    assert "FAIL  broker: dead-letter queue" in missing.stdout and missing.returncode == 1
    assert "WARN  broker: queues" in missing.stdout
    assert f"no queue of '{topic_prefix}-{{aggregate_type}}.fifo' exists yet" in missing.stdout
    assert "ListQueues" not in missing.stdout
    sqs.create("order.fifo", "dlq.fifo")
    sqs.create("customer")  # a standard queue that fits the pattern's prefix, not its .fifo
    ready = run_cli(*args)
    assert ready.returncode == 0, ready.stdout
    assert "PASS  broker: queue" in ready.stdout and f"{topic_prefix}-order.fifo" in ready.stdout
    assert f"{topic_prefix}-customer'" not in ready.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_refused_credentials_stop_either_mode_with_exit_6_and_the_fix(
        mode: str, db: str, moto_url: str, topic_prefix: str) -> None:
    init_db(db)
    with MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as strict:
        result = run_cli(mode, "--dsn", db, "--brokers", strict.url, *sqs_args(topic_prefix),
                         timeout=90)
    assert result.returncode == 6, result.stderr
    assert "sqs:SendMessage" in result.stderr and "Traceback" not in result.stderr


def test_a_moto_server_never_passes_off_another_servers_port_as_its_own(
        moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Parallel workers pick free ports too: the first port offered here is the session's
    # server's, so the new one must notice it answers there with another's voice.
    offered = iter([moto.port])
    monkeypatch.setattr(moto_server, "free_port", lambda: next(offered, None) or free_port())
    second = MotoServer().start()
    try:
        assert second.port != moto.port
        assert second._proc is not None and listens_on(second._proc.pid, second.port)
    finally:
        second.stop()


@pytest.mark.parametrize("variable", ["AWS_REGION", "AWS_DEFAULT_REGION"])
def test_doctor_and_run_find_the_region_in_either_aws_variable_alone(
        variable: str, db: str, moto_url: str, sqs: SqsReader, topic_prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    init_db(db)
    sqs.create(*QUEUES, "dlq.fifo")
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv(variable, moto_server.MOTO_ENV[variable])
    doctor = run_cli("doctor", "--dsn", db, "--brokers", moto_url, *sqs_args(topic_prefix))
    assert "PASS  broker: sqs" in doctor.stdout, doctor.stdout + doctor.stderr
    assert "no AWS region" not in doctor.stdout + doctor.stderr
    with start("run", db, moto_url, topic_prefix) as relay:
        expected = write_workload(db, transactions=2, seed=3, max_events=2)
        everything(sqs, expected.ids)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
