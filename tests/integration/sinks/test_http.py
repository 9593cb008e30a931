"""``--sink http`` end to end against a real HTTP server the tests run: both modes, batches,
kill -9, an outage (503 + Retry-After, a closed port, a stall), a refused event, the signature,
HTTPS with a CA file, doctor.

An HTTP receiver drops nothing by itself: a replay after a crash is a second request with
the same ``Idempotency-Key`` (docs/sinks.md), so the tests assert that every event
arrives and each aggregate's first arrivals are in commit order.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from cdc_relay.local.kafka_security import make_tls
from cdc_relay.outbox import emit
from tests.integration.sinks import scenarios
from tests.integration.sinks.http_support import Receiver, to_msgs
from tests.integration.wal_support import assert_contract, init_db, write_workload
from tests.support import Msg, init_outbox, run_cli


class HttpReceiver:
    def __init__(self, server: Receiver, prefix: str, *extra: str) -> None:
        self.server, self.prefix, self.extra = server, prefix, extra
        self.outage = "failing"

    def relay_args(self) -> tuple[str, ...]:
        return ("--sink", "http", "--brokers", self.server.url + "/hooks/{topic}",
                "--topic-pattern", f"{self.prefix}.{{aggregate_type}}",
                "--dead-letter-topic", f"{self.prefix}.dlq",
                "--sink-config", "read_timeout=1", *self.extra)

    def arrived(self) -> list[Msg]:
        return [m for m in to_msgs(self.server.delivered()) if not m.topic.endswith(".dlq")]

    def dead_letters(self) -> list[Msg]:
        return [m for m in to_msgs(self.server.delivered()) if m.topic.endswith(".dlq")]

    @contextmanager
    def down(self) -> Iterator[None]:
        if self.outage == "failing":
            self.server.failing = True
        elif self.outage == "stalled":
            self.server.stalled.clear()
        else:
            self.server.stop()
        try:
            yield
        finally:
            self.server.failing = False
            if self.outage == "closed":
                self.server.start()
            self.server.stalled.set()


@pytest.fixture
def server(tmp_path: object) -> Iterator[Receiver]:
    receiver = Receiver(secret=b"s3cret", refuse=("blocked",)).start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture
def secret_file(tmp_path: pytest.TempPathFactory) -> str:
    path = tmp_path / "secret"  # type: ignore[operator]
    path.write_text("s3cret\n")
    return str(path)


def emit_blocked(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        event_id = emit(conn, "blocked", "blocked-1", "BlockedChanged", {"n": 1})
        conn.commit()
    return str(event_id)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_both_modes_post_the_contract_signed_in_aggregate_order_and_dead_letter_a_422(
        mode: str, db: str, server: Receiver, secret_file: str, topic_prefix: str) -> None:
    receiver = HttpReceiver(server, topic_prefix, "--sink-config",
                            f"signing_secret_file={secret_file}")
    messages, letter = scenarios.deliver_both_modes(mode, db, receiver, topic_prefix, emit_blocked)
    assert b"answered 422 3 times" in letter.headers["error"]
    refused = [s for s in server.seen if "blocked" in s.path]
    assert {s.status for s in refused} == {422}
    # WAL mode: max_attempts requests, then the dead letter; polling mode counts each of
    # those rounds as one of its own attempts (--max-attempts) before it dead-letters.
    assert len(refused) == 3 if mode == "run" else len(refused) % 3 == 0
    assert len({s.headers["idempotency-key"] for s in refused}) == 1
    assert all(s.signature_ok for s in server.seen) and all(s.method == "POST" for s in server.seen)
    for m in messages:
        assert m.headers["idempotency-key"] == m.headers["id"]
        assert m.headers["content-type"] == b"application/json"


@pytest.mark.slow
def test_poll_mode_puts_batches_of_envelopes_one_event_per_aggregate_each(
        db: str, server: Receiver, topic_prefix: str) -> None:
    init_db(db)
    receiver = HttpReceiver(server, topic_prefix, "--sink-config", "batch_size=20",
                            "--sink-config", "method=PUT")
    with scenarios.start("poll", db, receiver) as relay:
        expected = write_workload(db, transactions=10, seed=4, max_events=20)
        messages = scenarios.everything(receiver, expected.ids)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(messages, expected, topic_prefix)
    requests = server.delivered()
    assert all(s.method == "PUT" and s.headers["idempotency-key"].startswith("sha256:")
               for s in requests)
    assert len(requests) < len(expected.events)  # some requests carried several events
    for s in requests:
        keys = [m.key for m in to_msgs([s])]
        assert len(keys) == len(set(keys))  # never two events of one aggregate in one request


@pytest.mark.slow
def test_kill_9_mid_stream_loses_nothing_and_keeps_each_aggregates_order(
        db: str, server: Receiver, topic_prefix: str) -> None:
    scenarios.kill_9_mid_stream(db, HttpReceiver(server, topic_prefix), topic_prefix)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "outage"), [("run", "failing"), ("poll", "failing"),
                                              ("run", "closed"), ("poll", "stalled")])
def test_an_outage_of_the_receiver_is_waited_out_in_order_and_nothing_is_dead_lettered(
        mode: str, outage: str, db: str, server: Receiver, topic_prefix: str) -> None:
    receiver = HttpReceiver(server, topic_prefix)
    receiver.outage = outage
    relay = scenarios.outage_waited_out(mode, db, receiver, topic_prefix,
                                        lambda err: "again" in err)
    if outage == "failing":
        assert "answered 503 (Retry-After 1 s)" in relay.stderr


def test_doctor_checks_the_receivers_origin_and_the_secret(
        db: str, server: Receiver, secret_file: str, topic_prefix: str) -> None:
    init_outbox(db, "--no-slot")
    base = ("doctor", "--dsn", db, "--mode", "poll", "--sink", "http")
    fine = run_cli(*base, "--brokers", server.url + "/hooks/{aggregate_type}", "--sink-config",
                   f"signing_secret_file={secret_file}")
    assert "PASS  broker: http" in fine.stdout and fine.returncode == 0, fine.stdout
    assert "PASS  broker: signing secret" in fine.stdout
    server.stop()
    down = run_cli(*base, "--brokers", server.url + "/hooks/{aggregate_type}")
    assert "FAIL  broker: http" in down.stdout and down.returncode == 1, down.stdout


@pytest.mark.slow
def test_https_with_the_receivers_ca_delivers_and_without_it_doctor_names_the_fix(
        db: str, tmp_path: Path, topic_prefix: str) -> None:
    tls = make_tls(tmp_path / "tls")
    server = Receiver(tls=tls).start()
    try:
        receiver = HttpReceiver(server, topic_prefix, "--sink-config", f"tls_ca_file={tls.ca}")
        init_db(db)
        with scenarios.start("poll", db, receiver) as relay:
            expected = write_workload(db, transactions=3, seed=2, max_events=5)
            messages = scenarios.everything(receiver, expected.ids)
            assert relay.stop(signal.SIGTERM) == 0, relay.stderr
        assert_contract(messages, expected, topic_prefix)
        untrusted = run_cli("doctor", "--dsn", db, "--mode", "poll", "--sink", "http",
                            "--brokers", server.url + "/hooks/{topic}")
        assert "FAIL  broker: http" in untrusted.stdout, untrusted.stdout
        assert "tls_ca_file" in untrusted.stdout
    finally:
        server.stop()


def test_bad_templates_and_a_missing_secret_variable_are_refused_at_start_up() -> None:
    dsn = "postgresql://nobody@127.0.0.1:1/none"
    unknown = run_cli("poll", "--dsn", dsn, "--sink", "http", "--brokers", "http://h/{nope}")
    assert unknown.returncode == 2 and "unknown placeholder {nope}" in unknown.stderr
    unset = run_cli("poll", "--dsn", dsn, "--sink", "http", "--brokers", "http://h/x",
                    "--sink-config", "signing_secret_env=CDC_RELAY_TEST_NO_SUCH_VARIABLE")
    assert unset.returncode == 2 and "the variable is not set" in unset.stderr, unset.stderr
    assert "Traceback" not in unknown.stderr + unset.stderr


