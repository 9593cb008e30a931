"""The live display of a benchmark run (rich), or plain lines when not on a terminal.

Shows the run's elapsed time and load average, the current mode and phase with its
counters (written / received, rate), a bar when the total is known, and one line per
finished measurement. On a non-terminal (CI, the smoke test) it prints a line per phase
and per result instead of redrawing. Must not: measure anything.
"""

from __future__ import annotations

import os
import time
from types import TracebackType
from typing import Self

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from benchmarks.noise import NoiseMeter


class Progress:
    """What the run is doing now, and what it has found so far."""

    def __init__(self, title: str, console: Console | None = None,
                 meter: NoiseMeter | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.meter = meter
        self.phases: list[dict[str, object]] = []  # every finished phase, with foreign CPU
        self._foreign_at_start = 0.0
        self.title = title
        self.started = time.monotonic()
        self.mode = ""
        self.phase_name = ""
        self.total: int | None = None
        self.done = 0
        self.received: int | None = None
        self._phase_started = time.monotonic()
        self._results: list[str] = []
        self._live: Live | None = None

    # -- lifecycle
    def __enter__(self) -> Self:
        if self.console.is_terminal:
            self._live = Live(get_renderable=self._render, console=self.console,
                              refresh_per_second=4, transient=False)
            self._live.start()
        else:
            self.console.print(self.title)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._close_phase()
        if self._live is not None:
            self._live.stop()
            self._live = None

    # -- updates
    def phase(self, mode: str, name: str, total: int | None = None) -> None:
        """A new phase starts (``total`` events expected, when known)."""
        self._close_phase()
        self._foreign_at_start = self.meter.foreign_s if self.meter else 0.0
        self.mode, self.phase_name, self.total = mode, name, total
        self.done, self.received = 0, None
        self._phase_started = time.monotonic()
        if self._live is None:
            self.console.print(f"[{self._clock()}] {mode}: {name}", highlight=False, soft_wrap=True)

    def phase_foreign(self) -> float:
        """CPU seconds other processes used since the current phase started."""
        return round(self.meter.foreign_s - self._foreign_at_start, 2) if self.meter else 0.0

    def _close_phase(self) -> None:
        if self.phase_name:
            self.phases.append({"mode": self.mode, "phase": self.phase_name,
                                "seconds": round(time.monotonic() - self._phase_started, 2),
                                "foreign_cpu_s": self.phase_foreign()})
            self.phase_name = ""

    def update(self, done: int, received: int | None = None) -> None:
        """Counters of the current phase: events done (written/sent), events received."""
        self.done, self.received = done, received

    def result(self, line: str) -> None:
        """A finished measurement, kept on screen."""
        self._results.append(line)
        if self._live is None:
            self.console.print(f"[{self._clock()}]   {line}", highlight=False, soft_wrap=True)

    # -- rendering
    def _clock(self) -> str:
        seconds = int(time.monotonic() - self.started)
        return f"{seconds // 60:d}:{seconds % 60:02d}"

    def _render(self) -> Group:
        load = os.getloadavg()[0]
        noise = f"   other processes {self.phase_foreign():.1f} CPU s" if self.meter else ""
        head = Text(f"{self.title}   elapsed {self._clock()}   load {load:.2f}{noise}", style="bold")
        elapsed = max(time.monotonic() - self._phase_started, 1e-6)
        counters = f"{self.done:,}" + (f" / {self.total:,}" if self.total else "")
        if self.received is not None:
            counters += f"   received {self.received:,}"
        rate = (self.received if self.received is not None else self.done) / elapsed
        now = Text(f"{self.mode}  {self.phase_name}   {counters}   {rate:,.0f}/s   "
                   f"{elapsed:.1f} s", style="cyan")
        parts: list[Text | ProgressBar | Table] = [head, now]
        if self.total:
            shown = self.received if self.received is not None else self.done
            parts.append(ProgressBar(total=self.total, completed=min(shown, self.total), width=60))
        table = Table.grid(padding=(0, 1))
        for line in self._results[-20:]:
            table.add_row(Text(line))
        parts.append(table)
        return Group(*parts)
