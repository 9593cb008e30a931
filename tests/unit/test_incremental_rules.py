"""Incremental snapshots' pure rules (capture/incremental.py), against a model of a table.

The model: a table whose writes are transactions that first reach the WAL (their commit
record) and become visible a moment later; a relay that reads the WAL in order, passes
each change to ``streamed`` and publishes it, and publishes the rows ``mark`` returns; a
chunk reader that reads the visible table (in a snapshot whose in-progress list names
the transactions not yet visible) and appends its high watermark to the WAL some writes
later. Hypothesis interleaves all of it; the consumer's replay by key must equal the
table, and no ``r`` row of a key may come after a streamed change newer than it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from cdc_relay.capture.chunks import Chunk, Key, TableGone, TableProgress, XidSnapshot
from cdc_relay.capture.incremental import IncrementalSnapshots
from cdc_relay.capture.signals import SignalRefused, parse_signal
from cdc_relay.model import CapturedRow, Lsn, SnapshotMark, SnapshotSignal
from cdc_relay.stats import RelayStats


@dataclass(frozen=True)
class _Shape:
    schema: str = "public"
    name: str = "t"


class _Codec:
    """The two things the rules ask of a codec: the table's name and a row's key."""

    shape = _Shape()

    def key(self, image: list[Any]) -> dict[str, Any]:
        return {"id": int(image[0])}


CODEC = _Codec()


@dataclass
class _Store:
    rows: dict[tuple[str, str], TableProgress] = field(default_factory=dict)
    states: dict[tuple[str, str], str] = field(default_factory=dict)
    acked_keys: list[Key | None] = field(default_factory=list)

    def unfinished(self) -> list[TableProgress]:
        return [TableProgress(p.schema, p.table, p.signal_id, p.last_key, p.upto, p.rows)
                for t, p in self.rows.items() if self.states[t] in ("queued", "running")]

    def queue(self, signal_id: str, tables: list[tuple[str, str]]) -> None:
        for t in tables:
            if t not in self.rows or self.rows[t].signal_id != signal_id:
                self.rows[t], self.states[t] = TableProgress(*t, signal_id), "queued"

    def started(self, progress: TableProgress) -> None:
        self.rows[(progress.schema, progress.table)].upto = progress.upto
        self.states[(progress.schema, progress.table)] = "running"

    def progress(self, progress: TableProgress, last_key: Key | None) -> None:
        row = self.rows[(progress.schema, progress.table)]
        if row.signal_id == progress.signal_id:  # as the table's UPDATE ... AND signal_id
            row.last_key = last_key
            self.acked_keys.append(last_key)

    def finished(self, progress: TableProgress) -> None:
        self.states[(progress.schema, progress.table)] = "done"

    def stopped(self, tables: list[tuple[str, str]] | None) -> None:
        for t in tables or list(self.rows):
            self.states[t] = "stopped"


@dataclass
class _World:
    """The table, its WAL and its visibility (see the module docstring)."""

    visible: dict[int, int] = field(default_factory=dict)  # key -> ver
    latest: dict[int, int] = field(default_factory=dict)  # hidden writes included
    wal: list[Any] = field(default_factory=list)
    hidden: list[tuple[int, int, int | None]] = field(default_factory=list)  # xid, key, ver
    next_xid: int = 100
    ver: int = 0
    pending_mark: str | None = None
    reads: int = 0

    def write(self, key: int, op: str) -> None:
        """A transaction changing ``key``: its change reaches the WAL, not yet visible. (A
        write of a key waits for the earlier one's row lock, released once it is visible.)"""
        while any(k == key for _, k, _ in self.hidden):
            self.reveal()
        current = self.latest.get(key)
        if (current is None and op != "c") or (current is not None and op == "c"):
            op = "c" if current is None else "u"
        xid, self.next_xid = self.next_xid, self.next_xid + 1
        self.ver += 1
        ver = None if op == "d" else self.ver
        self.wal.append((xid, (op, key, current, ver)))
        self.hidden.append((xid, key, ver))
        if ver is None:
            self.latest.pop(key, None)
        else:
            self.latest[key] = ver

    def reveal(self) -> None:
        """The oldest hidden transaction becomes visible."""
        if self.hidden:
            _, key, ver = self.hidden.pop(0)
            if ver is None:
                self.visible.pop(key, None)
            else:
                self.visible[key] = ver

    # the ChunkSource
    def problem(self, schema: str, table: str) -> str | None:
        return None

    def upper_bound(self, schema: str, table: str) -> Key | None:
        return (str(max(self.visible)),) if self.visible else None

    def read(self, schema: str, table: str, after: Key | None, upto: Key, size: int,
             window: str, safe: Callable[[XidSnapshot], bool]) -> Chunk | None:
        xip = frozenset(x for x, _, _ in self.hidden)
        snapshot = XidSnapshot(min(xip) if xip else self.next_xid, self.next_xid, xip)
        if not safe(snapshot):
            return None
        self.reads += 1
        low = int(after[0]) if after else 0
        keys = sorted(k for k in self.visible if low < k <= int(upto[0]))[:size]
        rows: list[list[Any]] = [[str(k).encode(), self.visible[k]] for k in keys]
        self.pending_mark = window
        last = (str(keys[-1]),) if keys else None
        return Chunk(CODEC, rows, last, 0, 1, window, more=len(keys) == size and last != upto)


class _Relay:
    """The session's part: read the WAL in order, publish, count tokens."""

    def __init__(self, world: _World, snapshots: IncrementalSnapshots) -> None:
        self.world, self.snapshots = world, snapshots
        self.published: list[tuple[str, int, int | None]] = []  # op, key, ver (None: delete)
        self.deleted_ver: dict[int, int] = {}
        self.tokens = 0
        self.position = 0
        self.now = 0.0

    def step(self) -> bool:
        if self.position >= len(self.world.wal):
            return False
        xid, item = self.world.wal[self.position]
        self.position += 1
        if isinstance(item, str):  # a high watermark
            rows = self.snapshots.mark(SnapshotMark(item, Lsn(self.position)))
            for row in rows:
                assert row.new is not None
                self.published.append(("r", int(row.new[0]), int(row.new[1])))  # type: ignore[call-overload]
            self.tokens += len(rows)
            self.snapshots.emitted(self.tokens)
            return True
        op, key, before, after = item
        old = None if before is None else [str(key).encode(), before]
        new = None if after is None else [str(key).encode(), after]
        self.snapshots.streamed(CapturedRow(CODEC, op, new, old, Lsn(self.position), xid, 0, None))
        self.published.append((op, key, after if op != "d" else before))
        self.tokens += 1
        return True

    def tick(self) -> None:
        self.now += 1.0  # past any retry delay
        self.snapshots.tick(self.tokens, self.now)


def _signalled(world: _World, store: _Store | None = None, *, size: int = 3,
               stats: RelayStats | None = None) -> IncrementalSnapshots:
    """Snapshots of the model's table, asked for by signal ``s1``."""
    snapshots = IncrementalSnapshots(world, store or _Store(), size=size,
                                     captured=lambda s, t: True, instance="i", stats=stats)
    snapshots.resume()
    snapshots.signal(SnapshotSignal("s1", "execute-snapshot", '{"data-collections": ["t"]}', Lsn(0)))
    return snapshots


def _check(published: list[tuple[str, int, int | None]], table: dict[int, int]) -> None:
    state: dict[int, int] = {}
    newest: dict[int, float] = {}
    for op, key, ver in published:
        assert ver is not None
        if op == "d":
            newest[key] = max(newest.get(key, 0), ver + 0.5)
            state.pop(key, None)
            continue
        if op == "r":
            assert ver >= newest.get(key, 0), f"r of key {key} (ver {ver}) after a newer change"
        else:
            newest[key] = max(newest.get(key, 0), ver)
        state[key] = ver
    assert state == table


ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(1, 30), st.sampled_from("cud")),
    st.tuples(st.just("reveal"), st.just(0), st.just("")),
    st.tuples(st.just("step"), st.integers(1, 5), st.just("")),
    st.tuples(st.just("tick"), st.just(0), st.just("")),
    st.tuples(st.just("mark"), st.just(0), st.just("")),
), max_size=150)


@settings(max_examples=1000, deadline=None)
@example(initial={1, 2}, size=5, actions=[  # a streamed change its chunk's snapshot misses
    ("write", 1, "u"), ("step", 1, ""), ("tick", 0, ""), ("mark", 0, ""), ("step", 2, "")])
@given(initial=st.sets(st.integers(1, 30), max_size=25), actions=ACTIONS,
       size=st.integers(1, 7))
def test_any_interleaving_of_writes_reads_and_watermarks_replays_to_the_table_in_key_order(
        initial: set[int], actions: list[tuple[str, int, str]], size: int) -> None:
    world = _World(visible={k: 0 for k in initial})
    snapshots = IncrementalSnapshots(world, _Store(), size=size, captured=lambda s, t: True,
                                     instance="i")
    world.latest = dict(world.visible)
    relay = _Relay(world, snapshots)  # the table's rows predate its capture: no events
    snapshots.resume()
    snapshots.signal(SnapshotSignal("s1", "execute-snapshot",
                                    '{"data-collections": ["public.t"]}', Lsn(0)))
    for action, n, op in actions:
        if action == "write":
            world.write(n, op)
        elif action == "reveal":
            world.reveal()
        elif action == "step":
            for _ in range(n):
                relay.step()
        elif action == "tick":
            relay.tick()
        elif world.pending_mark is not None:
            world.wal.append((0, world.pending_mark))
            world.pending_mark = None
    for _ in range(10_000):  # drain: everything visible, every mark written, every chunk read
        while world.hidden:
            world.reveal()
        if world.pending_mark is not None:
            world.wal.append((0, world.pending_mark))
            world.pending_mark = None
        while relay.step():
            pass
        relay.tick()
        if snapshots.active is None and world.pending_mark is None:
            break
    assert snapshots.active is None
    # keys never written since the table joined are known to the consumer only by their r
    _check(relay.published, world.visible)


def test_a_snapshot_not_seeing_a_streamed_transaction_is_read_again_later() -> None:
    world = _World(visible={1: 0, 2: 0}, latest={1: 0, 2: 0})
    snapshots = IncrementalSnapshots(world, _Store(), size=10, captured=lambda s, t: True,
                                     instance="i")
    relay = _Relay(world, snapshots)
    snapshots.resume()
    snapshots.signal(SnapshotSignal("s1", "execute-snapshot", '{"data-collections": ["t"]}', Lsn(0)))
    world.write(1, "u")  # in the WAL, not yet visible (a commit waiting for a standby)
    relay.step()
    relay.tick()
    assert world.reads == 0 and world.pending_mark is None  # refused: it does not see xid 100
    world.reveal()
    snapshots.tick(relay.tokens, 2e9)
    assert world.reads == 1


def test_progress_is_recorded_only_once_the_chunk_is_acknowledged_and_resumes_after_it() -> None:
    world = _World(visible={k: 0 for k in range(1, 8)})
    store = _Store()
    snapshots = _signalled(world, store, size=3)
    snapshots.tick(0, 0)
    window = world.pending_mark
    assert window is not None
    rows = snapshots.mark(SnapshotMark(window, Lsn(5)))
    assert [r.snapshot for r in rows] == ["incremental"] * 3 and rows[0].op == "r"
    snapshots.emitted(3)
    snapshots.tick(2, 0)  # the third row is not acknowledged yet
    assert store.acked_keys == []
    snapshots.tick(3, 0)
    assert store.acked_keys == [("3",)]
    # a restart: a new relay reads on from key 3
    again = IncrementalSnapshots(world, store, size=3, captured=lambda s, t: True, instance="j")
    again.resume()
    again.tick(0, 0)
    assert again.mark(SnapshotMark(world.pending_mark or "", Lsn(9)))[0].new == [b"4", 0]


def test_a_replayed_signal_does_not_restart_its_table_and_a_stop_ends_it() -> None:
    world = _World(visible={k: 0 for k in range(1, 8)})
    store = _Store()
    stats = RelayStats()
    snapshots = IncrementalSnapshots(world, store, size=3, captured=lambda s, t: True,
                                     instance="i", stats=stats)
    snapshots.resume()
    signal = SnapshotSignal("s1", "execute-snapshot", '{"data-collections": ["public.t"]}', Lsn(0))
    snapshots.signal(signal)
    snapshots.signal(signal)
    assert len(store.unfinished()) == 1 and stats.incremental_tables == 1
    snapshots.signal(SnapshotSignal("s2", "stop-snapshot", '{"data-collections": []}', Lsn(1)))
    assert snapshots.active is None and store.states[("public", "t")] == "stopped"
    assert stats.incremental_tables == 0


def test_signals_for_uncaptured_tables_are_refused_with_one_line(caplog: Any) -> None:
    world = _World(visible={1: 0})
    snapshots = IncrementalSnapshots(world, _Store(), size=3, captured=lambda s, t: t == "t",
                                     instance="i")
    snapshots.resume()
    snapshots.signal(SnapshotSignal("s1", "execute-snapshot",
                                    '{"data-collections": ["public.other"]}', Lsn(0)))
    assert snapshots.active is None
    assert [r.getMessage() for r in caplog.records] == [
        "snapshot signal 's1' refused for public.other: public.other is not captured "
        "(add it to --capture first)"]


def test_signal_rows_parse_as_debezium_writes_them() -> None:
    request = parse_signal("a", "execute-snapshot",
                           '{"data-collections": ["public.t", "s.u"], "type": "incremental"}')
    assert request is not None and request.tables == (("public", "t"), ("s", "u"))
    assert parse_signal("b", "log", '{"message": "hi"}') is None
    for data in ('{"data-collections": ["t"], "type": "blocking"}', "[1]", "{",
                 '{"data-collections": []}',
                 '{"data-collections": ["t"], "additional-conditions": [{"filter": "x"}]}'):
        try:
            parse_signal("c", "execute-snapshot", data)
        except SignalRefused:
            continue
        raise AssertionError(f"accepted {data}")


def test_a_snapshot_sees_transactions_by_their_32_bit_xid_across_epochs() -> None:
    snapshot = XidSnapshot.parse(f"{(1 << 32) + 5}:{(1 << 32) + 20}:{(1 << 32) + 9}")
    assert snapshot.visible(4) and not snapshot.visible(9) and snapshot.visible(10)
    assert snapshot.visible(0xFFFFFFF0)  # the previous epoch's, long finished
    assert snapshot.settled(4) and not snapshot.settled(10)


def test_acknowledged_rows_and_tables_left_reach_the_metrics_and_status() -> None:
    from cdc_relay.config import TableRef
    from cdc_relay.model import Lsn as Position
    from cdc_relay.ops.metrics.collectors import WalCollector
    from cdc_relay.ops.status import StatusReport
    from tests.unit.test_metrics_endpoint import samples

    world = _World(visible={k: 0 for k in range(1, 5)})
    stats = RelayStats()
    assert not any("incremental" in k for k in samples(WalCollector(stats, None)))
    snapshots = _signalled(world, None, size=10, stats=stats)
    snapshots.tick(0, 0)
    snapshots.emitted(len(snapshots.mark(SnapshotMark(world.pending_mark or "", Lsn(3)))))
    snapshots.tick(4, 0)
    got = samples(WalCollector(stats, None))
    assert got["cdc_relay_incremental_snapshot_rows_total"] == 4
    assert got["cdc_relay_incremental_snapshot_tables"] == 0
    report = StatusReport("cdc_relay", Position(1), None, TableRef("public", "outbox_events"),
                          0, 0, incremental=(("public.t", "done", 4),))
    assert "incremental snapshot  public.t: done, 4 rows acknowledged" in "\n".join(report.lines())
    assert report.to_dict()["incremental_snapshots"] == [
        {"table": "public.t", "state": "done", "rows_done": 4}]


def test_the_snapshot_command_refuses_bad_input_in_one_line(capsys: Any) -> None:
    from cdc_relay.cli.main import cli
    from cdc_relay.cli.options import run_cli
    from cdc_relay.errors import ExitCode

    dsn = "host=127.0.0.1 port=1 dbname=x user=u connect_timeout=2"
    assert run_cli(cli, ["snapshot", "--dsn", dsn]) == ExitCode.USAGE
    assert "snapshot needs the captured tables" in capsys.readouterr().err
    assert run_cli(cli, ["snapshot", "--dsn", dsn, "a;b.c"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_new_signal_for_a_table_being_snapshotted_starts_it_again_from_its_first_key() -> None:
    world = _World(visible={k: 0 for k in range(1, 8)})
    store = _Store()
    snapshots = _signalled(world, store, size=3)
    snapshots.tick(0, 0)
    snapshots.emitted(len(snapshots.mark(SnapshotMark(world.pending_mark or "", Lsn(3)))))
    snapshots.signal(SnapshotSignal("s2", "execute-snapshot", '{"data-collections": ["t"]}', Lsn(4)))
    active = snapshots.active
    assert active is not None and active.signal_id == "s2" and active.last_key is None
    snapshots.tick(3, 1)  # s1's chunk acknowledged: s1's progress no longer counts
    assert store.rows[("public", "t")].signal_id == "s2"
    assert store.rows[("public", "t")].last_key is None and store.acked_keys == []
    assert snapshots.mark(SnapshotMark(world.pending_mark or "", Lsn(9)))[0].new == [b"1", 0]


def test_a_table_dropped_during_its_snapshot_stops_it_with_one_line(caplog: Any) -> None:
    class Dropped(_World):
        def read(self, *args: Any, **kwargs: Any) -> Chunk | None:
            raise TableGone("the table was dropped")

    world = Dropped(visible={1: 0})
    store = _Store()
    snapshots = _signalled(world, store)
    snapshots.tick(0, 0)
    assert snapshots.active is None and store.states[("public", "t")] == "stopped"
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "incremental snapshot of public.t stopped: the table was dropped"]
