"""Logging setup: text or JSON lines, secrets masked, event fields on event-level lines.

Owns the root handler configuration and the record fields convention: event-level lines
pass ``extra=event_fields(event)`` so that every such line carries ``event_id``,
``event_type``, ``aggregate_id`` and ``attempt`` (docs/design.md, observability); lifecycle lines pass slot,
LSNs and counts the same way. It must not be imported for side effects: nothing is
configured until ``setup_logging`` is called by the composition root.

The "one line" promise under failure: the broker clients' own loggers (pika, nats,
asyncio) are quieted below debug level - the relay's own line names the cause and the fix
- and a warning or error repeated while a service is down (same logger, same text but
for its numbers) is written three times, then once per minute with a count of the repeats
(``RepeatFilter``). Lines about one event (``event_id``) are never held back.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import orjson

from cdc_relay.errors import mask_secrets
from cdc_relay.model import InFlight

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))
) | {"message", "asctime", "taskName"}


def event_fields(event: InFlight) -> dict[str, Any]:
    """The fields an event-level log line carries."""
    return {
        "event_id": event.id,
        "event_type": event.event_type,
        "aggregate_id": event.aggregate_id,
        "attempt": event.attempt,
    }


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, extras, exc (masked)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": mask_secrets(record.getMessage()),
        }
        for key, value in _extras(record).items():
            entry[key] = mask_secrets(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exc"] = mask_secrets(self.formatException(record.exc_info))
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """Human-readable lines; extras appended as key=value, secrets masked."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return mask_secrets(line)


_DIGITS = re.compile(r"\d+")
# Broker clients whose own lines repeat what the relay's line says, with object reprs.
CLIENT_LOGGERS = ("pika", "nats", "asyncio")


class RepeatFilter(logging.Filter):
    """Writes a repeated warning or error ``burst`` times per ``window`` s, then holds it
    back; the first one after the window says how many were held (``repeated``).

    Repeats are lines of one logger and level whose text is the same but for its numbers
    (a generation, a delay, a port). Event-level lines (``event_id``) always pass.
    """

    def __init__(self, window: float = 60.0, burst: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window = window
        self.burst = burst
        self._clock = clock
        # key -> (window start, lines written in it, lines held back in it)
        self._seen: dict[tuple[str, int, str], tuple[float, int, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or hasattr(record, "event_id"):
            return True
        key = (record.name, record.levelno, _DIGITS.sub("#", record.getMessage()))
        now = self._clock()
        with self._lock:
            start, written, held = self._seen.get(key, (-self.window, 0, 0))
            if now - start < self.window:
                if written >= self.burst:
                    self._seen[key] = (start, written, held + 1)
                    return False
                self._seen[key] = (start, written + 1, held)
                return True
            if len(self._seen) > 1024:
                self._seen.clear()
            self._seen[key] = (now, 1, 0)
        if held:
            record.repeated = held  # an extra: text "repeated=N", JSON "repeated": N
        return True


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr, with repeats held back at the last moment: a record another filter holds
    (and hands over later) is judged when it is finally written, not twice."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.repeats = RepeatFilter()

    def emit(self, record: logging.LogRecord) -> None:
        if self.repeats.filter(record):
            super().emit(record)


DEFERRED_WARNINGS: list[str] = []  # said before logging was set up (e.g. by the config file)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger on stderr; route warnings and uncaught errors through it."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.CRITICAL)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit and args.exc_value is not None:
            exc: tuple[type[BaseException], BaseException, TracebackType | None] = (
                args.exc_type, args.exc_value, args.exc_traceback)
            logging.getLogger("cdc_relay").error(
                "uncaught error in thread %s", getattr(args.thread, "name", "?"), exc_info=exc
            )

    threading.excepthook = thread_hook
    while DEFERRED_WARNINGS:
        logging.getLogger("cdc_relay.config").warning("%s", DEFERRED_WARNINGS.pop(0))
