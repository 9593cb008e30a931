"""The exactly-once checkpoint: its record format, its key, and what it means on replay.

In exactly-once mode every Kafka transaction also writes one record to a compacted,
single-partition checkpoint topic (docs/design.md, exactly-once delivery). Its key names
the source - PostgreSQL system identifier and slot - and its value says how far the
committed Kafka data reaches:

* ``lsn``: the commit end LSN of the last PostgreSQL transaction the Kafka transaction
  completed; every transaction whose commit record starts before it is in Kafka;
* ``partial``: with ``--txn-split-events``, the transaction that was split - its commit
  record LSN and how many of its events (in WAL order) are already in Kafka.

On start the relay reads the records back (``choose``) and ``ReplayFilter`` tells the
loop, transaction by transaction, how many events to skip: all of a transaction at or
below the checkpoint, the first ``events`` of the split one, none of the others.

``committed_view_behind`` compares what ``read_committed`` consumers see of the topic with
what it holds (``CheckpointViews``: both readings and the last stable offset): a newer
checkpoint record of this source that they cannot see while the slot is confirmed past
it means events confirmed in PostgreSQL that no ``read_committed`` consumer will get.

Pure: values in, values out; no broker client, no database.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from cdc_relay.errors import CheckpointCorrupt, CheckpointMismatch, RelayError
from cdc_relay.model import Lsn
from cdc_relay.sink.transactions import CheckpointViews, Record

FORMAT_VERSION = 1
SKIP_ALL = sys.maxsize  # ReplayFilter.skip(): the whole transaction


def transactional_id(system_id: str, slot: str) -> str:
    """The producer's ``transactional.id``: one per source, so a successor fences the owner."""
    return f"cdc-relay.{system_id}.{slot}"


def checkpoint_key(system_id: str, slot: str) -> bytes:
    """The checkpoint record's key (compaction keeps the latest per source)."""
    return f"{system_id}/{slot}".encode()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """How far the committed Kafka data of one source reaches (see the module docstring)."""

    system_id: str
    slot: str
    lsn: Lsn
    partial_commit_lsn: Lsn | None = None
    partial_events: int = 0

    def encode(self) -> bytes:
        """The record value (JSON, so an operator can read it with any consumer)."""
        value: dict[str, object] = {"version": FORMAT_VERSION, "system_identifier": self.system_id,
                                    "slot": self.slot, "lsn": str(self.lsn)}
        if self.partial_commit_lsn is not None:
            value["partial"] = {"commit_lsn": str(self.partial_commit_lsn),
                                "events": self.partial_events}
        return orjson.dumps(value)

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        """Parse a record value; raise CheckpointCorrupt if it is not one of ours."""
        try:
            value = orjson.loads(data)
            partial = value.get("partial")
            return cls(
                system_id=str(value["system_identifier"]), slot=str(value["slot"]),
                lsn=Lsn.parse(value["lsn"]),
                partial_commit_lsn=None if partial is None else Lsn.parse(partial["commit_lsn"]),
                partial_events=0 if partial is None else int(partial["events"]))
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointCorrupt(f"unreadable checkpoint record {bytes(data[:80])!r}: {exc} "
                                    "(start once with --reset-checkpoint to write a new one)") from exc


def choose(records: Iterable[tuple[bytes | None, bytes | None]], *, system_id: str, slot: str,
           reset: bool = False) -> Checkpoint | None:
    """This source's latest checkpoint among committed ``(key, value)`` records, in offset order.

    None means "no checkpoint": start from the slot. A record of the same slot from
    another system identifier, with none of ours, means the slot now belongs to another
    cluster (restored from a file copy, or a new one): CheckpointMismatch unless ``reset``.
    A tombstone (value None) deletes the source's checkpoint.
    """
    ours = checkpoint_key(system_id, slot)
    latest: bytes | None = None
    foreign: set[str] = set()
    for key, value in records:
        if key == ours:
            latest = value
        elif key is not None and value is not None and key.endswith(b"/" + slot.encode()):
            foreign.add(key.decode(errors="replace").rsplit("/", 1)[0])
    if reset:
        return None
    if latest is None:
        if foreign:
            raise CheckpointMismatch(
                f"the checkpoint topic has a checkpoint for slot {slot!r} of another PostgreSQL "
                f"cluster (system identifier {', '.join(sorted(foreign))}, this one is {system_id}): "
                "skipping by it could lose or repeat events; if this cluster really replaced the "
                "other, start once with --reset-checkpoint")
        return None
    checkpoint = Checkpoint.decode(latest)
    if checkpoint.system_id != system_id or checkpoint.slot != slot:
        raise CheckpointCorrupt(f"checkpoint record under key {ours.decode()} names "
                                f"{checkpoint.system_id}/{checkpoint.slot}")
    return checkpoint


class ReplayFilter:
    """Per transaction: how many of its events are already in Kafka (transaction-granular)."""

    __slots__ = ("_checkpoint",)

    def __init__(self, checkpoint: Checkpoint | None) -> None:
        self._checkpoint = checkpoint

    def skip(self, commit_lsn: Lsn | None) -> int:
        """Events to skip of the transaction whose commit record is at ``commit_lsn``.

        SKIP_ALL for a transaction committed before the checkpoint's LSN (the checkpoint is
        the end of a commit record, so exactly the transactions it covers start before
        it); ``partial_events`` for the split one; 0 otherwise. ``commit_lsn`` None (the
        plugin did not say) cannot be placed: RelayError rather than a guess.
        """
        checkpoint = self._checkpoint
        if checkpoint is None:
            return 0
        if commit_lsn is None:
            raise RelayError("the replication stream does not give each transaction's commit LSN "
                             "(wal2json needs include-lsn): exactly-once cannot skip what is "
                             "already in Kafka")
        if commit_lsn < checkpoint.lsn:
            return SKIP_ALL
        if commit_lsn == checkpoint.partial_commit_lsn:
            return checkpoint.partial_events
        return 0


def _newest(records: Sequence[Record], key: bytes) -> tuple[int, Checkpoint | None] | None:
    """Offset and checkpoint of ``key``'s last record (None: a tombstone or unreadable)."""
    for offset, found, value in reversed(records):
        if found == key:
            try:
                return offset, None if value is None else Checkpoint.decode(value)
            except CheckpointCorrupt:
                return offset, None
    return None


def committed_view_behind(views: CheckpointViews, *, system_id: str, slot: str,
                          confirmed: Lsn | None, fenced: bool) -> str | None:
    """One line saying how the committed view lags this source's checkpoint, or None.

    Only the source's newest record in the log counts, and only when ``read_committed``
    readers do not see it. It is wrong (1) when ``fenced`` - read after
    ``init_transactions`` ended every transaction of this source - and the last stable
    offset is not past it, or (2) when the slot is ``confirmed`` at or past its LSN: the
    relay confirms only after a commit, so the events up to it were confirmed, yet no
    ``read_committed`` consumer sees them. A newer record behind a slot that has not
    reached it is an aborted transaction's (killed before its commit): replayed, fine.
    Not ``fenced`` (doctor, beside a running relay), records at or past the last stable
    offset are not judged: their transactions may still be open.
    """
    key = checkpoint_key(system_id, slot)
    stable = views.stable_offset
    logged = _newest(views.logged if fenced else [r for r in views.logged if r[0] < stable], key)
    committed = _newest(views.committed, key)
    if logged is None or (committed is not None and committed[0] >= logged[0]):
        return None
    offset, newer = logged
    if newer is None:
        return None
    seen = committed[1].lsn if committed is not None and committed[1] is not None else None
    seen_text = f"only checkpoint {seen}" if seen is not None else "no checkpoint of this source"
    if fenced and offset >= views.stable_offset:
        return (f"checkpoint {newer.lsn} of this source (offset {offset} of the checkpoint topic) "
                f"is not below the last stable offset {views.stable_offset} although "
                "init_transactions ended every transaction of this source: read_committed "
                f"consumers see {seen_text}; the broker keeps a transaction open there")
    if confirmed is not None and confirmed >= newer.lsn and (seen is None or newer.lsn > seen):
        return (f"the slot is confirmed at {confirmed}, past checkpoint {newer.lsn} (offset "
                f"{offset} of the checkpoint topic), but read_committed consumers see "
                f"{seen_text}: the events up to {newer.lsn} are confirmed in PostgreSQL and "
                "invisible to them (the broker did not commit, or does not show, that transaction)")
    return None
