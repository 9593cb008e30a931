"""Fixtures of the RabbitMQ, NATS and SQS sink tests: the services, names of the test's own.

The machine's RabbitMQ and NATS are shared by everyone on the machine: they are started if
down (never stopped), and every test uses names from its ``topic_prefix`` and deletes them.
SQS is moto's server, started for the session and stopped after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.machine_services import ensure_nats, ensure_rabbitmq
from cdc_relay.local.moto_sqs import MOTO_ENV, MotoServer
from tests.integration.sinks.sqs_support import SqsReader
from tests.integration.sinks.support import RabbitReader, delete_stream


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    try:
        return ensure_rabbitmq()
    except LocalServiceError as exc:
        pytest.skip(f"RabbitMQ could not be started: {exc}")


@pytest.fixture(scope="session")
def nats_url() -> str:
    try:
        return ensure_nats()
    except LocalServiceError as exc:
        pytest.skip(f"NATS could not be started: {exc}")


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
            pytest.skip(f"moto_server could not be started: {exc}")
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
