"""The test shape every batching sink shares (Redis, HTTP, Kinesis), against a real receiver.

A ``Receiver`` is the test's view of one receiver (a redis-server, an HTTP server the test
runs, moto's Kinesis): the relay options that point at it, what arrived, its dead letters,
and an outage it can cause. The scenarios are those of the SQS tests: both modes end to
end with the message contract and per-aggregate order of first arrivals, a refused event
becoming a dead letter, ``kill -9`` mid-stream, and an outage of the receiver waited out.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from tests.integration.wal_support import Expected, assert_contract, init_db, write_workload
from tests.support import CliProcess, Msg, wait_for


class Receiver(Protocol):
    def relay_args(self) -> tuple[str, ...]:
        """``--sink``, ``--brokers``, ``--topic-pattern`` ``{prefix}.{aggregate_type}``, ..."""

    def arrived(self) -> list[Msg]:
        """Every event message that arrived so far (topics ``{prefix}.{aggregate_type}``)."""

    def dead_letters(self) -> list[Msg]:
        """Every dead letter that arrived so far."""

    def down(self) -> AbstractContextManager[None]:
        """The receiver does not answer inside (stopped, paused or failing); back after."""


def ids_of(messages: list[Msg]) -> set[str]:
    return {m.headers["id"].decode() for m in messages}


def start(mode: str, dsn: str, receiver: Receiver, *extra: str) -> CliProcess:
    """``cdc-relay run`` or ``poll`` to the receiver; ``run`` returns once it is streaming."""
    common = ["--dsn", dsn, "--message-timeout", "10s", *receiver.relay_args(), *extra]
    if mode == "run":
        relay = CliProcess(["run", *common, "--status-interval", "200ms"])
        wait_for(lambda: "streaming from slot" in relay.stderr or not relay.running(),
                 timeout=60, message="the relay streaming")
    else:
        relay = CliProcess(["poll", *common, "--interval", "200ms"])
    assert relay.running(), relay.stderr
    return relay


def everything(receiver: Receiver, ids: set[str], timeout: float = 90.0) -> list[Msg]:
    got: list[Msg] = []

    def read() -> bool:
        got[:] = receiver.arrived()
        return ids_of(got) >= ids

    wait_for(read, timeout=timeout, interval=0.1, message="every committed event")
    return got


def dead_letter_of(receiver: Receiver, event_id: str) -> Msg:
    found = wait_for(lambda: [m for m in receiver.dead_letters()
                              if m.headers["id"].decode() == event_id],
                     timeout=90, interval=0.1, message=f"the dead letter of {event_id}")
    return found[0]


def deliver_both_modes(mode: str, db: str, receiver: Receiver, prefix: str,
                       refused: Callable[[str], str], *extra: str) -> tuple[list[Msg], Msg]:
    """The contract in ``mode``, and ``refused(db)``'s event (its id returned) dead-lettered."""
    init_db(db)
    with start(mode, db, receiver, *extra) as relay:
        expected = write_workload(db, transactions=15, seed=31, max_events=10)
        refused_id = refused(db)
        messages = everything(receiver, expected.ids)
        letter = dead_letter_of(receiver, refused_id)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(messages, expected, prefix)
    assert refused_id not in ids_of(messages)
    assert "error" in letter.headers
    return messages, letter


def kill_9_mid_stream(db: str, receiver: Receiver, prefix: str, *extra: str) -> None:
    """SIGKILL while committed events are still on their way: the relay is frozen, and killed
    only if some committed event has not arrived yet (else thawed, and more is written)."""
    init_db(db)
    expected = Expected()
    relay = start("run", db, receiver, *extra)
    seeds = iter(range(100, 200))

    def kill_mid_stream() -> set[str] | None:
        write_workload(db, transactions=10, seed=next(seeds), expected=expected, max_events=8)
        os.kill(relay.proc.pid, signal.SIGSTOP)
        arrived = ids_of(receiver.arrived())
        if arrived and not expected.ids <= arrived:
            relay.kill()
            return arrived
        os.kill(relay.proc.pid, signal.SIGCONT)
        return None

    with relay:
        arrived_at_kill = wait_for(kill_mid_stream, timeout=120, interval=0.1,
                                   message="a moment with events on their way")
    write_workload(db, transactions=5, seed=300, expected=expected, max_events=8)  # while down
    with start("run", db, receiver, *extra) as again:
        messages = everything(receiver, expected.ids)
        assert again.stop(signal.SIGTERM) == 0, again.stderr
    assert arrived_at_kill is not None
    assert expected.ids - arrived_at_kill  # some events were still on their way at the kill
    assert_contract(messages, expected, prefix)


def outage_waited_out(mode: str, db: str, receiver: Receiver, prefix: str,
                      trouble: Callable[[str], bool], *extra: str) -> CliProcess:
    """Events written while the receiver is down arrive once it is back, in order, none
    dead-lettered; ``trouble(stderr)`` says the relay noticed the outage."""
    init_db(db)
    with start(mode, db, receiver, *extra) as relay:
        expected = write_workload(db, transactions=5, seed=7, max_events=6)
        everything(receiver, expected.ids)
        with receiver.down():
            write_workload(db, transactions=10, seed=8, expected=expected, max_events=6)
            wait_for(lambda: trouble(relay.stderr), timeout=60,
                     message="the relay noticing the outage")
            assert relay.running(), relay.stderr
        messages = everything(receiver, expected.ids)
        assert relay.stop(signal.SIGTERM) == 0, relay.stderr
    assert_contract(messages, expected, prefix)
    assert receiver.dead_letters() == []
    return relay
