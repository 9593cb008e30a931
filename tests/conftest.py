"""Fixtures: a session PostgreSQL cluster and broker, a database and topic prefix per test.

The services start only when a test asks for them (so ``pytest tests/unit`` starts
nothing) and are torn down even when tests fail. Tests share them safely by using their
own database (``db``) and their own topic prefix (``topic_prefix``). A test that kills,
pauses or restarts a service takes a private one (``private_pg_cluster``,
``private_broker``) so the others never see it.

``broker`` is Apache Kafka 4.1 (cdc_relay.local.apache_kafka), the broker of record for
everything about Kafka's semantics; ``kafka_3_9`` is the 3.9 line for the compatibility
subset. ``tansu`` (memory-only, no JVM) is for tests of the relay's own side that want
its quirks on purpose, such as a restart that forgets every producer id.

Everything under tests/integration/ is marked ``integration`` here, and the long tests
are put first. Shared helpers (KafkaCollector, run_cli, CliProcess, wait_for) are in
tests/support.py: import them as ``from tests.support import ...`` (pyproject puts the
repo root on pytest's path).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings

from cdc_relay import accel
from cdc_relay.local.apache_kafka import KAFKA_3_9, ApacheKafka
from cdc_relay.local.apicurio import ApicurioRegistry
from cdc_relay.local.broker import Broker
from cdc_relay.local.nginx import RegistryProxy
from cdc_relay.local.postgres import PostgresCluster
from tests.databases import Databases

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
    # The long tests start first, so that none of them is still running alone at the end of
    # a step while the other xdist workers are idle (docs/development.md, "The test run"):
    # the slow ones, then tests/unit (whose longest are CPU-bound property runs), then the
    # integration tests, which mostly wait on processes and are seconds each. The benchmark
    # tests' xdist_group goes first anyway (--dist loadgroup hands out the largest group first).
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("integration") is not None))


S = TypeVar("S", PostgresCluster, Broker, ApacheKafka, ApicurioRegistry)


def _running(service: S) -> Iterator[S]:
    """Start ``service``, yield it, and clean it up even when the test failed."""
    try:
        service.start()
        yield service
    finally:
        service.cleanup()


# The ``compiled`` fixture's choice holds for a whole test, every hypothesis example of it
# included: that it is not reset between examples is the point.
settings.register_profile("cdc-relay", suppress_health_check=[HealthCheck.function_scoped_fixture])
# make sanitize (scripts/sanitize.sh): fewer examples under ASan, the same ones every run
settings.register_profile("sanitize", parent=settings.get_profile("cdc-relay"),
                          max_examples=20, derandomize=True)
settings.load_profile("cdc-relay")


@pytest.fixture(params=["compiled", "pure"])
def compiled(request: pytest.FixtureRequest) -> Iterator[bool]:
    """The path a test runs (docs/design.md, "The compiled paths"), True for the compiled
    one: everything the test builds takes it (the process's choice, cdc_relay/accel.py).
    The compiled run skips when the extensions are not built (tests/unit's compiled
    tests then fail)."""
    on = request.param == "compiled"
    if on and not accel.all_built():
        pytest.skip("the compiled extensions are not built")
    with accel.forced(not on):
        yield on


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster for the whole session (wal_level=logical, trust auth)."""
    yield from _running(PostgresCluster())


@pytest.fixture(scope="session")
def broker() -> Iterator[ApacheKafka]:
    """Apache Kafka 4.1 (single-node KRaft) for the whole session."""
    yield from _running(ApacheKafka())


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[ApicurioRegistry]:
    """Apicurio Registry (in-memory storage) for the whole session: its Confluent-compatible
    API at ``.ccompat_url`` (cdc_relay.local.apicurio)."""
    yield from _running(ApicurioRegistry())


@pytest.fixture
def private_schema_registry() -> Iterator[ApicurioRegistry]:
    """An Apicurio Registry of this test's own, to stop and start mid-stream."""
    yield from _running(ApicurioRegistry())


@pytest.fixture
def registry_proxy(schema_registry: ApicurioRegistry) -> Iterator[RegistryProxy]:
    """nginx in front of the session's Apicurio: HTTPS with a CA of its own, basic auth at
    ``.basic_url``, a bearer token at ``.bearer_url`` (cdc_relay.local.nginx)."""
    with RegistryProxy(schema_registry.url) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def kafka_3_9() -> Iterator[ApacheKafka]:
    """Apache Kafka 3.9 for the whole session: the compatibility subset."""
    yield from _running(ApacheKafka(KAFKA_3_9))


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    """A memory-only Tansu broker for the whole session."""
    yield from _running(Broker())


@pytest.fixture(scope="session")
def databases(pg_cluster: PostgresCluster) -> Iterator[Databases]:
    """Creates and drops ``pg_cluster``'s test databases over one connection (no psql)."""
    made = Databases(pg_cluster)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def db(databases: Databases) -> Iterator[str]:
    """DSN of a fresh database; dropped afterwards with its slots and walsenders."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    dsn = databases.create(name)
    try:
        yield dsn
    finally:
        databases.drop(name)


@pytest.fixture
def topic_prefix() -> str:
    """A prefix no other test uses, for ``--topic-pattern '{prefix}.{aggregate_type}'``."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def private_pg_cluster() -> Iterator[PostgresCluster]:
    """A cluster of this test's own, for fault injection (kill, pause, restart)."""
    yield from _running(PostgresCluster())


@pytest.fixture
def private_broker() -> Iterator[ApacheKafka]:
    """An Apache Kafka broker of this test's own, for fault injection (kill, pause, restart)."""
    yield from _running(ApacheKafka())


@pytest.fixture
def private_tansu() -> Iterator[Broker]:
    """A Tansu broker of this test's own: its restart forgets every topic and producer id."""
    yield from _running(Broker())


@pytest.fixture(scope="session")
def noida(broker: ApacheKafka) -> ApacheKafka:
    """The session's Apache Kafka, for the tests written on noida-db."""
    return broker


@pytest.fixture
def private_noida(private_broker: ApacheKafka) -> ApacheKafka:
    return private_broker
