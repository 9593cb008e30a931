"""What exactly-once mode needs from a transactional sink, without broker types.

The relay's exactly-once strategy (wal/exactly_once/mode.py) drives a sink that groups
messages into transactions and writes a checkpoint record into each. Errors of the
transaction calls are classified so the strategy can act without knowing the broker
(docs/design.md, exactly-once delivery):

* ``RETRIABLE`` - call it again;
* ``ABORTABLE`` - abort the transaction, replay its events from the checkpoint;
* ``FATAL``     - the producer is unusable: a new one and the start-up sequence;
* ``FENCED``    - another relay took over this source: stop and stand by.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cdc_relay.sink.base import Sink


class TxnErrorKind(enum.Enum):
    """How a failed transaction call must be handled."""

    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    FENCED = "fenced"


class TxnError(Exception):
    """A transaction call failed; ``kind`` says what to do about it."""

    def __init__(self, kind: TxnErrorKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


Record = tuple[int, bytes | None, bytes | None]  # offset, key, value of a checkpoint record


@dataclass(frozen=True, slots=True)
class CheckpointViews:
    """The checkpoint topic read twice: as ``read_committed`` consumers see it (up to the
    last stable offset) and as the log holds it (``read_uncommitted``, up to its end)."""

    committed: Sequence[Record]
    logged: Sequence[Record]
    stable_offset: int  # the partition's last stable offset when ``committed`` was read

    def committed_records(self) -> list[tuple[bytes | None, bytes | None]]:
        """``(key, value)`` of the committed view, in offset order (what ``choose`` takes)."""
        return [(key, value) for _, key, value in self.committed]


class TransactionalSink(Sink, Protocol):
    """A Sink whose messages are grouped into transactions, each with a checkpoint record."""

    @property
    def initialized(self) -> bool:
        """True once ``init_transactions`` succeeded on this producer."""

    @property
    def in_transaction(self) -> bool:
        """True between ``begin_transaction`` and its commit or abort."""

    @property
    def doubt(self) -> str | None:
        """Why the open transaction must not be committed (e.g. a broker connection lost)."""

    def init_transactions(self, timeout: float) -> None:
        """Register the transactional id, fencing every older producer with it."""

    def read_checkpoint_views(self, timeout: float) -> CheckpointViews:
        """The checkpoint topic's records, committed (up to the last stable offset) and all."""

    def begin_transaction(self) -> None:
        """Start a transaction; every message produced until commit/abort belongs to it."""

    def commit_transaction(self, key: bytes, checkpoint: bytes, timeout: float) -> None:
        """Write the checkpoint record into the open transaction and commit it."""

    def abort_transaction(self, timeout: float) -> None:
        """Abort the open transaction; its messages are dropped without being reported."""
