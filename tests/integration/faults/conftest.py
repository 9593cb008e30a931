"""Fixtures of the fault-injection tests (the session's services are tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc_relay.local.postgres import PostgresCluster


@pytest.fixture
def short_timeout_cluster() -> Iterator[PostgresCluster]:
    """A private cluster whose walsender gives up on a silent client after 5 s."""
    cluster = PostgresCluster(settings={"wal_sender_timeout": "5s"})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()
