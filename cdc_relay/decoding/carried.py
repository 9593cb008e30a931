"""wal2json's plan for the carried columns: ``--header`` / ``--partition-column`` columns and
the optional ``traceparent`` / ``tracestate``, found by name in a v2 row's column list.

Owns one cached name -> position plan, kept apart from the decoder's plan for the six
mapped columns so the common case (nothing carried, no trace columns) costs one length
comparison per row and a look at each column's name. The plan is rebuilt when the row's
column count changes, a name at a remembered position changes, or an optional (trace)
column the plan lacks appears anywhere - by a rename that keeps the count (DDL) - so a
trace column added or renamed into place while streaming is found.

The compiled fast path (decoding/_cwal2json.c) reads the same plan: ``plan`` and ``ncols``
are public for it, and a row it takes has the column count, at every planned position the
name this plan expects, and at no other position the name of a carried column the plan
lacks, so ``fill`` would not have rebuilt it.

Pure; must not do I/O. ``fill`` reports a problem instead of raising, so the decoder
words the DecodeError like its other ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc_relay.model import TRACE_COLUMNS, OutboxEvent


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()  # a column absent from the row (the decoders' shared marker)


class CarriedPlan:
    """Where the carried columns sit in the last row seen (see the module docstring)."""

    __slots__ = ("_absent", "_count", "_names", "_text", "ncols", "plan")

    def __init__(self, extra_columns: tuple[str, ...],
                 text_value: Callable[[object], str | None]) -> None:
        self._text = text_value  # a JSON value -> PostgreSQL's text of it (wal2json.text_value)
        self._count = len(extra_columns)  # named extras: required
        self._names = (*extra_columns, *TRACE_COLUMNS)  # trace columns: optional
        # Positions of the names (-1: absent), () when there is nothing to read; replaced,
        # never changed in place (the compiled path caches it by identity).
        self.plan: tuple[int, ...] = ()
        self.ncols = -1  # the column count the plan is for (-1: none yet)
        # The optional names the plan has no position for: one appearing means a replan.
        self._absent = frozenset(TRACE_COLUMNS)

    @property
    def active(self) -> bool:
        """Whether rows of the current shape have anything to read."""
        return bool(self.plan)

    def appeared(self, columns: Any) -> bool:
        """Whether a carried column the plan lacks is in ``columns`` (a rename, same count).
        Columns that are no object with a text "name" are left alone, as before: the
        decoder reads only the planned ones (and the compiled Reader skips the others)."""
        absent = self._absent
        try:
            return any(type(column) is dict and type(name := column.get("name")) is str
                       and name in absent for column in columns)
        except TypeError:
            return False  # no list: the decoder words it

    def fill(self, event: OutboxEvent, columns: Any) -> tuple[str | None, object] | None:
        """Set ``event.extra`` and its trace context.

        On a problem, return (column, its bad value or MISSING); (None, None) when the
        column list itself is malformed.
        """
        try:
            return self._fill(event, columns)
        except (KeyError, TypeError, IndexError):
            return (None, None)

    def _fill(self, event: OutboxEvent, columns: Any) -> tuple[str | None, object] | None:
        names, plan = self._names, self.plan
        if len(columns) != self.ncols or (plan and not all(
            i < 0 or columns[i]["name"] == name for i, name in zip(plan, names, strict=True)
        )) or self.appeared(columns):
            index = {column["name"]: i for i, column in enumerate(columns)}
            plan = tuple(index.get(name, -1) for name in names)
            for name, i in zip(names[: self._count], plan, strict=False):
                if i < 0:
                    return (name, MISSING)
            self.plan = plan if any(i >= 0 for i in plan) else ()
            self.ncols = len(columns)
            self._absent = frozenset(n for n, i in zip(names, plan, strict=True) if i < 0)
            if not self.plan:
                return None
        values = []
        for name, i in zip(names, plan, strict=True):
            raw = None if i < 0 else columns[i]["value"]
            text = None if raw is None else self._text(raw)
            if text is None and raw is not None:
                return (name, raw)
            values.append(text)
        count = self._count
        event.extra = tuple(values[:count])
        event.traceparent, event.tracestate = values[count], values[count + 1]
        return None
