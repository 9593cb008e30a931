/* The compiled created_at parse, shared by the compiled decoders (docs/design.md, "The
 * compiled decoders", "Timestamps").
 *
 * Owns ts_epoch_ms(): the epoch milliseconds of a timestamp text in exactly the shapes
 * PostgreSQL's ISO DateStyle prints for timestamptz and timestamp -
 * ``YYYY-MM-DD HH:MM:SS``, then optionally ``.`` and 1-6 fractional digits, then
 * optionally an offset ``+HH``, ``+HH:MM`` or ``+HH:MM:SS`` (or ``-``); no offset is UTC -
 * floor-rounded as cdc_relay/decoding/values.py's pure path computes
 * ``(moment - EPOCH) // 1 ms``. Every field is range-checked as datetime checks it
 * (years 1-9999, real calendar days, hours 0-23, minutes and seconds 0-59, offsets
 * below 24 h with minutes and seconds 0-59), so an accepted text is one
 * ``datetime.fromisoformat`` reads to the same moment.
 *
 * A header, not an extension of its own: included (after Python.h) by _coutbox.h, through
 * which both compiled decoders parse created_at themselves - one copy of the code,
 * compiled into each decoder (setup.py lists it in ``depends``). Its tests go through the
 * decoders (tests/unit/test_decoding_timestamps.py, and the decoders' fuzz targets).
 *
 * Must not: touch Python objects, word an error, or accept a shape the pure path might
 * read differently. Everything else (infinity, BC, 5-digit years, a 'T', 'Z', offsets
 * without colons, 7+ fractional digits, trailing text, non-ASCII bytes) is declined, and
 * the caller then leaves the text to the pure path: None for infinity, its ValueError and
 * hint for the rest.
 */
#ifndef CDC_RELAY_CTIMESTAMP_H
#define CDC_RELAY_CTIMESTAMP_H

#include <stdint.h>

#define TS_BASE 19        /* "YYYY-MM-DD HH:MM:SS" */
#define TS_MAX_FRACTION 6 /* datetime keeps microseconds; fromisoformat drops further digits */
#define TS_MAX_TEXT 35    /* TS_BASE + ".ffffff" + "+HH:MM:SS": no accepted text is longer */
#define TS_US_PER_S INT64_C(1000000)

/* The value of n ASCII digits at p, or -1 if one is not a digit. */
static int ts_number(const char *p, int n)
{
    int value = 0;
    for (int i = 0; i < n; i++) {
        unsigned digit = (unsigned char)p[i] - (unsigned)'0';
        if (digit > 9)
            return -1;
        value = value * 10 + (int)digit;
    }
    return value;
}

static int ts_days_in_month(int year, int month)
{
    static const unsigned char days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (month == 2 && year % 4 == 0 && (year % 100 != 0 || year % 400 == 0))
        return 29;
    return days[month - 1];
}

/* Days from 1970-01-01 to a proleptic Gregorian date of year >= 1 (H. Hinnant's
 * days_from_civil; the shifted year is never negative here). */
static int64_t ts_days_from_civil(int year, int month, int day)
{
    int y = year - (month <= 2);
    int era = y / 400;
    int yoe = y - era * 400;
    int doy = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1;
    int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return (int64_t)era * 146097 + doe - 719468;
}

/* Microseconds of ".F" (1-6 digits) at *pos, advancing it; 0 if there is none; -1: decline. */
static int64_t ts_fraction(const char *s, Py_ssize_t len, Py_ssize_t *pos)
{
    if (*pos >= len || s[*pos] != '.')
        return 0;
    Py_ssize_t start = ++*pos;
    int64_t us = 0;
    while (*pos < len && (unsigned)((unsigned char)s[*pos] - '0') <= 9) {
        if (*pos - start == TS_MAX_FRACTION)
            return -1;
        us = us * 10 + (s[*pos] - '0');
        ++*pos;
    }
    Py_ssize_t digits = *pos - start;
    if (digits == 0)
        return -1;
    for (Py_ssize_t i = digits; i < TS_MAX_FRACTION; i++)
        us *= 10;
    return us;
}

/* The offset "+HH[:MM[:SS]]" from pos to the end, in seconds east of UTC, into *out;
 * 0 if there is none. Returns 0 when accepted, -1 to decline. */
static int ts_offset(const char *s, Py_ssize_t len, Py_ssize_t pos, int *out)
{
    *out = 0;
    if (pos == len)
        return 0;
    if (s[pos] != '+' && s[pos] != '-')
        return -1;
    int sign = s[pos] == '-' ? -1 : 1;
    Py_ssize_t rest = len - pos - 1;
    if (rest != 2 && rest != 5 && rest != 8)
        return -1;
    const char *p = s + pos + 1;
    int hours = ts_number(p, 2), minutes = 0, seconds = 0;
    if (rest >= 5 && (p[2] != ':' || (minutes = ts_number(p + 3, 2)) < 0))
        return -1;
    if (rest == 8 && (p[5] != ':' || (seconds = ts_number(p + 6, 2)) < 0))
        return -1;
    if (hours < 0 || hours > 23 || minutes > 59 || seconds > 59)
        return -1;
    *out = sign * (hours * 3600 + minutes * 60 + seconds);
    return 0;
}

/* Microseconds since the epoch of an accepted text into *out; 0 accepted, -1 declined. */
static int ts_epoch_us(const char *s, Py_ssize_t len, int64_t *out)
{
    if (len < TS_BASE || len > TS_MAX_TEXT || s[4] != '-' || s[7] != '-' || s[10] != ' '
        || s[13] != ':' || s[16] != ':')
        return -1;
    int year = ts_number(s, 4), month = ts_number(s + 5, 2), day = ts_number(s + 8, 2);
    int hour = ts_number(s + 11, 2), minute = ts_number(s + 14, 2);
    int second = ts_number(s + 17, 2);
    if (year < 1 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23
        || minute < 0 || minute > 59 || second < 0 || second > 59)
        return -1;
    if (day > ts_days_in_month(year, month))
        return -1;
    Py_ssize_t pos = TS_BASE;
    int64_t us = ts_fraction(s, len, &pos);
    int east;
    if (us < 0 || ts_offset(s, len, pos, &east) < 0)
        return -1;
    int64_t seconds = ts_days_from_civil(year, month, day) * 86400 + hour * 3600
                      + minute * 60 + second - east;
    *out = seconds * TS_US_PER_S + us; /* |value| < 2.6e17: no overflow */
    return 0;
}

/* The epoch milliseconds, floor-rounded, of an accepted text into *ms; 0 accepted, -1
 * declined. */
static int ts_epoch_ms(const char *s, Py_ssize_t len, int64_t *ms)
{
    int64_t us;
    if (ts_epoch_us(s, len, &us) < 0)
        return -1;
    *ms = us / 1000;
    if (us % 1000 < 0)
        *ms -= 1; /* C truncates toward zero; the pure path floors */
    return 0;
}

#endif /* CDC_RELAY_CTIMESTAMP_H */
