"""Helpers shared by the tests: read topics back from the broker, run the CLI, wait.

KafkaCollector reads with ``assign()`` (no consumer group: the local broker's group join
is slow) and counts messages instead of trusting high watermarks (the local broker
reports them wrong after a batch, docs/design.md, test services). Nothing here starts a service; the fixtures
in conftest.py do.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, Self, TypeVar

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


def skip_or_fail_in_ci(reason: str) -> NoReturn:
    """A service or tool a test needs is missing: skip on a developer's machine, fail in CI
    (``CI=true``), where everything the tests use must be installed and running."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05,
             message: str = "condition") -> T:
    """Call ``predicate`` until it returns something truthy; return that, or raise."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{message} not met within {timeout} s")
        time.sleep(interval)


@dataclass(frozen=True)
class Msg:
    """One consumed record, reduced to plain values."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp: int


class KafkaCollector:
    """Reads every partition of every topic whose name starts with ``prefix``.

    New topics (and partitions) are discovered every ``rediscover_every`` seconds while
    collecting. ``messages`` holds everything read so far, in arrival order.
    """

    def __init__(self, bootstrap: str, prefix: str, *, rediscover_every: float = 0.5,
                 config: dict[str, Any] | None = None) -> None:
        self.prefix = prefix
        self.messages: list[Msg] = []
        self._rediscover_every = rediscover_every
        self._assigned: set[tuple[str, int]] = set()
        self._next_discovery = 0.0
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": f"collector-{prefix}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 20,
            "topic.metadata.refresh.interval.ms": 1000,
            **(config or {}),
        })

    def discover(self) -> None:
        """Assign, from the beginning, partitions of matching topics not assigned yet."""
        metadata = self._consumer.list_topics(timeout=5)
        new = [TopicPartition(name, partition, OFFSET_BEGINNING)
               for name, topic in metadata.topics.items()
               if name.startswith(self.prefix) and topic.error is None
               for partition in topic.partitions
               if (name, partition) not in self._assigned]
        if new:
            self._consumer.incremental_assign(new)
            self._assigned.update((tp.topic, tp.partition) for tp in new)

    @property
    def topics(self) -> set[str]:
        """Topics assigned so far."""
        return {topic for topic, _ in self._assigned}

    def collect(self, *, count: int | None = None,
                until: Callable[[list[Msg]], bool] | None = None,
                timeout: float = 30.0) -> list[Msg]:
        """Read until ``count`` messages in all, or ``until(messages)``; return them all.

        With neither, read for ``timeout`` seconds and return what arrived. Raises
        TimeoutError when a given condition is not met in time.
        """
        def done() -> bool:
            if count is not None:
                return len(self.messages) >= count
            return until is not None and until(self.messages)

        deadline = time.monotonic() + timeout
        while not done():
            now = time.monotonic()
            if now > deadline:
                if count is None and until is None:
                    break
                raise TimeoutError(
                    f"collected {len(self.messages)} messages from {sorted(self.topics)} in "
                    f"{timeout} s" + (f", wanted {count}" if count is not None else ""))
            if now >= self._next_discovery:
                self.discover()
                self._next_discovery = now + self._rediscover_every
            self._poll(min(0.2, max(0.0, deadline - now)))
        return list(self.messages)

    def _poll(self, timeout: float) -> None:
        for record in self._consumer.consume(num_messages=1000, timeout=timeout):
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consumer error: {error}")
            self.messages.append(Msg(
                topic=record.topic(), partition=record.partition(), offset=record.offset(),
                key=record.key(), value=record.value(),
                headers={k: (v or b"") for k, v in (record.headers() or [])},
                timestamp=record.timestamp()[1]))

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# ---------------------------------------------------------------- the CLI

def cli_command(*args: str) -> list[str]:
    """The argv that runs ``cdc-relay`` with this interpreter."""
    return [sys.executable, "-m", "cdc_relay", *args]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cdc-relay args…`` to completion; stdout/stderr captured as text."""
    return subprocess.run(cli_command(*args), capture_output=True, text=True, input=input,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def run_cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``cdc-relay args…`` run in this process, as ``run_cli`` reports it, without
    starting an interpreter: for set-up steps (``init`` before a relay starts). The
    tests OF a command run it as a process (``run_cli``), as a user does."""
    from cdc_relay.cli.main import cli
    from cdc_relay.cli.options import run_cli as run_group

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_group(cli, list(args))
    return subprocess.CompletedProcess(cli_command(*args), code, out.getvalue(), err.getvalue())


def init_outbox(dsn: str, *args: str) -> None:
    """A test's set-up: ``cdc-relay init --dsn dsn args…`` in-process; it must succeed."""
    result = run_cli_in_process("init", "--dsn", dsn, *args)
    assert result.returncode == 0, result.stderr


class CliProcess:
    """A long-running ``cdc-relay`` (run, poll…) with its output in temp files.

    Files rather than pipes, so a chatty process never blocks on a full pipe.
    """

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None,
                 prefix: Sequence[str] = ()) -> None:
        """``prefix`` runs it through another command (e.g. ``ip netns exec NS``)."""
        self._dir = Path(tempfile.mkdtemp(prefix="cdc-relay-cli-"))
        self.stdout_path = self._dir / "stdout"
        self.stderr_path = self._dir / "stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([*prefix, *cli_command(*args)], stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL,
                                         env={**os.environ, **(env or {})})

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig`` and wait for the exit code (SIGKILL after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL, as a crash would."""
        return self.stop(signal.SIGKILL)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()


def http_get(port: int, path: str) -> tuple[int, str]:
    """GET a relay's metrics endpoint: (status, body); (0, "") while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""  # not listening yet


def scrape(port: int) -> dict[str, float]:
    """A relay's metrics as ``{"name{label=value,...}": value}``; empty while unreachable."""
    code, text = http_get(port, "/metrics")
    if code != 200:
        return {}
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
