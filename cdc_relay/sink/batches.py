"""Which entries go into the next batch of a batching sink: the ordering rules, with no I/O.

The SQS, Redis, HTTP and Kinesis sinks send batches (SendMessageBatch, a pipeline of XADDs,
a request, PutRecords) from sender threads; this planner decides what each batch holds.
Entries wait per queue (an SQS queue, a Redis stream, a URL, a Kinesis stream) in produce
order. ``take`` fills a batch of one queue with up to ``max_entries`` entries within the
queue's byte limit (SQS: its MaximumMessageSize), round-robin over the queues, under one
rule that keeps an aggregate's order (docs/sinks.md):

    a message group is *busy* while one of its entries is in a batch awaiting its reply,
    and an entry is never taken while an earlier entry of its group waits.

So a batch holds at most one entry per group, and entries of one group are sent one
batch after the other, each only once the previous one succeeded (or was given up as
permanent). An entry that failed and will be tried again goes back to its place (its
sequence number) with a time before which it is not taken: the later entries of its group
wait for it, other groups go on. Entries without a group (an SQS standard queue) are never held
back by one another. ``take`` may be told to skip queues (``allowed``: the HTTP sink's
per-host limit).

A scan looks at most ``SCAN_LIMIT`` waiting entries of a queue, so a queue full of one busy
group costs little per batch. Must not: do I/O, or know a client library (the sinks do).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_ENTRIES = 10  # SendMessageBatch's limit: the default
SCAN_LIMIT = 512


@dataclass(slots=True)
class Pending:
    """One message waiting for (or in) a batch."""

    seq: int
    queue: str
    group: str | None
    size: int
    attempts: int = 0
    not_before: float = 0.0

    def __lt__(self, other: Pending) -> bool:  # bisect keeps a queue's waiting list by seq
        return self.seq < other.seq


@dataclass
class Planner:
    """The waiting entries of every queue and the busy groups (module docstring)."""

    waiting: dict[str, list[Pending]] = field(default_factory=dict)
    busy: set[tuple[str, str]] = field(default_factory=set)
    max_entries: int = MAX_ENTRIES
    _turns: deque[str] = field(default_factory=deque)  # queues with waiting entries, round-robin

    def add(self, entry: Pending) -> None:
        """Queue an entry (in seq order: a new seq is larger than any before it)."""
        queue = self.waiting.get(entry.queue)
        if queue is None:
            queue = self.waiting[entry.queue] = []
            self._turns.append(entry.queue)
        bisect.insort(queue, entry)

    def waiting_count(self) -> int:
        """Entries not in a batch."""
        return sum(len(q) for q in self.waiting.values())

    def take(self, now: float, limit_of: dict[str, int], default_limit: int,
             allowed: Callable[[str], bool] | None = None) -> list[Pending]:
        """The next batch (one queue's entries, oldest first), or [] when none is ready.

        ``limit_of`` gives a queue's byte limit once known, else ``default_limit`` applies;
        a queue for which ``allowed`` says False is skipped this time. The taken entries'
        groups are busy until ``settle``.
        """
        for _ in range(len(self._turns)):
            queue = self._turns[0]
            self._turns.rotate(-1)
            if allowed is not None and not allowed(queue):
                continue
            batch = self._fill(queue, now, limit_of.get(queue, default_limit))
            if batch:
                return batch
        return []

    def _fill(self, queue: str, now: float, limit: int) -> list[Pending]:
        waiting = self.waiting.get(queue, [])
        taken: list[int] = []
        blocked: set[str] = set()
        room = limit
        for index, entry in enumerate(waiting[:SCAN_LIMIT]):
            group = entry.group
            if group is not None and (group in blocked or (queue, group) in self.busy):
                blocked.add(group)
                continue
            if entry.not_before > now or (entry.size > room and taken):
                if group is not None:
                    blocked.add(group)  # its later entries must not pass it
                continue
            taken.append(index)
            room -= entry.size
            if group is not None:
                blocked.add(group)
            if len(taken) == self.max_entries:
                break
        batch = [waiting[i] for i in taken]
        for i in reversed(taken):
            del waiting[i]
        for entry in batch:
            if entry.group is not None:
                self.busy.add((queue, entry.group))
        if not waiting and queue in self.waiting:
            del self.waiting[queue]
            self._turns.remove(queue)
        return batch

    def settle(self, done: list[Pending], again: list[Pending], retry_at: float) -> None:
        """A batch's reply: ``done`` entries are finished (delivered or given up), ``again``
        go back to their places, not to be taken before ``retry_at``; their groups are free."""
        for entry in done:
            if entry.group is not None:
                self.busy.discard((entry.queue, entry.group))
        for entry in again:
            if entry.group is not None:
                self.busy.discard((entry.queue, entry.group))
            entry.attempts += 1
            entry.not_before = retry_at
            self.add(entry)

    def drop_queue(self, queue: str) -> list[Pending]:
        """Remove and return every waiting entry of ``queue`` (a queue found missing)."""
        dropped = self.waiting.pop(queue, [])
        if queue in self._turns:
            self._turns.remove(queue)
        return dropped

    def claim(self, entry: Pending) -> bool:
        """Take this one waiting entry out of turn (it is sent alone); False if it is not waiting."""
        waiting = self.waiting.get(entry.queue, [])
        index = bisect.bisect_left(waiting, entry)
        if index == len(waiting) or waiting[index].seq != entry.seq:
            return False
        del waiting[index]
        if not waiting:
            self.drop_queue(entry.queue)
        if entry.group is not None:
            self.busy.add((entry.queue, entry.group))
        return True

    def next_ready(self) -> float | None:
        """The earliest ``not_before`` among waiting entries (None if nothing waits)."""
        times = [e.not_before for q in self.waiting.values() for e in q[:SCAN_LIMIT]]
        return min(times) if times else None
