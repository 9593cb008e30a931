"""``cdc-relay demo``: the click command only (the run itself is cdc_relay.app.demo).

Registered on the ``cli`` group by cdc_relay.cli.main. Exit codes: 0 when every event arrived,
1 when one was lost or the demo failed, 130 on Ctrl-C (after stopping everything).
"""

from __future__ import annotations

import shutil
import sys
import time

import click

from cdc_relay.cli.options import option, plugin_option
from cdc_relay.errors import ExitCode


class StatusLine:
    """The live progress line: redrawn in place on a terminal, a line a second otherwise."""

    def __init__(self) -> None:
        self.live = sys.stdout.isatty()
        self.width = max(40, shutil.get_terminal_size().columns - 1)
        self._last = 0.0

    def __call__(self, line: str) -> None:
        """Show ``line``; an empty line ends the live display."""
        if self.live:
            click.echo("\r" + line[: self.width].ljust(self.width), nl=not line)
        elif line and time.monotonic() - self._last >= 1.0:
            click.echo(line)
            self._last = time.monotonic()


@click.command()
@option("--events", type=click.IntRange(1), default=1_000, show_default=True,
        help="Events to write (every order is placed, paid and shipped: 3 events).")
@option("--rate", type=click.FloatRange(0.1, 10_000), default=50.0, show_default=True,
        help="Events written per second (the defaults run ~20 s).")
@option("--mode", type=click.Choice(["wal", "poll"]), default="wal", show_default=True,
        help="Relay mode: WAL (cdc-relay run) or polling (cdc-relay poll).")
@plugin_option
def demo(events: int, rate: float, mode: str, plugin: str | None) -> int:
    """Throwaway PostgreSQL + local broker + the relay + sample orders, with live latency."""
    from cdc_relay.app.demo import DemoConfig, run_demo

    try:
        summary = run_demo(DemoConfig(events=events, rate=rate, mode=mode,
                                           plugin=plugin or "pgoutput"),
                           echo=click.echo, status=StatusLine())
    except KeyboardInterrupt:  # run_demo has stopped everything it started
        click.echo("cdc-relay demo: interrupted", err=True)
        return ExitCode.INTERRUPTED
    if not summary.ok:
        click.echo(f"cdc-relay demo: {summary.lost:,} event(s) lost", err=True)
        return ExitCode.FAILURE
    return ExitCode.OK
