"""A throwaway PostgreSQL primary and streaming standby for failover tests (docs/high-availability.md).

Owns: starting a primary (cdc_relay.local.postgres.PostgresCluster) and one streaming
standby of it, each on a free port of its own; synchronous replication, so that every
commit the primary acknowledged is on the standby; on PostgreSQL 17+ the failover-slot
settings (primary: ``synchronized_standby_slots`` naming the standby's physical slot;
standby: ``sync_replication_slots``, ``hot_standby_feedback``, ``primary_slot_name`` and a
``primary_conninfo`` with ``dbname``); a failover (kill the primary, promote the
standby) and waits on replication (replayed, slot synchronised).

Must not: touch a server it did not start, or import the relay's drivers (SQL goes
through each cluster's ``psql``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import tail
from cdc_relay.local.postgres import PostgresCluster


class PostgresPair:
    """A primary and its streaming standby (physical slot ``slot``), cleaned up together."""

    def __init__(self, *, bin_dir: str | Path | None = None, version: str | None = None,
                 slot: str = "standby1", synchronous: bool = True,
                 failover_slots: bool | None = None, settings: dict[str, str] | None = None,
                 standby_settings: dict[str, str] | None = None) -> None:
        """``failover_slots``: None = on wherever the server has them (17+)."""
        self.primary = PostgresCluster(settings=settings, version=version, bin_dir=bin_dir)
        self.slot = slot
        self.synchronous = synchronous
        self._failover_slots = failover_slots
        self._standby_settings = dict(standby_settings or {})
        self._standby: PostgresCluster | None = None

    @property
    def standby(self) -> PostgresCluster:
        if self._standby is None:
            raise LocalServiceError("the pair has no standby yet: call start()")
        return self._standby

    @property
    def version(self) -> int:
        """Major version of both servers' binaries."""
        return self.primary.version

    @property
    def failover_slots(self) -> bool:
        """Whether the pair is set up for failover slots (PostgreSQL 17+ only)."""
        if self._failover_slots is None:
            return self.version >= 17
        if self._failover_slots and self.version < 17:
            raise LocalServiceError(f"failover slots need PostgreSQL 17+, not {self.version}")
        return self._failover_slots

    def start(self) -> Self:
        """Start the primary, then the standby; wait until it streams (synchronously if asked)."""
        try:
            self.primary.start()
            settings = dict(self._standby_settings)
            if self.version >= 17 and not self.failover_slots:
                settings.setdefault("sync_replication_slots", "off")
            self._standby = self.primary.standby(self.slot, settings=settings)
            self._standby.start()
            self._configure_primary()
            self.wait_streaming()
        except BaseException:
            self.cleanup()
            raise
        return self

    def _configure_primary(self) -> None:
        """Primary-only settings, after the base backup so the standby never inherits them."""
        changes = []
        if self.synchronous:
            changes.append(f"ALTER SYSTEM SET synchronous_standby_names = '\"{self.slot}\"'")
        if self.failover_slots:
            changes.append(f"ALTER SYSTEM SET synchronized_standby_slots = '{self.slot}'")
        for sql in changes:
            self.primary.execute(sql)
        if changes:
            self.primary.execute("SELECT pg_reload_conf()")

    def wait_streaming(self, timeout: float = 60.0) -> None:
        """Until the primary's walsender streams to the standby (as its synchronous standby)."""
        wanted = "sync" if self.synchronous else "async"
        sql = (f"SELECT count(*) FROM pg_stat_replication WHERE application_name = '{self.slot}'"
               f" AND state = 'streaming' AND sync_state = '{wanted}'")
        _wait(lambda: self.primary.execute(sql) == "1", timeout,
              f"the standby streaming ({wanted}) from the primary", self.standby)

    def wait_replayed(self, timeout: float = 60.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        lsn = self.primary.execute("SELECT pg_current_wal_lsn()")
        sql = f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"
        _wait(lambda: self.standby.execute(sql) == "t", timeout,
              f"the standby replaying up to {lsn}", self.standby)

    def synced_slot(self, name: str) -> tuple[bool, bool] | None:
        """The standby's copy of logical slot ``name``: (synced, temporary), None if absent."""
        row = self.standby.execute(f"SELECT synced, temporary FROM pg_replication_slots"
                                   f" WHERE slot_name = '{name}'")
        if not row:
            return None
        synced, temporary = row.split("|")
        return synced == "t", temporary == "t"

    def wait_failover_ready(self, name: str, timeout: float = 60.0, *,
                            advance: bool = False) -> None:
        """Until the standby holds a copy of slot ``name`` that survives promotion.

        That is ``synced AND NOT temporary``: PostgreSQL drops temporary synced slots at
        promotion, and a copy stays temporary while the primary's slot is behind the
        standby's catalog xmin. The primary's slot moves on only when its consumer
        confirms past a running-transactions record: the wait logs one every round
        (``pg_log_standby_snapshot()``) instead of waiting up to 15 s for the next; the
        slot's consumer must still confirm past it, or, with ``advance``, the wait moves
        the (inactive) slot to the primary's current position itself.
        """
        if not self.failover_slots:
            raise LocalServiceError("the pair is not set up for failover slots")

        def ready() -> bool:
            if self.synced_slot(name) == (True, False):
                return True
            self.primary.execute("SELECT pg_log_standby_snapshot()")
            if advance:
                self.primary.execute(f"SELECT pg_replication_slot_advance('{name}',"
                                     f" pg_current_wal_lsn())")
            return False

        _wait(ready, timeout, f"a failover-ready copy of slot {name!r} on the standby",
              self.standby)

    def fail_over(self) -> None:
        """Kill the primary (a crash) and promote the standby, which then accepts writes."""
        self.primary.kill()
        self.standby.promote()

    def cleanup(self) -> None:
        """Stop both servers at once and remove their temp dirs (primary first)."""
        try:
            self.primary.cleanup()
        finally:
            if self._standby is not None:
                self._standby.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()


def _wait(condition: Callable[[], bool], timeout: float, what: str,
          standby: PostgresCluster) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise LocalServiceError(f"timed out waiting for {what}; standby log:\n"
                                    f"{tail(standby.log_path)}")
        time.sleep(0.05)
