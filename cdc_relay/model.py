"""The relay's vocabulary: LSNs, decoded changes, outbox events, Kafka-bound messages,
the dead-letter topic's records, a slot's status.

Pure values only. This module imports no driver (no psycopg, no confluent_kafka) so
that decoders, the router and the ack tracker stay testable without services, and so
that other sinks (docs/design.md, roadmap) can reuse the same vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_LSN_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


class Lsn(int):
    """A PostgreSQL log sequence number: an ordered 64-bit integer printed as ``16/B374D848``.

    A subclass of ``int`` so comparisons and hashing cost nothing on the hot path.
    """

    __slots__ = ()

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """Parse ``"X/Y"`` (hex halves) into an Lsn; raise ValueError on anything else."""
        match = _LSN_RE.match(text.strip())
        if match is None:
            raise ValueError(f"not an LSN: {text!r} (expected e.g. '16/B374D848')")
        return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


ZERO_LSN = Lsn(0)


@dataclass(frozen=True, slots=True)
class OutboxColumns:
    """Names of the outbox table's columns.

    The defaults follow docs/design.md, the outbox table; Debezium's outbox table works by configuration
    (``id``, ``aggregatetype``, ``aggregateid``, ``type``, ``payload``).
    """

    id: str = "id"
    aggregate_type: str = "aggregate_type"
    aggregate_id: str = "aggregate_id"
    event_type: str = "event_type"
    payload: str = "payload"
    created_at: str = "created_at"

    @classmethod
    def debezium(cls) -> OutboxColumns:
        """The column names of Debezium's outbox event router."""
        return cls(
            id="id",
            aggregate_type="aggregatetype",
            aggregate_id="aggregateid",
            event_type="type",
            payload="payload",
            created_at="created_at",
        )


@dataclass(slots=True)
class OutboxEvent:
    """One committed outbox row, from either mode.

    ``payload`` is the JSON text exactly as it will be sent (UTF-8 bytes).
    ``created_at_ms`` is epoch milliseconds (the Kafka message timestamp), or None.
    ``lsn`` is the row's WAL position in WAL mode and ZERO_LSN in polling mode.
    ``attempt`` is 1 in WAL mode and the row's attempt number in polling mode.
    ``extra`` holds the text values (None for NULL) of the columns the message options name
    (``--header``, ``--partition-column``), in ``RouterConfig.extra_columns`` order; empty
    when none are named, all None for a logical decoding message (it has no columns).
    ``traceparent`` / ``tracestate`` are the W3C trace context the writer recorded, if any.

    Treat it as immutable. It is not ``frozen`` only because a frozen dataclass costs
    ~0.7 µs more per construction, on a path that runs 100k times a second. The compiled
    decoders build it in C without calling ``__init__`` (cdc_relay/decoding/_cslots.h
    lists these fields and refuses, at decoder construction, a class with other ones):
    a field added here must be added there too.
    """

    id: str
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: bytes
    created_at_ms: int | None = None
    lsn: Lsn = ZERO_LSN
    attempt: int = 1
    extra: tuple[str | None, ...] = ()
    traceparent: str | None = None
    tracestate: str | None = None


def carry(event: OutboxEvent, values: Sequence[Any], extra: int, trace: int) -> OutboxEvent:
    """Attach carried column values read from a table row: ``extra`` message columns, then
    ``trace`` trace context columns (traceparent, tracestate) - polling's claims and the
    backfill read them in this order, so both give the message a decoder would."""
    if extra:
        event.extra = tuple(values[:extra])
    if trace:
        event.traceparent = values[extra]
        if trace > 1:
            event.tracestate = values[extra + 1]
    return event


@dataclass(frozen=True, slots=True)
class Begin:
    """A transaction starts (WAL mode).

    ``commit_lsn`` is the LSN of its commit record (known at Begin: logical decoding sends
    a transaction only after it committed), or None when the plugin does not say. Commit
    records are ordered, so it places the whole transaction against an exactly-once
    checkpoint before any of its events is read (docs/design.md, exactly-once delivery).
    """

    xid: int | None = None
    commit_lsn: Lsn | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """A transaction ends; ``end_lsn`` is the position to confirm once all of it is acked."""

    end_lsn: Lsn
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class IgnoredMessage:
    """A non-transactional logical decoding message with the relay's prefix (WAL mode).

    It is not part of any transaction, so it cannot be an outbox event (it would appear
    even if the writer rolled back): the loop only counts it.
    """

    prefix: str


@dataclass(slots=True)
class CapturedRow:
    """One INSERT, UPDATE or DELETE of a captured table (WAL mode, ``run --capture``).

    ``table`` is the capture room's codec of the table as the Relation message before it
    described it (cdc_relay/capture/envelope.py; opaque here). ``op`` is ``c``, ``u`` or
    ``d``; ``new`` and ``old`` are the row images as pgoutput sent them, one entry per
    column: the value's text (UTF-8 bytes), None for NULL, or ``UNCHANGED`` for an
    unchanged TOASTed value; ``old`` is None when the message had no old image. ``lsn``
    is the change's position, ``xid`` / ``commit_us`` (microseconds since the epoch) its
    transaction's, ``last_commit`` the end of the previous transaction the stream
    delivered (None before the first): what Debezium's ``source`` block reports.
    A snapshot's row (``run --capture --snapshot initial``) has ``op`` ``r``, the slot's
    consistent point as ``lsn``, the moment it was read as ``commit_us`` and ``snapshot``
    as Debezium marks it (``first``, ``true``, ``last_in_data_collection``, ...).
    A TRUNCATE (``run --capture-truncate``) has ``op`` ``t``, no images and, as ``table``,
    the tuple of the codecs of the captured tables it empties.
    """

    table: Any
    op: str
    new: list[bytes | object | None] | None
    old: list[bytes | object | None] | None
    lsn: Lsn
    xid: int | None
    commit_us: int
    last_commit: Lsn | None
    snapshot: str = "false"


UNCHANGED = object()  # CapturedRow: an unchanged TOASTed value (pgoutput's 'u')


@dataclass(frozen=True, slots=True)
class SnapshotSignal:
    """A row inserted into the signal table (``run --capture``; Debezium's signal table
    columns ``id``, ``type``, ``data``): capture/incremental.py acts on it."""

    id: str
    type: str
    data: str | None
    lsn: Lsn


@dataclass(frozen=True, slots=True)
class SnapshotMark:
    """An incremental snapshot's high watermark: the logical decoding message naming the
    ``window`` a chunk read opened (capture/incremental.py), at ``lsn``."""

    window: str
    lsn: Lsn

# What a decoder yields for one replication message. Other messages (updates, deletes of
# tables not captured, other prefixes' logical messages, relations, ...) decode to None
# and are not Changes.
Change = Begin | OutboxEvent | Commit | IgnoredMessage | CapturedRow | SnapshotSignal | SnapshotMark


@dataclass(slots=True)
class Message:
    """A broker-neutral message: what the router makes of an OutboxEvent.

    Treat it as immutable (not ``frozen`` for the same per-event cost as OutboxEvent).
    The compiled router builds it in C, as the decoders build OutboxEvent: a field added
    here must be added to cdc_relay/decoding/_cslots.h too.
    """

    topic: str
    key: bytes | None  # None only for a captured table without a key (Kafka sink only)
    value: bytes | None  # None only for a captured row's tombstone (Kafka sink only)
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp_ms: int | None = None
    partition: int | None = None  # None: the sink's partitioner decides (from the key)


@dataclass(slots=True)
class CapturedMessage(Message):
    """A message of a captured table (an envelope or a tombstone), in flight under a token
    as an OutboxEvent would be: the delivery engine names it by ``id`` (``schema.table``
    at the change's LSN) and ``event_type`` (the op), and counts its ``payload`` bytes."""

    id: str = ""
    event_type: str = ""
    aggregate_id: str = ""
    attempt: int = 1

    @property
    def payload(self) -> bytes:
        """The value's bytes (empty for a tombstone)."""
        return self.value or b""


# What the delivery engine holds in flight under a token.
InFlight = OutboxEvent | CapturedMessage


# Columns the relay itself owns in the outbox table (not configurable).
BOOKKEEPING_COLUMNS = ("attempts", "processed_at", "retry_after", "last_error", "dead_lettered_at")
NOTIFY_TRIGGER = "cdc_relay_notify"  # polling's wake-up trigger (names are per table)
# Optional W3C trace context columns (``init --with-trace-context``), copied to headers.
TRACE_COLUMNS = ("traceparent", "tracestate")
# The logical decoding message prefix of ``outbox.emit_message`` (tableless outbox).
MESSAGE_PREFIX = "cdc-relay"


# Headers Router.dead_letter appends, in the order it appends them (last first here).
_APPENDED = ("payload_omitted_bytes", "original_topic", "error")


@dataclass(frozen=True, slots=True)
class TopicDeadLetter:
    """One record of WAL mode's dead-letter topic (read back by sink/kafka/dead_letters.py,
    chosen and rebuilt by ops/dead_letters.py)."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int | None

    def header(self, name: str) -> str | None:
        """The last header of that name, as text (None if absent)."""
        for key, value in reversed(self.headers):
            if key == name:
                return value.decode("utf-8", "replace")
        return None

    @property
    def id(self) -> str:
        return self.header("id") or ""

    @property
    def original_headers(self) -> list[tuple[str, bytes]]:
        """The headers of the message the relay first tried to send."""
        headers = list(self.headers)
        for name in _APPENDED:
            if headers and headers[-1][0] == name:
                headers.pop()
        return headers

    @property
    def payload_omitted(self) -> str | None:
        """Bytes of payload the dead letter left out (too large to send at all), else None."""
        return self.header("payload_omitted_bytes")


@dataclass(frozen=True, slots=True)
class SlotStatus:
    """A slot's row of ``pg_replication_slots`` plus its lag against the server."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active: bool
    active_pid: int | None
    confirmed_flush_lsn: Lsn | None
    restart_lsn: Lsn | None
    lag_bytes: int | None  # current WAL position - confirmed flush LSN
    lag_seconds: float | None  # walsender flush_lag; None while no walsender streams it
    retained_bytes: int | None  # current WAL position - restart LSN: WAL kept for the slot
    wal_status: str | None  # reserved / extended / unreserved / lost
    safe_wal_size: int | None  # bytes writable before invalidation; None = unlimited
    failover: bool | None = None  # a failover slot (PostgreSQL 17+; None before)
    synced: bool | None = None  # a standby's copy synchronized from the primary (17+)
    invalidation_reason: str | None = None  # why PostgreSQL invalidated it (17+); None: it did not
    inactive_seconds: float | None = None  # since no client streams from it (17+'s inactive_since)
    # PostgreSQL 18's idle_replication_slot_timeout in seconds: an inactive slot is
    # invalidated at the first checkpoint after it; 0 = off, None = a server without it.
    idle_timeout: float | None = None

    @property
    def invalidated(self) -> bool:
        """PostgreSQL invalidated the slot: it can never stream again (a slot loss)."""
        return self.wal_status == "lost" or self.invalidation_reason is not None

    @property
    def idle_budget_used(self) -> float | None:
        """The share of idle_replication_slot_timeout this inactive slot has used (None: no
        timeout, or the slot is active)."""
        if not self.idle_timeout or self.active or self.inactive_seconds is None:
            return None
        return self.inactive_seconds / self.idle_timeout


# Why PostgreSQL invalidates a slot (pg_replication_slots.invalidation_reason), and the fix
# that keeps it from happening again (docs/high-availability.md, slot loss).
INVALIDATION_CAUSES = {
    "wal_removed": ("the WAL it needed was removed (max_slot_wal_keep_size exceeded)",
                    "raise max_slot_wal_keep_size above what the relay's longest outage retains"),
    "idle_timeout": ("it stayed inactive longer than idle_replication_slot_timeout "
                     "(PostgreSQL 18)",
                     "raise idle_replication_slot_timeout above the relay's longest downtime, or "
                     "set it to 0 (off): ALTER SYSTEM SET idle_replication_slot_timeout = '7d'; "
                     "SELECT pg_reload_conf();"),
    "rows_removed": ("rows it needed were removed by VACUUM (a standby without "
                     "hot_standby_feedback)", "set hot_standby_feedback = on on the standby (with "
                     "primary_slot_name, so it survives restarts), then recreate the slot"),
    "wal_level_insufficient": ("wal_level on the primary is below logical",
                               "set wal_level = logical on the primary and restart it, "
                               "then recreate the slot"),
}


IDLE_BUDGET_WARN = 0.5  # of idle_replication_slot_timeout: doctor and status warn beyond it


def seconds_text(seconds: float) -> str:
    """``90`` -> ``1m30s``; ``7200`` -> ``2h0m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60}m"
    return f"{whole // 86400}d{whole % 86400 // 3600}h"


def idle_timeout_warning(slot: SlotStatus) -> str | None:
    """The warning when an inactive slot has used more than half of PostgreSQL 18's
    idle_replication_slot_timeout (None: no timeout, active, or well within it)."""
    used = slot.idle_budget_used
    if used is None or used <= IDLE_BUDGET_WARN or slot.invalidated:
        return None
    assert slot.inactive_seconds is not None and slot.idle_timeout is not None
    left = max(slot.idle_timeout - slot.inactive_seconds, 0)
    return (f"slot {slot.name} has been inactive for {seconds_text(slot.inactive_seconds)} of "
            f"idle_replication_slot_timeout's {seconds_text(slot.idle_timeout)}: the first "
            f"checkpoint after {seconds_text(left)} more invalidates it (a slot loss). Start "
            "the relay now, or raise idle_replication_slot_timeout above the relay's longest "
            "downtime (0 = off)")


def invalidation_cause(reason: str | None) -> tuple[str, str]:
    """(why the slot was invalidated, the fix) for an invalidation_reason (None: wal_removed,
    what a server before 17 means by wal_status 'lost')."""
    return INVALIDATION_CAUSES.get(reason or "wal_removed", (
        f"invalidation_reason {reason!r}", "see the server's log for the invalidation"))


def human_bytes(value: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
