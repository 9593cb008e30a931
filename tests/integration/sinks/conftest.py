"""Fixtures of the RabbitMQ, NATS and SQS sink tests: the services, names of the test's own.

The machine's RabbitMQ and NATS are shared by everyone on the machine: they are started if
down (never stopped), and every test uses names from its ``topic_prefix`` and deletes them.
One xdist worker at a time starts them (a file lock). One that cannot be started skips its
tests on a developer's machine, and fails them in CI (``CI=true``), where it must exist.
SQS is moto's server, started for the session (of each xdist worker) and stopped after it
(skipped, failed in CI, the same way when it cannot start).
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.machine_services import ensure_nats, ensure_rabbitmq
from cdc_relay.local.moto_sqs import MOTO_ENV, MotoServer
from tests.integration.sinks.sqs_support import SqsReader
from tests.integration.sinks.support import RabbitReader, delete_stream
from tests.support import skip_or_fail_in_ci


def _machine_service(name: str, ensure: Callable[[], str]) -> str:
    """``ensure()``'s URL, started by one worker at a time; skip (fail in CI) if it cannot be."""
    lock = Path(tempfile.gettempdir()) / "cdc-relay-machine-services.lock"
    try:
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            return ensure()
    except LocalServiceError as exc:
        skip_or_fail_in_ci(f"{name} could not be started: {exc}")


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    return _machine_service("RabbitMQ", ensure_rabbitmq)


@pytest.fixture(scope="session")
def nats_url() -> str:
    return _machine_service("NATS", ensure_nats)


@pytest.fixture
def rabbit(rabbitmq_url: str, topic_prefix: str) -> Iterator[RabbitReader]:
    reader = RabbitReader(rabbitmq_url, topic_prefix)
    try:
        yield reader
    finally:
        reader.close()


@pytest.fixture
def nats_stream(nats_url: str, topic_prefix: str) -> Iterator[str]:
    """A stream name of this test's own; deleted afterwards."""
    name = topic_prefix.upper()
    try:
        yield name
    finally:
        delete_stream(nats_url, name)


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    """moto's SQS server for this session (``moto_server`` as a subprocess), and the AWS
    settings boto3 needs to talk to it in this process and the relays it starts."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in MOTO_ENV.items():
            patch.setenv(key, value)
        try:
            server = MotoServer().start()
        except LocalServiceError as exc:
            skip_or_fail_in_ci(f"moto_server could not be started: {exc}")
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def moto_url(moto: MotoServer) -> str:
    return moto.url


@pytest.fixture
def sqs(moto_url: str, topic_prefix: str) -> Iterator[SqsReader]:
    """A reader of this test's own queues on moto; the queues are deleted afterwards."""
    reader = SqsReader(moto_url, topic_prefix)
    try:
        yield reader
    finally:
        reader.close()
