"""How much CPU other processes used while the benchmark ran (an interference meter).

The machine is shared: a test suite started by someone else during a run shows up as
lower limits and fatter latency tails, not as an error. A daemon thread samples
``/proc/*/stat`` every half second and adds every CPU tick of a process that is not
ours - ours being this harness and its descendants (relays, brokers, consumers,
pg_recvlogical) and the PostgreSQL postmaster's tree (it daemonises, so it is
registered as a second root). The report shows the total per measurement.

An estimate: a foreign process that starts and ends between two samples is missed, and
a process's last half second before it exits is lost. Kernel threads count as foreign.
Must not: signal or change any process.
"""

from __future__ import annotations

import contextlib
import os
import threading

_TICKS = os.sysconf("SC_CLK_TCK")


def _snapshot() -> dict[int, tuple[int, int, int]]:
    """pid → (ppid, start time, CPU ticks) for every process readable now."""
    procs = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            procs[int(entry.name)] = (int(fields[1]), int(fields[19]),
                                      int(fields[11]) + int(fields[12]))
    return procs


class NoiseMeter:
    """Cumulative CPU seconds of processes outside the benchmark, since ``start()``."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.roots = {os.getpid()}
        self.foreign_s = 0.0
        self._last: dict[int, tuple[int, int]] | None = None  # pid → (start time, ticks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="noise-meter", daemon=True)

    def add_root(self, pid: int) -> None:
        """Count ``pid`` and its descendants as ours too."""
        self.roots.add(pid)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Add the foreign CPU used since the previous sample."""
        procs = _snapshot()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        ours, todo = set(), [r for r in self.roots if r in procs]
        while todo:
            pid = todo.pop()
            ours.add(pid)
            todo.extend(children.get(pid, ()))
        last = self._last
        foreign = 0
        if last is not None:
            for pid, (_, started, ticks) in procs.items():
                if pid in ours:
                    continue
                before = last.get(pid)
                foreign += ticks - before[1] if before and before[0] == started else ticks
        self._last = {pid: (started, ticks) for pid, (_, started, ticks) in procs.items()}
        self.foreign_s += foreign / _TICKS
