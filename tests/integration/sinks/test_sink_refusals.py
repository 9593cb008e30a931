"""Sink failures say one thing once: a refused login exits 6 with one line; an unreachable
broker is retried with backoff, a few lines a minute (the machine's real RabbitMQ)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from cdc_relay.errors import ExitCode
from cdc_relay.local.helpers import free_port
from tests.integration.wal_support import init_db
from tests.support import CliProcess, init_outbox, run_cli, skip_or_fail_in_ci, wait_for

# A window over which the log is counted: an upper bound only, far above what is
# expected (a handful of lines), far below the flood it guards against (~40k lines).
WINDOW = 10.0
MAX_LINES = 60


@pytest.fixture
def nats_with_a_password() -> Iterator[str]:
    """A nats-server of this test's own that wants user relay, password right: its port."""
    binary = shutil.which("nats-server")
    if binary is None:
        skip_or_fail_in_ci("nats-server is not installed")
    port, store = free_port(), tempfile.mkdtemp(prefix="cdc-relay-nats-")
    server = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", str(port), "--user", "relay",
                               "--pass", "right", "-js", "-sd", store],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _accepts(port), timeout=20, message="nats-server listening")
        yield f"nats://relay:wrong@127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(store, ignore_errors=True)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("mode", ["run", "poll"])
def test_a_refused_nats_login_exits_6_with_one_line(
        db: str, nats_with_a_password: str, topic_prefix: str, mode: str) -> None:
    _init(db, mode)
    result = run_cli(mode, "--dsn", db, "--brokers", nats_with_a_password, "--sink", "nats",
                     "--sink-config", f"stream={topic_prefix.upper()}",
                     "--topic-pattern", topic_prefix + ".{aggregate_type}", timeout=60)
    assert result.returncode == ExitCode.REFUSED, result.stderr
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line or "error:" in line]
    assert len(errors) == 1, result.stderr
    assert "Authorization Violation" in errors[0] and "wrong" not in result.stderr


def _wrong_password(url: str) -> str:
    return url.replace("guest:guest@", "guest:not-the-password@")


def _init(db: str, mode: str) -> None:
    if mode == "run":
        init_db(db, plugin="pgoutput")
    else:
        init_outbox(db, "--mode", "poll")


def _relay_args(db: str, brokers: str, prefix: str) -> list[str]:
    return ["--dsn", db, "--brokers", brokers, "--sink", "rabbitmq",
            "--sink-config", f"exchange={prefix}", "--topic-pattern", prefix + ".{aggregate_type}"]


@pytest.mark.parametrize("mode", ["run", "poll"])
def test_a_refused_rabbitmq_login_exits_6_with_one_line(
        db: str, rabbitmq_url: str, topic_prefix: str, mode: str) -> None:
    _init(db, mode)
    result = run_cli(mode, *_relay_args(db, _wrong_password(rabbitmq_url), topic_prefix),
                     "--log-format", "json", timeout=60)
    assert result.returncode == ExitCode.REFUSED, result.stderr
    assert "not-the-password" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if '"level":"error"' in line]
    assert len(errors) == 1, result.stderr  # the exit line says it all
    assert "login refused" in errors[-1] and '"exit_code":6' in errors[-1]
    assert all(line.startswith("{") for line in result.stderr.splitlines())  # JSON only


def _unreachable(sink: str, prefix: str) -> list[str]:
    port = free_port()
    if sink == "rabbitmq":
        return ["--sink", "rabbitmq", "--brokers", f"amqp://guest:guest@127.0.0.1:{port}/%2F",
                "--sink-config", f"exchange={prefix}"]
    if sink == "nats":
        return ["--sink", "nats", "--brokers", f"nats://127.0.0.1:{port}",
                "--sink-config", f"stream={prefix.upper()}"]
    return ["--brokers", f"127.0.0.1:{port}"]


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["rabbitmq", "nats", "kafka"])
@pytest.mark.parametrize("mode", ["run", "poll"])
def test_an_unreachable_broker_is_retried_with_backoff_not_flooded(
        db: str, topic_prefix: str, mode: str, sink: str) -> None:
    _init(db, mode)
    args = [mode, "--dsn", db, *_unreachable(sink, topic_prefix),
            "--topic-pattern", topic_prefix + ".{aggregate_type}"]
    with CliProcess(args) as relay:
        wait_for(lambda: "WARNING" in relay.stderr or "ERROR" in relay.stderr
                 or not relay.running(), timeout=60, message="the first failed attempt")
        time.sleep(WINDOW)  # the fixed window the lines are counted over
        assert relay.running(), relay.stderr  # retried, not given up
        lines = relay.stderr.count("\n")
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert lines <= MAX_LINES, relay.stderr[-3000:]
    assert "pika" not in relay.stderr and "nats.aio" not in relay.stderr
