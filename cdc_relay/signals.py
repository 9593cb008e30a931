"""Signal handling shared by the commands that run until stopped (``run``, ``poll``).

Owns what SIGTERM and SIGINT mean: the first asks for a graceful stop (the loop
flushes the sink and confirms what was acknowledged), the second exits at once. Must
not know either mode: it only sets the ``threading.Event`` the mode's loop watches.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

from cdc_relay.errors import ExitCode

log = logging.getLogger("cdc_relay")


def install_signal_handlers(stop: threading.Event) -> None:
    """First SIGTERM/SIGINT: stop gracefully (flush, confirm). Second: exit at once."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.warning("%s again: exiting now without flushing", name)
            os._exit(ExitCode.INTERRUPTED)
        log.info("%s: stopping (flushing and confirming; send it again to exit at once)", name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
