"""PostgreSQL's text forms of dates, times, timestamps and intervals, as Debezium's numbers.

Owns parsing what pgoutput sends (the output functions' ISO forms, ``DateStyle`` ISO and
``IntervalStyle`` postgres, which the walsender uses unless the server's defaults were
changed) and turning it into Debezium's values under ``time.precision.mode=adaptive``:
days since the epoch, microseconds of the day, microseconds since the epoch (a proleptic
Gregorian calendar, BC years included), ISO-8601 text in UTC for ``timestamptz``, and
``MicroDuration`` with Debezium's arithmetic (a month is 30.4375 days, computed in doubles
exactly as Debezium computes it, so the rounding is the same).

The infinities are written as Debezium writes them: the PostgreSQL JDBC driver's
constants for timestamps, ``"infinity"`` for ``timestamptz``, and the driver's values
for dates (docs/table-cdc.md, types).

Pure; must not do I/O. Every parser raises ValueError for text it does not read.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = [
    "date_days",
    "interval_iso",
    "interval_micros",
    "time_micros",
    "timestamp_micros",
    "timestamptz_text",
    "timetz_text",
]

TIMESTAMP_INFINITY = 9223372036825200000  # PGStatement.DATE_POSITIVE_INFINITY
TIMESTAMP_MINUS_INFINITY = -9223372036832400000
DATE_INFINITY = -2147472692  # what Debezium writes for 'infinity'::date
DATE_MINUS_INFINITY = -2147472691
_DAY_US = 86_400_000_000
_DAYS_PER_MONTH = 365.25 / 12  # MicroDuration.DAYS_PER_MONTH_AVG

_DATE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)")
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_OFFSET = re.compile(r"([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?")
_INTERVAL_UNIT = re.compile(r"([+-]?\d+) (year|mon|day)s?")
_INTERVAL_TIME = re.compile(r"([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """The inverse of ``days_from_civil``."""
    days += 719468
    era = days // 146097
    doe = days - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (month <= 2), month, day


def _date(text: str) -> tuple[int, int]:
    """(days since the epoch, the position after the date) of ``YYYY-MM-DD[ BC]``."""
    match = _DATE.match(text)
    if match is None:
        raise ValueError(f"not a date: {text!r}")
    year, month, day = (int(part) for part in match.groups())
    if text.endswith(" BC"):
        year = 1 - year
    return days_from_civil(year, month, day), match.end()


def _fraction(digits: str | None) -> int:
    return int((digits or "").ljust(6, "0"))


def date_days(text: str) -> int:
    """``date`` text → days since 1970-01-01 (``io.debezium.time.Date``)."""
    if text == "infinity":
        return DATE_INFINITY
    if text == "-infinity":
        return DATE_MINUS_INFINITY
    days, end = _date(text)
    if text[end:] not in ("", " BC"):
        raise ValueError(f"not a date: {text!r}")
    return days


def time_micros(text: str) -> int:
    """``time`` text → microseconds of the day (``24:00:00`` is a whole day)."""
    match = _TIME.fullmatch(text)
    if match is None:
        raise ValueError(f"not a time: {text!r}")
    hours, minutes, seconds = (int(part) for part in match.groups()[:3])
    return ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + _fraction(match.group(4))


def _timestamp(text: str) -> tuple[int, int]:
    """(microseconds since the epoch as written, the position after the time)."""
    days, end = _date(text)
    if text[end : end + 1] != " ":
        raise ValueError(f"not a timestamp: {text!r}")
    match = _TIME.match(text, end + 1)
    if match is None:
        raise ValueError(f"not a timestamp: {text!r}")
    hours, minutes, seconds = (int(part) for part in match.groups()[:3])
    micros = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000 + _fraction(match.group(4))
    return days * _DAY_US + micros, match.end()


def timestamp_micros(text: str) -> int:
    """``timestamp`` text → microseconds since the epoch, read as UTC."""
    if text == "infinity":
        return TIMESTAMP_INFINITY
    if text == "-infinity":
        return TIMESTAMP_MINUS_INFINITY
    micros, end = _timestamp(text)
    if text[end:] not in ("", " BC"):
        raise ValueError(f"not a timestamp: {text!r}")
    return micros


def timestamptz_text(text: str, digits: int) -> str:
    """``timestamptz`` text (any offset) → ISO-8601 in UTC with ``digits`` fraction digits
    and ``Z`` (``io.debezium.time.ZonedTimestamp``)."""
    if text in ("infinity", "-infinity"):
        return text
    micros, end = _timestamp(text)
    match = _OFFSET.match(text, end)
    if match is None or text[match.end():] not in ("", " BC"):
        raise ValueError(f"not a timestamptz: {text!r}")
    sign, hours, minutes, seconds = match.groups()
    offset = (int(hours) * 3600 + int(minutes or 0) * 60 + int(seconds or 0)) * 1_000_000
    micros -= offset if sign == "+" else -offset
    days, rest = divmod(micros, _DAY_US)
    year, month, day = civil_from_days(days)
    second, fraction = divmod(rest, 1_000_000)
    minute, second = divmod(second, 60)
    hour, minute = divmod(minute, 60)
    year_text = f"{year:04d}" if 0 <= year <= 9999 else f"{year:+05d}"
    out = f"{year_text}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    if digits > 0:
        out += "." + f"{fraction:06d}"[:digits].ljust(digits, "0")
    return out + "Z"


def timetz_text(text: str, *, fraction: bool = True) -> str:
    """``timetz`` text → the time of day in UTC, ISO-8601 with the fraction's significant
    digits and ``Z`` (``io.debezium.time.ZonedTime``; ``24:00:00+00`` is ``00:00:00Z``);
    without ``fraction``, whole seconds (Debezium's form of an array's element)."""
    match = _TIME.match(text)
    offset = None if match is None else _OFFSET.fullmatch(text, match.end())
    if match is None or offset is None:
        raise ValueError(f"not a timetz: {text!r}")
    hours, minutes, seconds = (int(part) for part in match.groups()[:3])
    micros = ((hours * 60 + minutes) * 60 + seconds) * 1_000_000
    if fraction:
        micros += _fraction(match.group(4))
    sign, off_h, off_m, off_s = offset.groups()
    shift = (int(off_h) * 3600 + int(off_m or 0) * 60 + int(off_s or 0)) * 1_000_000
    micros = (micros - (shift if sign == "+" else -shift)) % _DAY_US
    second, part = divmod(micros, 1_000_000)
    minute, second = divmod(second, 60)
    hour, minute = divmod(minute, 60)
    digits = f".{part:06d}".rstrip("0") if part else ""
    return f"{hour:02d}:{minute:02d}:{second:02d}{digits}Z"


def _interval_parts(text: str) -> tuple[int, int, int, int, int, int]:
    """(years, months, days, hours, minutes, microseconds of the seconds) of ``interval``
    text, each with its own sign as PostgreSQL prints it."""
    years = months = days = hours = minutes = micros = 0
    rest = text
    for match in _INTERVAL_UNIT.finditer(text):
        value = int(match.group(1))
        unit = match.group(2)
        if unit == "year":
            years = value
        elif unit == "mon":
            months = value
        else:
            days = value
        rest = rest.replace(match.group(0), "", 1)
    rest = rest.strip()
    if rest:
        clock = _INTERVAL_TIME.fullmatch(rest)
        if clock is None:
            raise ValueError(f"not an interval: {text!r}")
        hours, minutes = int(clock.group(2)), int(clock.group(3))
        micros = int(clock.group(4)) * 1_000_000 + _fraction(clock.group(5))
        if clock.group(1) == "-":
            hours, minutes, micros = -hours, -minutes, -micros
    return years, months, days, hours, minutes, micros


def interval_micros(text: str) -> int:
    """``interval`` text (IntervalStyle postgres) → ``io.debezium.time.MicroDuration``."""
    years, months, days, hours, minutes, micros = _interval_parts(text)
    whole, fraction = divmod(abs(micros), 1_000_000)
    seconds = (whole + fraction / 1e6) * (-1 if micros < 0 else 1)  # Debezium's arithmetic
    number_of_days = (years * 12 + months) * _DAYS_PER_MONTH + days
    number_of_seconds = ((number_of_days * 24 + hours) * 60 + minutes) * 60 + seconds
    return int(number_of_seconds * 1e6)


def interval_iso(text: str) -> str:
    """``interval`` text → ``io.debezium.time.Interval`` (``interval.handling.mode=string``):
    ``P<y>Y<m>M<d>DT<h>H<m>M<s>S``, each part with its own sign, the seconds' trailing
    zeros dropped (``P1Y2M3DT4H5M6.789S``, ``P0Y0M0DT0H0M-0.000001S``)."""
    years, months, days, hours, minutes, micros = _interval_parts(text)
    seconds = format(Decimal(micros).scaleb(-6).normalize(), "f") if micros else "0"
    return f"P{years}Y{months}M{days}DT{hours}H{minutes}M{seconds}S"
