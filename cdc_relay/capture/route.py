"""A captured row's messages: Debezium's change event(s), a tombstone after a delete.

Owns ``CaptureRouter.route``: a CapturedRow → the messages to produce, in order:

* a snapshot's row → ``r`` (``before`` null, ``source.snapshot`` the row's marker);
* insert → ``c``; update → ``u`` (``before`` from the old image when pgoutput sent one);
  delete → ``d`` and, with tombstones on, a tombstone (the key, a null value);
* an update whose old image gives another key than the new one (a primary key changed,
  or a REPLICA IDENTITY INDEX/FULL image Debezium reads a key from) → what Debezium
  emits for it: ``d`` (old key), its tombstone, ``c`` (new key), the first two with the
  header ``__debezium.newkey``, the ``c`` with ``__debezium.oldkey`` (capture/headers.py);
* a TRUNCATE (``op`` ``t``, ``--capture-truncate``) → one ``t`` event per table it names,
  as Debezium's: a null key, ``before`` and ``after`` null (no tombstone);
* a row its codec cannot encode (a type without a mapping, a value it cannot read) →
  one message whose ``problem`` says why: the session sends it to the dead-letter topic
  and goes on (docs/design.md, failure rules).

Every message of one row shares the row's LSN; the session gives each its own token, so
the commit is confirmed only once all of them are acknowledged.

Must not: do I/O, read the clock itself (``clock_ns`` is injected), or produce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc_relay.capture.envelope import SourceInfo, TableCodec, source_block
from cdc_relay.capture.headers import NEWKEY, OLDKEY
from cdc_relay.capture.jsonw import dumps
from cdc_relay.model import UNCHANGED, CapturedMessage, CapturedRow

__all__ = ["CaptureRouter", "Routed"]


@dataclass(slots=True)
class Routed:
    """``messages`` to produce; ``problem`` set when they are one dead letter to send."""

    messages: list[CapturedMessage]
    problem: str | None = None
    # a TRUNCATE of several tables: per message, the problem that makes it a dead letter
    problems: list[str | None] | None = None
    made_ns: int = 0  # when the events were made (clock_ns), for the per-table lag


class CaptureRouter:
    """See the module docstring."""

    def __init__(self, info: SourceInfo, *, tombstones: bool = True,
                 clock_ns: Callable[[], int]) -> None:
        self._info = info
        self._tombstones = tombstones
        self._clock_ns = clock_ns

    def route(self, row: CapturedRow) -> Routed:
        """The messages of ``row`` (see the module docstring)."""
        if row.op == "t":
            return self._truncate(row)
        codec: TableCodec = row.table
        if codec.problem is not None:
            return self._unencodable(row, codec, codec.problem)
        try:
            now = self._clock_ns()
            return Routed(self._events(row, codec, now), made_ns=now)
        except ValueError as exc:
            return self._unencodable(row, codec, str(exc))

    def _events(self, row: CapturedRow, codec: TableCodec, now: int) -> list[CapturedMessage]:
        source = source_block(self._info, codec, commit_us=row.commit_us,
                              last_commit=row.last_commit, lsn=int(row.lsn), xid=row.xid,
                              snapshot=row.snapshot)
        old = None if row.old is None else codec.row(row.old)
        if row.op == "d":
            assert row.old is not None
            return self._delete(row, codec, codec.key(row.old), old, source, now)
        assert row.new is not None
        new = codec.row(row.new)
        key = codec.key(row.new)
        if row.op == "u" and row.old is not None and codec.has_key:
            old_key = codec.key(row.old)
            if old_key != key:
                assert old_key is not None and key is not None  # codec.has_key
                deleted = self._delete(row, codec, old_key, old, source, now)
                for message in deleted:
                    message.headers = [(NEWKEY, codec.key_header(key))]
                created = self._event(row, codec, key, None, new, source, "c", now)
                created.headers = [(OLDKEY, codec.key_header(old_key))]
                return [*deleted, created]
        return [self._event(row, codec, key, old, new, source, row.op, now)]

    def _truncate(self, row: CapturedRow) -> Routed:
        now = self._clock_ns()
        messages: list[CapturedMessage] = []
        problems: list[str | None] = []
        for codec in row.table:
            if codec.problem is not None:
                messages += self._unencodable(row, codec, codec.problem).messages
            else:
                source = source_block(self._info, codec, commit_us=row.commit_us,
                                      last_commit=row.last_commit, lsn=int(row.lsn), xid=row.xid)
                messages.append(self._event(row, codec, None, None, None, source, "t", now))
            problems.append(codec.problem)
        return Routed(messages, problems=problems if any(problems) else None, made_ns=now)

    def _delete(self, row: CapturedRow, codec: TableCodec, key: dict[str, Any] | None,
                old: dict[str, Any] | None, source: dict[str, Any],
                now: int) -> list[CapturedMessage]:
        event = self._event(row, codec, key, old, None, source, "d", now)
        if not self._tombstones:
            return [event]
        tombstone = CapturedMessage(codec.topic, event.key, None, id=event.id,
                                    event_type="tombstone", aggregate_id=codec.shape.qualified)
        return [event, tombstone]

    @staticmethod
    def _event(row: CapturedRow, codec: TableCodec, key: dict[str, Any] | None,
               before: dict[str, Any] | None, after: dict[str, Any] | None,
               source: dict[str, Any], op: str, now: int) -> CapturedMessage:
        envelope = {"before": before, "after": after, "source": source, "transaction": None,
                    "op": op, "ts_ms": now // 1_000_000, "ts_us": now // 1000, "ts_ns": now}
        return CapturedMessage(codec.topic, codec.key_bytes(key), codec.value_bytes(envelope),
                               id=f"{codec.shape.qualified}@{row.lsn}", event_type=op,
                               aggregate_id=codec.shape.qualified)

    @staticmethod
    def _unencodable(row: CapturedRow, codec: TableCodec, problem: str) -> Routed:
        """The row as its text values (JSON), for the dead-letter topic."""
        def image(values: list[bytes | object | None] | None) -> list[Any] | None:
            if values is None:
                return None
            return [v.decode("utf-8", "replace") if isinstance(v, bytes)
                    else "__unchanged_toast__" if v is UNCHANGED else None for v in values]

        value = dumps({"table": codec.shape.qualified, "op": row.op, "lsn": str(row.lsn),
                       "old": image(row.old), "new": image(row.new)})
        message = CapturedMessage(codec.topic, None, value, id=f"{codec.shape.qualified}@{row.lsn}",
                                  event_type=row.op, aggregate_id=codec.shape.qualified)
        return Routed([message], problem)
