"""Shared pieces of the exactly-once integration tests (on noida-db): relays, reading back."""

from __future__ import annotations

from collections import Counter

from cdc_relay.wal.exactly_once.checkpoint import Checkpoint
from tests.integration.wal_support import Expected, start_relay
from tests.support import CliProcess, KafkaCollector, Msg

READ_COMMITTED = {"isolation.level": "read_committed"}


def start_eos_relay(dsn: str, bootstrap: str, prefix: str, *, plugin: str = "wal2json",
                    extra: tuple[str, ...] = (), wait: bool = True) -> CliProcess:
    """``cdc-relay run --exactly-once`` with a checkpoint topic of the test's own."""
    return start_relay(dsn, bootstrap, prefix, plugin=plugin, wait=wait, extra=(
        "--exactly-once", "--checkpoint-topic", f"{prefix}.checkpoints", "--txn-interval", "50ms",
        *extra))


def event_ids(messages: list[Msg]) -> Counter[str]:
    """How often each event id arrived on the event topics (dead letters and checkpoints apart)."""
    return Counter(m.headers["id"].decode() for m in messages
                   if not m.topic.endswith((".dlq", ".checkpoints")))


def collect_exactly(collector: KafkaCollector, expected: Expected, timeout: float = 60.0) -> list[Msg]:
    """Read (read_committed) until every committed event arrived, then a little more."""
    ids = expected.ids

    def arrived(messages: list[Msg]) -> bool:
        return ids <= set(event_ids(messages))

    collector.collect(until=arrived, timeout=timeout)
    return collector.collect(timeout=1.0)  # late duplicates would show up here


def assert_exactly_once(messages: list[Msg], expected: Expected) -> None:
    """Every committed event once, no rolled-back one, nothing else."""
    counts = event_ids(messages)
    duplicates = {i: n for i, n in counts.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} events delivered more than once"
    assert not (set(counts) & expected.rolled_back), "a rolled-back event reached Kafka"
    assert set(counts) == expected.ids


def checkpoints(messages: list[Msg]) -> list[Checkpoint]:
    return [Checkpoint.decode(m.value) for m in messages
            if m.topic.endswith(".checkpoints") and m.value is not None]


def explain_missing(bootstrap: str, prefix: str, expected: Expected) -> str:
    """For a failure message: which committed events are not in the broker at all."""
    with KafkaCollector(bootstrap, prefix) as everything:  # read_uncommitted
        have = set(event_ids(everything.collect(timeout=3)))
    missing = sorted({(str(e["payload"]["seed"]), str(e["payload"]["txn"]))  # type: ignore[index]
                      for e in expected.events if str(e["id"]) not in have})
    return f"{len(missing)} committed transactions (seed, txn) absent even read_uncommitted: {missing[:20]}"
