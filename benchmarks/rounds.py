"""Several rounds of one run folded into medians with their spread.

A full run measures everything ``--rounds`` times (3 by default). ``fold`` turns the
rounds' entries into one entry per measurement (a mode at a backlog size, a mode at a
rate, a broker floor, a limit): every numeric field becomes the **median** of the
rounds, with ``<field>_min`` and ``<field>_max`` beside it, and ``rounds`` says how many
rounds it had. Lists (latency CDFs) are taken from the round whose p50 is the median.
Pure: takes dicts, returns dicts; nothing here measures.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

Entry = dict[str, Any]
_IDENTITY = ("mode", "events", "rate_eps", "producer_linger_ms", "events_per_txn")


def _key(entry: Entry) -> tuple[Any, ...]:
    return tuple(entry.get(k) for k in _IDENTITY)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fold_entries(rounds: Sequence[Sequence[Entry]]) -> list[Entry]:
    """One entry per identity (mode, events, rate, …), in first-seen order."""
    groups: dict[tuple[Any, ...], list[Entry]] = {}
    for entries in rounds:
        for entry in entries:
            groups.setdefault(_key(entry), []).append(entry)
    return [fold_group(group) for group in groups.values()]


def fold_group(group: Sequence[Entry]) -> Entry:
    """Medians with min/max of one measurement's rounds."""
    ordered = sorted(group, key=lambda e: e.get("p50_ms") or e.get("eps") or 0.0)
    middle = ordered[(len(ordered) - 1) // 2]
    folded: Entry = {"rounds": len(group)}
    for field in _fields(group):
        values = [e[field] for e in group if field in e]
        if field in _IDENTITY or not values:
            folded[field] = values[0] if values else None
        elif all(_numeric(v) for v in values):
            folded[field] = _median(values)
            if len(values) > 1:
                folded[f"{field}_min"] = min(values)
                folded[f"{field}_max"] = max(values)
        else:
            folded[field] = middle.get(field, values[0])
    return folded


def fold_limits(rounds: Sequence[dict[str, Entry]]) -> dict[str, Entry]:
    """``{size: {limit: value}}`` of every round → the same shape, folded."""
    sizes: dict[str, list[Entry]] = {}
    for limits in rounds:
        for size, values in limits.items():
            sizes.setdefault(size, []).append(values)
    return {size: fold_group(group) for size, group in sizes.items()}


def _fields(group: Iterable[Entry]) -> list[str]:
    return list(dict.fromkeys(k for e in group for k in e))


def _median(values: Sequence[int | float]) -> int | float:
    """The median; counts stay integers (the lower middle of an even number of rounds)."""
    if all(isinstance(v, int) for v in values):
        return int(statistics.median_low(values))
    return round(float(statistics.median(values)), 3)
