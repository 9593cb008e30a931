"""Fixtures of the sink tests other than Kafka's: the services, names of the test's own.

RabbitMQ, NATS and Redis are throwaway servers of the session's own (of each xdist worker), on free
ports, stopped after it (cdc_relay.local.message_brokers); every test still uses names from
its ``topic_prefix`` and deletes them. SQS is moto's server, started and stopped the same
way. One that cannot be started skips its tests on a developer's machine, and fails them in
CI (``CI=true``), where it must exist.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.message_brokers import NatsServer, RabbitMqServer, RedisServer
from cdc_relay.local.moto_server import MOTO_ENV, MotoServer
from tests.integration.sinks.redis_support import RedisReader
from tests.integration.sinks.sqs_support import SqsReader
from tests.integration.sinks.support import RabbitReader, delete_stream
from tests.support import skip_or_fail_in_ci


def _serving(server: RabbitMqServer | NatsServer | RedisServer
             ) -> Iterator[RabbitMqServer | NatsServer | RedisServer]:
    """``server`` started for the session and stopped after it; skipped (failed in CI) if it
    cannot start."""
    try:
        server.start()
    except LocalServiceError as exc:
        skip_or_fail_in_ci(f"{server.name} could not be started: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitMqServer | NatsServer]:
    yield from _serving(RabbitMqServer())


@pytest.fixture(scope="session")
def nats_server() -> Iterator[RabbitMqServer | NatsServer]:
    yield from _serving(NatsServer())


@pytest.fixture(scope="session")
def rabbitmq_url(rabbitmq_server: RabbitMqServer) -> str:
    return rabbitmq_server.url


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def rabbitmq_port(rabbitmq_server: RabbitMqServer) -> int:
    return rabbitmq_server.port


@pytest.fixture(scope="session")
def nats_port(nats_server: NatsServer) -> int:
    return nats_server.port


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


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RabbitMqServer | NatsServer | RedisServer]:
    yield from _serving(RedisServer())


@pytest.fixture
def redis_reader(redis_server: RedisServer, topic_prefix: str) -> Iterator[RedisReader]:
    """A reader of this test's own streams; they are deleted afterwards."""
    reader = RedisReader(redis_server.url, topic_prefix)
    try:
        yield reader
    finally:
        reader.close()
