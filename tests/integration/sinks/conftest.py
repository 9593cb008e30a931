"""Fixtures of the RabbitMQ and NATS sink tests: the machine's services, names of the test's own.

The services are shared by everyone on the machine: they are started if down (never
stopped), and every test uses names from its ``topic_prefix`` and deletes them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.machine_services import ensure_nats, ensure_rabbitmq
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
