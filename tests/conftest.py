"""Fixtures: a session PostgreSQL cluster and broker, a database and topic prefix per test.

The services start only when a test asks for them (so ``pytest tests/unit`` starts
nothing) and are torn down even when tests fail. Tests share them safely by using their
own database (``db``) and their own topic prefix (``topic_prefix``). A test that kills,
pauses or restarts a service takes a private one (``private_pg_cluster``,
``private_broker``, ``private_noida``) so the others never see it. The exactly-once
tests use ``noida`` (noida-db: real transaction semantics) instead of ``broker``.

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
from cdc_relay.local.broker import Broker
from cdc_relay.local.noida import NoidaBroker
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


S = TypeVar("S", PostgresCluster, Broker, NoidaBroker)


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
def broker() -> Iterator[Broker]:
    """A memory-only Kafka-protocol broker for the whole session."""
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
def private_broker() -> Iterator[Broker]:
    """A broker of this test's own, for fault injection (kill, pause, restart)."""
    yield from _running(Broker())


@pytest.fixture(scope="session")
def noida() -> Iterator[NoidaBroker]:
    """A noida-db Kafka broker for the session: hides aborted transactions, fences zombies."""
    yield from _running(NoidaBroker())


@pytest.fixture
def private_noida() -> Iterator[NoidaBroker]:
    """A noida-db broker of this test's own, for restarts and pauses."""
    yield from _running(NoidaBroker())
