"""``run --exactly-once`` on noida-db: every committed event once, atomic per PG transaction."""

from __future__ import annotations

import pytest

from cdc_relay.local.noida import NoidaBroker
from tests.integration.eos_support import (
    READ_COMMITTED,
    assert_exactly_once,
    checkpoints,
    collect_exactly,
    start_eos_relay,
)
from tests.integration.wal_support import confirmed_flush, init_db, write_workload
from tests.support import KafkaCollector, wait_for


@pytest.mark.parametrize("plugin", ["wal2json", "pgoutput"])
def test_committed_events_arrive_once_with_a_checkpoint_and_the_slot_follows(
        db: str, noida: NoidaBroker, topic_prefix: str, plugin: str) -> None:
    init_db(db, plugin=plugin)
    with start_eos_relay(db, noida.bootstrap, topic_prefix, plugin=plugin) as relay:
        expected = write_workload(db, transactions=30, seed=1)
        with KafkaCollector(noida.bootstrap, topic_prefix, config=READ_COMMITTED) as collector:
            messages = collect_exactly(collector, expected)
        assert_exactly_once(messages, expected)
        last_commit = max(expected.commit_lsn.values())
        wait_for(lambda: confirmed_flush(db) >= last_commit, timeout=20,
                 message="the slot confirmed past the last commit")
        assert relay.stop() == 0, relay.stderr
    assert checkpoints(messages), "no checkpoint record in the checkpoint topic"
    assert max(cp.lsn for cp in checkpoints(messages)) <= confirmed_flush(db)
