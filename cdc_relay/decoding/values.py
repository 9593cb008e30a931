"""The text-to-value conversions both WAL decoders share.

Owns: ``text_value`` (a wal2json column value as PostgreSQL's text of it) and
``TimestampParser`` (``created_at`` text -> epoch milliseconds), so that wal2json
(decoding/wal2json.py) and pgoutput (decoding/pgoutput.py) yield identical events for
the same row. The compiled decoders parse their rows' ``created_at`` in C themselves
(decoding/_ctimestamp.h, included by both; docs/design.md, "The compiled decoders",
"Timestamps"); a row whose text they decline takes their pure path, and so this parser,
the definition that C parse is tested against.

Must not: do I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["TimestampParser", "text_value"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_INFINITIES = ("infinity", "-infinity")


def text_value(value: object) -> str | None:
    """A column value as PostgreSQL's text output, or None when it is not text-like.

    ``str`` is returned as is; an ``int`` (a bigint id arriving as a JSON number) becomes
    its decimal text, which is what PostgreSQL prints. Anything else (bool, float, NULL,
    an object) returns None, for the caller to report.
    """
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    return None


class TimestampParser:
    """``timestamptz`` text (ISO DateStyle) -> epoch milliseconds, floor-rounded.

    Accepts any ISO offset PostgreSQL prints (``+00``, ``+05:30``, ``+05:53:28``), 0-6
    fractional digits, and a value without offset (a ``timestamp`` column), which is
    taken as UTC. ``infinity`` / ``-infinity`` give None (the message then gets the
    broker's time). Remembers the last text: all rows of one transaction usually share
    ``now()``, so most calls are one string comparison.
    """

    __slots__ = ("_last_ms", "_last_text")

    def __init__(self) -> None:
        self._last_text: str | None = None
        self._last_ms: int | None = None

    def parse(self, text: str) -> int | None:
        """Return epoch ms; raise ValueError (with a hint) for anything unparseable."""
        if text == self._last_text:
            return self._last_ms
        ms: int | None = None
        if text not in _INFINITIES:
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                raise ValueError(
                    f"unparseable timestamp {text!r} (the replication session must use "
                    "DateStyle=ISO; BC dates and years past 9999 are not supported)"
                ) from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            ms = (moment - _EPOCH) // _ONE_MS
        self._last_text = text
        self._last_ms = ms
        return ms

