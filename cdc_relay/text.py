"""Text for people: error reasons and cells shortened to one bounded line.

Owns the one way the relay shortens text it shows or stores - a broker's or the
database's error in ``last_error``, a dead letter's ``error`` header, an over-long topic
name in a message, a table cell in ``dead-letters list``: whitespace runs (newlines
included) become one space, and text over the limit is cut and ends with "…".

Pure: no I/O, no driver imports. It must not mask secrets (errors.mask_secrets does that)
or know where the text goes.
"""

from __future__ import annotations

ELLIPSIS = "…"


def one_line(text: str) -> str:
    """``"broker\\n  said   no"`` -> ``"broker said no"``."""
    return " ".join(text.split())


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters; a cut one ends with "…"."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    line = one_line(text)
    return line if len(line) <= limit else line[: limit - 1] + ELLIPSIS
