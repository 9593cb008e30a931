"""CPU time and memory of processes, read from Linux ``/proc``.

Owns the accounting rules the report relies on:

* a process's CPU seconds are ``utime + stime`` from ``/proc/<pid>/stat``;
* a process tree's CPU seconds (the PostgreSQL cluster) are the root's own time, plus
  ``cutime + cstime`` (children it has already reaped: backends and walsenders that
  exited during the measurement), plus the time of every live child - so a backend
  that comes and goes between two readings is still counted;
* peak RSS is ``VmHWM`` from ``/proc/<pid>/status``, read while the process still runs.

Must not: start, stop or signal anything.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cdc_relay.local.helpers import children

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    # The command name (field 2) may contain spaces and parentheses: split after it.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """User + system CPU seconds of ``pid`` (plus its reaped children's, if asked)."""
    fields = _stat_fields(pid)
    # After the command name: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14)
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICKS


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root``, its live children and the children it reaped."""
    total = cpu_seconds(root, reaped_children=True)
    for child in children(root):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(child)
    return total


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise ValueError(f"/proc/{pid}/status has no {key}")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size so far (``VmHWM``), in MiB."""
    return _status_kb(pid, "VmHWM") / 1024


def rss_mb(pid: int) -> float:
    """The process's resident set size now (``VmRSS``), in MiB."""
    return _status_kb(pid, "VmRSS") / 1024


def postmaster_pid(data_dir: Path) -> int:
    """The PostgreSQL postmaster's pid, from ``postmaster.pid`` in its data directory."""
    return int((data_dir / "postmaster.pid").read_text().split()[0])
