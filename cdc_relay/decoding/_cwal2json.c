/* _cwal2json: the compiled fast path of the wal2json decoder (docs/design.md, "The
 * compiled decoders").
 *
 * Owns ``Reader.row``: one scan of a wal2json format-version-2 message that returns the
 * finished OutboxEvent of the common outbox insert - the six mapped values, created_at
 * parsed (_coutbox.h), and its carried columns' texts (the ``--header`` /
 * ``--partition-column`` extras and the trace context, read at the positions of
 * decoding/carried.py's plan) - or None for anything else. It validates the whole
 * document (JSON grammar, UTF-8, escapes, the number ranges orjson accepts) and accepts
 * only a subset of what orjson accepts, so that an accepted message gives exactly the
 * event decoding/wal2json.py's pure path would give.
 *
 * Must not: raise for bad input (bad input is declined, and the pure path then reports
 * it), keep state between calls beyond a Reader's texts, its last plans and its last
 * created_at, or plan: the positions come from the pure decoder, which rebuilds them on a
 * new row shape (a row where a carried column the plan lacks appears is declined, for it). Nor may it guess: whenever equivalence is not certain (an escaped key, a
 * duplicate key that matters, a lone surrogate, a number orjson might read as infinity,
 * an integer outside the range orjson reads as int, a carried value that is neither
 * text, int nor null, a created_at the compiled parse does not read) it declines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_coutbox.h"

/* orjson's own limit is 1024; wal2json documents are 3 levels deep. */
#define MAX_DEPTH 64
#define NFIELDS 6
/* The carried columns end with the two trace context columns (model.TRACE_COLUMNS). */
#define NTRACE 2
/* Positions below this are looked up in a bit mask, the others by a walk of the slots. */
#define MASK_BITS 64
/* |value| < 10^(integer digits + exponent): at most 10^300 can never overflow a double. */
#define MAX_MAGNITUDE 300
/* Integers of up to 18 digits are always ints for orjson (it reads i64/u64). */
#define MAX_INT_DIGITS 18

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    int depth;
} Scan;

enum { K_OTHER = 0, K_STRING, K_INT, K_NULL };

/* A scanned value: for strings the raw content between the quotes, for ints the token. */
typedef struct {
    int kind;
    int escaped;
    const unsigned char *s;
    Py_ssize_t n;
} Value;

/* One column ``row`` reads: its name as UTF-8, where the plan puts it, what was found. */
typedef struct {
    const char *name;
    Py_ssize_t name_n;
    Py_ssize_t at; /* the position in "columns"; -1: not read (an absent carried column) */
    Value value;
    int found;
} Slot;

/* What ``row`` looks for: the table's names as UTF-8 and the slots: the six mapped
 * columns, the named extras, then the trace columns. */
typedef struct {
    const char *schema, *table;
    Py_ssize_t schema_n, table_n;
    Py_ssize_t nslots, nextras;
    Slot *slots;
    uint64_t planned; /* bit i: a slot is at position i (i < MASK_BITS) */
    Py_ssize_t nabsent; /* carried slots the plan has no position for (at -1) */
} Want;

static int parse_value(Scan *sc, Value *v);

static inline void skip_ws(Scan *sc)
{
    const unsigned char *p = sc->p, *end = sc->end;
    /* one comparison for the common case: wal2json writes no whitespace between tokens */
    while (p < end && *p <= ' ' && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    sc->p = p;
}

/* Expect one structural byte (after whitespace) and step over it. */
static inline int expect(Scan *sc, unsigned char c)
{
    if (sc->p < sc->end && *sc->p == c) { /* the common case: no whitespace before it */
        sc->p++;
        return 0;
    }
    skip_ws(sc);
    if (sc->p >= sc->end || *sc->p != c)
        return -1;
    sc->p++;
    return 0;
}

static int hex4(const unsigned char *p, const unsigned char *end)
{
    int v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of the well-formed UTF-8 sequence of a non-ASCII lead byte at p, or -1
 * (overlong forms, surrogates and code points past U+10FFFF are ill-formed). */
static int utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    Py_ssize_t left = end - p;
    unsigned char lo = 0x80, hi = 0xBF;
    int n;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    }
    else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    }
    else
        return -1;
    if (left < n || p[1] < lo || p[1] > hi)
        return -1;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return -1;
    return n;
}

/* The bytes among the 8 at p that need a look - a control character, a byte of a
 * multi-byte sequence, a quote or a backslash - marked by their high bit (0: none).
 * Exact up to the first marked byte: a subtraction's borrow can only mark bytes after
 * one that is marked already, and only the first is ever used. */
static inline uint64_t special8(const unsigned char *p)
{
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t v, quote, slash;
    memcpy(&v, p, sizeof v);
    quote = v ^ (ones * '"');
    slash = v ^ (ones * '\\');
    return (((v - ones * 0x20) & ~v) | ((quote - ones) & ~quote) | ((slash - ones) & ~slash)
            | v) & high;
}

/* How many bytes precede the first one special8 marked in ``mask`` (not 0). Where the
 * first byte in memory is not the lowest of the word, 0: the byte loop that follows
 * finds it. */
static inline int unmarked_prefix(uint64_t mask)
{
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return __builtin_ctzll(mask) >> 3;
#else
    (void)mask;
    return 0;
#endif
}

/* A string at sc->p (on its opening quote): validate it, record its raw content. */
static int scan_string(Scan *sc, Value *v)
{
    const unsigned char *p = sc->p + 1, *end = sc->end, *start = p;
    int escaped = 0;
    for (;;) {
        uint64_t marked = 0;
        while (end - p >= 8 && (marked = special8(p)) == 0)
            p += 8;
        if (marked)
            p += unmarked_prefix(marked);  /* straight to the byte that needs a look */
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        if (p >= end)
            return -1;
        unsigned char c = *p;
        if (c == '"')
            break;
        if (c < 0x20)
            return -1;
        if (c >= 0x80) {
            int n = utf8_len(p, end);
            if (n < 0)
                return -1;
            p += n;
            continue;
        }
        /* a backslash */
        escaped = 1;
        if (end - p < 2)
            return -1;
        c = p[1];
        if (c == 'u') {
            int u = hex4(p + 2, end);
            if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF))
                return -1;
            p += 6;
            if (u >= 0xD800 && u <= 0xDBFF) {
                /* a high surrogate must be followed by an escaped low one */
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u')
                    return -1;
                int low = hex4(p + 2, end);
                if (low < 0xDC00 || low > 0xDFFF)
                    return -1;
                p += 6;
            }
        }
        else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n'
                 || c == 'r' || c == 't')
            p += 2;
        else
            return -1;
    }
    v->kind = K_STRING;
    v->escaped = escaped;
    v->s = start;
    v->n = p - start;
    sc->p = p + 1;
    return 0;
}

/* The UTF-8 text of a validated string's content; ``out`` holds at least v->n bytes
 * (no escape decodes to more bytes than it is written with). */
static Py_ssize_t unescape(const Value *v, unsigned char *out)
{
    const unsigned char *p = v->s, *end = v->s + v->n;
    unsigned char *o = out;
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    while (p < end) {
        /* copy the run up to the next escape a word at a time: jsonb text escapes every
         * quote, so the runs are short and a memchr and a memcpy per run cost more. A
         * whole word is stored even when the escape is inside it: ``o`` never runs ahead
         * of ``p``'s offset, so the store stays within the ``v->n`` bytes of ``out``. */
        while (end - p >= 8) {
            uint64_t word, x, slash;
            memcpy(&word, p, sizeof word);
            x = word ^ (ones * '\\');
            slash = (x - ones) & ~x & high;
            memcpy(o, &word, sizeof word);
            if (slash) { /* the byte loop below steps to it where no prefix is known */
                int k = unmarked_prefix(slash);
                o += k;
                p += k;
                break;
            }
            o += 8;
            p += 8;
        }
        while (p < end && *p != '\\')
            *o++ = *p++;
        if (p >= end)
            break;
        unsigned char c = p[1];
        if (c != 'u') {
            switch (c) {
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            default: *o++ = c; break; /* " \ / */
            }
            p += 2;
            continue;
        }
        unsigned int cp = (unsigned int)hex4(p + 2, end);
        p += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned int)hex4(p + 2, end) - 0xDC00);
            p += 6;
        }
        if (cp < 0x80)
            *o++ = (unsigned char)cp;
        else if (cp < 0x800) {
            *o++ = (unsigned char)(0xC0 | (cp >> 6));
            *o++ = (unsigned char)(0x80 | (cp & 0x3F));
        }
        else if (cp < 0x10000) {
            *o++ = (unsigned char)(0xE0 | (cp >> 12));
            *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (unsigned char)(0x80 | (cp & 0x3F));
        }
        else {
            *o++ = (unsigned char)(0xF0 | (cp >> 18));
            *o++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
            *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (unsigned char)(0x80 | (cp & 0x3F));
        }
    }
    return o - out;
}

/* Whether a validated string's decoded text is ``want``; -1 on a memory error. */
static int string_equals(const Value *v, const char *want, Py_ssize_t want_n)
{
    if (!v->escaped)
        return v->n == want_n && memcmp(v->s, want, (size_t)want_n) == 0;
    if (v->n < want_n)
        return 0;
    unsigned char stack[256];
    unsigned char *buf = v->n <= (Py_ssize_t)sizeof stack ? stack : PyMem_Malloc((size_t)v->n);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = unescape(v, buf);
    int equal = n == want_n && memcmp(buf, want, (size_t)n) == 0;
    if (buf != stack)
        PyMem_Free(buf);
    return equal;
}

static inline int is_digit(const Scan *sc)
{
    return sc->p < sc->end && *sc->p >= '0' && *sc->p <= '9';
}

/* A number, by JSON's grammar; declined when orjson could read it as infinity. */
static int scan_number(Scan *sc, Value *v)
{
    const unsigned char *start = sc->p;
    if (*sc->p == '-')
        sc->p++;
    const unsigned char *digits = sc->p;
    if (!is_digit(sc))
        return -1;
    if (*sc->p == '0')
        sc->p++;
    else
        while (is_digit(sc))
            sc->p++;
    Py_ssize_t int_digits = sc->p - digits;
    int integer = 1;
    long exponent = 0;
    if (sc->p < sc->end && *sc->p == '.') {
        integer = 0;
        sc->p++;
        if (!is_digit(sc))
            return -1;
        while (is_digit(sc))
            sc->p++;
    }
    if (sc->p < sc->end && (*sc->p == 'e' || *sc->p == 'E')) {
        integer = 0;
        sc->p++;
        int negative = 0;
        if (sc->p < sc->end && (*sc->p == '+' || *sc->p == '-'))
            negative = *sc->p++ == '-';
        if (!is_digit(sc))
            return -1;
        int count = 0;
        while (is_digit(sc)) {
            if (++count > 4)
                return -1;
            exponent = exponent * 10 + (*sc->p++ - '0');
        }
        if (negative)
            exponent = -exponent;
    }
    if (int_digits + exponent > MAX_MAGNITUDE)
        return -1;
    v->kind = integer ? K_INT : K_OTHER;
    v->escaped = 0;
    v->s = start;
    v->n = sc->p - start;
    return 0;
}

static int scan_literal(Scan *sc, const char *word, size_t n)
{
    if ((size_t)(sc->end - sc->p) < n || memcmp(sc->p, word, n) != 0)
        return -1;
    sc->p += n;
    return 0;
}

/* A string at sc->p (on its opening quote) that is short and plain, as wal2json's keys
 * ("name", "value", "action", ...) and column names are: when the first byte of the next
 * two words that needs a look is the closing quote, the string is the bytes before it, as
 * scan_string would find - without the call. 1 when it read the string, 0 to leave it to
 * scan_string. */
static inline int plain_string(Scan *sc, Value *v)
{
    const unsigned char *start = sc->p + 1;
    Py_ssize_t left = sc->end - start;
    uint64_t marked = left >= 8 ? special8(start) : 0;
    int n = 0;
    if (marked == 0 && left >= 16) {
        marked = special8(start + 8);
        n = 8;
    }
    if (marked == 0)
        return 0;
    n += unmarked_prefix(marked);
    if (start[n] != '"')
        return 0;
    v->kind = K_STRING;
    v->escaped = 0;
    v->s = start;
    v->n = n;
    sc->p = start + n + 1;
    return 1;
}

/* A string (after whitespace) that is likely short and plain: a key, a column's name. */
static inline int scan_short_string(Scan *sc, Value *v)
{
    skip_ws(sc);
    if (sc->p >= sc->end || *sc->p != '"')
        return -1;
    return plain_string(sc, v) ? 0 : scan_string(sc, v);
}

/* An unescaped key (an escaped one is declined: it could spell a key that matters). */
static int scan_key(Scan *sc, Value *key)
{
    if (scan_short_string(sc, key) < 0 || key->escaped)
        return -1;
    return expect(sc, ':');
}

/* An object or array whose members are validated and skipped. */
static int skip_container(Scan *sc, unsigned char close)
{
    Value ignored;
    if (++sc->depth > MAX_DEPTH)
        return -1;
    sc->p++;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == close) {
        sc->p++;
        sc->depth--;
        return 0;
    }
    for (;;) {
        if (close == '}' && (scan_short_string(sc, &ignored) < 0 || expect(sc, ':') < 0))
            return -1;
        if (parse_value(sc, &ignored) < 0)
            return -1;
        skip_ws(sc);
        if (sc->p >= sc->end)
            return -1;
        if (*sc->p == close) {
            sc->p++;
            sc->depth--;
            return 0;
        }
        if (*sc->p++ != ',')
            return -1;
    }
}

/* Any JSON value (after whitespace); strings, ints and null are recorded in ``v``. */
static int parse_value(Scan *sc, Value *v)
{
    skip_ws(sc);
    if (sc->p >= sc->end)
        return -1;
    v->kind = K_OTHER;
    switch (*sc->p) {
    case '"':
        return scan_string(sc, v);
    case '{':
        return skip_container(sc, '}');
    case '[':
        return skip_container(sc, ']');
    case 't':
        return scan_literal(sc, "true", 4);
    case 'f':
        return scan_literal(sc, "false", 5);
    case 'n':
        v->kind = K_NULL;
        return scan_literal(sc, "null", 4);
    default:
        return scan_number(sc, v);
    }
}

static inline int key_is(const Value *key, const char *word)
{
    size_t n = strlen(word);
    return (size_t)key->n == n && memcmp(key->s, word, n) == 0;
}

/* After a member: 1 for ',', 0 for the closing byte, -1 otherwise. */
static inline int next_member(Scan *sc, unsigned char close)
{
    if (sc->p < sc->end && *sc->p > ' ') { /* the common case: no whitespace before it */
        unsigned char c = *sc->p++;
        return c == ',' ? 1 : c == close ? 0 : -1;
    }
    skip_ws(sc);
    if (sc->p >= sc->end)
        return -1;
    unsigned char c = *sc->p++;
    return c == ',' ? 1 : c == close ? 0 : -1;
}

/* A column the plan points at: {"name": <one of the wanted names>, "value": ...}. */
static int parse_column(Scan *sc, Want *w, Py_ssize_t index)
{
    Value key, name, value, ignored;
    int has_name = 0, has_value = 0, more;
    if (sc->p >= sc->end || *sc->p != '{' || ++sc->depth > MAX_DEPTH)
        return -1;
    sc->p++;
    do {
        if (scan_key(sc, &key) < 0)
            return -1;
        if (key_is(&key, "name")) {
            if (has_name++ || scan_short_string(sc, &name) < 0)
                return -1;
        }
        else if (key_is(&key, "value")) {
            if (has_value++ || parse_value(sc, &value) < 0)
                return -1;
        }
        else if (parse_value(sc, &ignored) < 0)
            return -1;
    } while ((more = next_member(sc, '}')) == 1);
    sc->depth--;
    if (more < 0 || !has_name || !has_value)
        return -1;
    /* several slots may share a column (a --header naming a mapped column) */
    for (Py_ssize_t k = 0; k < w->nslots; k++) {
        Slot *slot = &w->slots[k];
        if (slot->at != index)
            continue;
        int equal = string_equals(&name, slot->name, slot->name_n);
        if (equal <= 0)
            return -1;
        slot->value = value;
        slot->found = 1;
    }
    return 0;
}

/* Whether ``name`` (a string) is that of a carried column the plan has no position for:
 * 1, 0, or -1 on an error. */
static int absent_name(const Want *w, const Value *name)
{
    for (Py_ssize_t k = NFIELDS; k < w->nslots; k++) {
        const Slot *slot = &w->slots[k];
        if (slot->at >= 0)
            continue;
        int equal = string_equals(name, slot->name, slot->name_n);
        if (equal != 0)
            return equal;
    }
    return 0;
}

/* A column the plan does not point at: validated and skipped as any value, but when the
 * plan lacks a carried column (a trace column), an object with a "name" member that names
 * one is declined (-1): a rename that kept the column count, which the pure path replans
 * for (decoding/carried.py). A key spelled with escapes is taken for "name". */
static int skip_column(Scan *sc, const Want *w)
{
    Value key, value;
    int more;
    if (w->nabsent == 0 || sc->p >= sc->end || *sc->p != '{')
        return parse_value(sc, &value);
    if (++sc->depth > MAX_DEPTH)
        return -1;
    sc->p++;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == '}') {
        sc->p++;
        sc->depth--;
        return 0;
    }
    do {
        if (scan_short_string(sc, &key) < 0 || expect(sc, ':') < 0
            || parse_value(sc, &value) < 0)
            return -1;
        if (value.kind == K_STRING && (key.escaped || key_is(&key, "name"))
            && absent_name(w, &value) != 0)
            return -1;
    } while ((more = next_member(sc, '}')) == 1);
    sc->depth--;
    return more < 0 ? -1 : 0;
}

/* Whether a slot is at ``index``. */
static inline int planned_at(const Want *w, Py_ssize_t index)
{
    if (index < MASK_BITS)
        return (int)((w->planned >> index) & 1);
    for (Py_ssize_t k = 0; k < w->nslots; k++)
        if (w->slots[k].at == index)
            return 1;
    return 0;
}

/* The "columns" array; returns its length, or -1. */
static Py_ssize_t parse_columns(Scan *sc, Want *w)
{
    Py_ssize_t count = 0;
    int more;
    if (expect(sc, '[') < 0 || ++sc->depth > MAX_DEPTH)
        return -1;
    skip_ws(sc);
    if (sc->p < sc->end && *sc->p == ']') {
        sc->p++;
        sc->depth--;
        return 0;
    }
    do {
        skip_ws(sc);
        if ((planned_at(w, count) ? parse_column(sc, w, count) : skip_column(sc, w)) < 0)
            return -1;
        count++;
    } while ((more = next_member(sc, ']')) == 1);
    sc->depth--;
    return more < 0 ? -1 : count;
}

/* A top-level string member that must equal ``want``. */
static int match_string(Scan *sc, int *seen, const char *want, Py_ssize_t want_n)
{
    Value v;
    if ((*seen)++ || parse_value(sc, &v) < 0 || v.kind != K_STRING)
        return -1;
    return string_equals(&v, want, want_n) > 0 ? 0 : -1;
}

/* The whole document: 0 and the column count in *ncols when it is the insert wanted. */
static int scan_document(Scan *sc, Want *w, Py_ssize_t *ncols)
{
    Value key, ignored;
    int action = 0, schema = 0, table = 0, columns = 0, more;
    if (expect(sc, '{') < 0)
        return -1;
    do {
        if (scan_key(sc, &key) < 0)
            return -1;
        if (key_is(&key, "action")) {
            if (match_string(sc, &action, "I", 1) < 0)
                return -1;
        }
        else if (key_is(&key, "schema")) {
            if (match_string(sc, &schema, w->schema, w->schema_n) < 0)
                return -1;
        }
        else if (key_is(&key, "table")) {
            if (match_string(sc, &table, w->table, w->table_n) < 0)
                return -1;
        }
        else if (key_is(&key, "columns")) {
            if (columns++ || (*ncols = parse_columns(sc, w)) < 0)
                return -1;
        }
        else if (parse_value(sc, &ignored) < 0)
            return -1;
    } while ((more = next_member(sc, '}')) == 1);
    skip_ws(sc);
    if (more < 0 || sc->p != sc->end || !action || !schema || !table || !columns)
        return -1;
    /* every mapped column, and every carried one the plan places, must have been read */
    for (Py_ssize_t k = 0; k < w->nslots; k++)
        if (!w->slots[k].found && (k < NFIELDS || w->slots[k].at >= 0))
            return -1;
    return 0;
}

/* An escaped string's text as bytes (``as_bytes``) or str, unescaped through a buffer on
 * the stack unless it is long (the unescaped text is never longer than the escaped). */
static PyObject *unescaped(const Value *v, int as_bytes)
{
    unsigned char small[512], *buf = small;
    if (v->n > (Py_ssize_t)sizeof small && (buf = PyMem_Malloc((size_t)v->n)) == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = unescape(v, buf);
    PyObject *out = as_bytes ? PyBytes_FromStringAndSize((const char *)buf, n)
                             : PyUnicode_DecodeUTF8((const char *)buf, n, NULL);
    if (buf != small)
        PyMem_Free(buf);
    return out;
}

/* A required value as text (a string, or an int whose token is Python's str of it) in
 * *out: 0, or 1 to decline (another kind, or an int orjson may not read as this text),
 * or -1 on an error. */
static int text_of(const Value *v, int as_bytes, PyObject **out)
{
    if (v->kind == K_INT) {
        Py_ssize_t digits = v->n - (v->s[0] == '-');
        if (digits > MAX_INT_DIGITS || (v->n == 2 && v->s[0] == '-' && v->s[1] == '0'))
            return 1; /* "-0" is the int 0, whose text is "0" */
        *out = as_bytes ? PyBytes_FromStringAndSize((const char *)v->s, v->n)
                        : PyUnicode_FromStringAndSize((const char *)v->s, v->n);
    }
    else if (v->kind != K_STRING)
        return 1;
    else if (!v->escaped)
        *out = as_bytes ? PyBytes_FromStringAndSize((const char *)v->s, v->n)
                        : PyUnicode_DecodeUTF8((const char *)v->s, v->n, NULL);
    else
        *out = unescaped(v, as_bytes);
    return *out == NULL ? -1 : 0;
}

/* A carried value in *out: None where the plan has no column or the value is null, else
 * as ``text_of`` (declining what is neither text nor an int it can spell). */
static int carried_text(const Slot *slot, PyObject **out)
{
    if (slot->at < 0 || slot->value.kind == K_NULL) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    return text_of(&slot->value, 0, out);
}

/* A Reader: the texts one decoder looks for, as UTF-8, kept alive by ``texts``. */
typedef struct {
    PyObject_HEAD
    PyObject *texts;   /* (schema, table, *names, *extras, *trace) */
    PyObject *plan;    /* the plan tuples the slots' positions were read from (a cache) */
    PyObject *carried;
    Py_ssize_t ncols;  /* the column count the plans are for (-1: none yet), for row(2) */
    int timestamped;
    Want want;
    Outbox outbox;     /* the event class, and the last created_at */
} Reader;

/* The created_at_ms of the sixth slot into *out: 0, 1 to decline, -1 on an error. A
 * string is compared with the last one as its unescaped bytes, so a repeated text costs
 * no object; escapes are unescaped first (no accepted text needs more than 256 bytes to
 * be spelled, every character escaped as \u00XX). */
static int created_at_of(Reader *self, PyObject **out)
{
    const Value *v = &self->want.slots[NFIELDS - 1].value;
    /* without a created_at column the sixth slot only repeats the id column's check */
    if (!self->timestamped || v->kind == K_NULL) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (v->kind != K_STRING)
        return 1;
    int status;
    if (!v->escaped)
        status = outbox_created_at(&self->outbox, (const char *)v->s, v->n, out);
    else {
        unsigned char text[256];
        if (v->n > (Py_ssize_t)sizeof text)
            return 1;
        status = outbox_created_at(&self->outbox, (const char *)text, unescape(v, text), out);
    }
    return status < 0 ? -1 : status == 0;
}

/* The mapped values into fields[EV_ID..EV_PAYLOAD]: 0, 1 to decline, -1 on an error.
 * aggregate_type and event_type mostly repeat from row to row (outbox_repeated_text). */
static int build_mapped(Reader *self, PyObject **fields)
{
    const Want *w = &self->want;
    int status;
    for (int k = EV_ID; k <= EV_PAYLOAD; k++) {
        const Value *v = &w->slots[k].value;
        if ((k == EV_AGGREGATE_TYPE || k == EV_EVENT_TYPE) && v->kind == K_STRING
            && !v->escaped) {
            fields[k] = outbox_repeated_text(&self->outbox, k == EV_EVENT_TYPE,
                                             (const char *)v->s, v->n);
            if (fields[k] == NULL)
                return PyErr_Occurred() ? -1 : 1;
        }
        else if ((status = text_of(v, k == EV_PAYLOAD, &fields[k])) != 0)
            return status;
    }
    return 0;
}

/* The carried texts into fields[EV_EXTRA..EV_TRACESTATE]: 0, 1 to decline, -1. */
static int build_carried(const Want *w, PyObject **fields)
{
    const Slot *carried = &w->slots[NFIELDS];
    PyObject *extras = PyTuple_New(w->nextras), *item;
    int status;
    if (extras == NULL)
        return -1;
    fields[EV_EXTRA] = extras;
    for (Py_ssize_t j = 0; j < w->nextras; j++) {
        if ((status = carried_text(&carried[j], &item)) != 0)
            return status; /* a partly filled tuple: its NULL items are skipped */
        PyTuple_SET_ITEM(extras, j, item);
    }
    for (int j = 0; j < NTRACE; j++)
        if ((status = carried_text(&carried[w->nextras + j], &fields[EV_TRACEPARENT + j])) != 0)
            return status;
    return 0;
}

/* The row's OutboxEvent; Py_None when a value is not of the kind the fast path takes. */
static PyObject *build(Reader *self, PyObject *wal_start)
{
    PyObject *fields[EV_FIELDS] = {NULL};
    int status;
    /* created_at first: a declined timestamp then costs no other object */
    if ((status = created_at_of(self, &fields[EV_CREATED_AT_MS])) != 0
        || (status = build_mapped(self, fields)) != 0
        || (status = build_carried(&self->want, fields)) != 0) {
        outbox_discard(fields);
        return status < 0 ? NULL : Py_NewRef(Py_None);
    }
    fields[EV_LSN] = Py_NewRef(wal_start);
    return outbox_event(&self->outbox, fields);
}

static int utf8_of(PyObject *obj, const char **text, Py_ssize_t *n)
{
    if (!PyUnicode_Check(obj)) {
        PyErr_SetString(PyExc_TypeError,
                        "Reader(): schema, table, names, extras and trace must be str");
        return -1;
    }
    *text = PyUnicode_AsUTF8AndSize(obj, n);
    return *text == NULL ? -1 : 0;
}

/* (schema, table, *names, *extras, *trace), or NULL. */
static PyObject *reader_texts(PyObject *schema, PyObject *table, PyObject *names,
                              PyObject *extras, PyObject *trace)
{
    if (PyTuple_GET_SIZE(names) != NFIELDS || PyTuple_GET_SIZE(trace) != NTRACE) {
        PyErr_SetString(PyExc_TypeError,
                        "Reader(): names must be a tuple of 6 str, trace a tuple of 2 str");
        return NULL;
    }
    PyObject *parts[] = {PyTuple_Pack(2, schema, table), names, extras, trace};
    PyObject *all = parts[0];
    for (int i = 1; i < 4 && all != NULL; i++) {
        PyObject *longer = PySequence_Concat(all, parts[i]);
        Py_SETREF(all, longer);
    }
    return all;
}

static int reader_init(Reader *self, PyObject *args, PyObject *kwargs)
{
    PyObject *schema, *table, *names, *extras, *trace, *event_class;
    int timestamped;
    static char *keywords[] = {"schema", "table", "names", "timestamped", "extras", "trace",
                               "event_class", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UUO!pO!O!O:Reader", keywords, &schema,
                                     &table, &PyTuple_Type, &names, &timestamped,
                                     &PyTuple_Type, &extras, &PyTuple_Type, &trace,
                                     &event_class))
        return -1;
    if (outbox_setup(&self->outbox, event_class) < 0)
        return -1;
    PyObject *all = reader_texts(schema, table, names, extras, trace);
    if (all == NULL)
        return -1;
    Py_XSETREF(self->texts, all);
    Py_CLEAR(self->plan);
    Py_CLEAR(self->carried);
    self->ncols = -1;
    self->timestamped = timestamped;
    Want *w = &self->want;
    Py_ssize_t nslots = PyTuple_GET_SIZE(all) - 2;
    PyMem_Free(w->slots);
    w->slots = PyMem_Calloc((size_t)nslots, sizeof(Slot));
    w->nslots = 0; /* until every name is read */
    if (w->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (utf8_of(schema, &w->schema, &w->schema_n) < 0
        || utf8_of(table, &w->table, &w->table_n) < 0)
        return -1;
    for (Py_ssize_t k = 0; k < nslots; k++) {
        Slot *slot = &w->slots[k];
        if (utf8_of(PyTuple_GET_ITEM(all, k + 2), &slot->name, &slot->name_n) < 0)
            return -1;
        slot->at = -1;
    }
    w->nextras = PyTuple_GET_SIZE(extras);
    w->nslots = nslots;
    w->planned = 0;
    w->nabsent = 0;
    return 0;
}

/* ``n`` positions from ``plan`` into the slots from ``first`` on (all -1 for an empty
 * tuple when ``empty_ok``). */
static int read_positions(Want *w, PyObject *plan, Py_ssize_t first, Py_ssize_t n,
                          int empty_ok)
{
    if (!PyTuple_Check(plan) || (PyTuple_GET_SIZE(plan) != n
                                 && !(empty_ok && PyTuple_GET_SIZE(plan) == 0))) {
        PyErr_SetString(PyExc_TypeError, "Reader.row(): plan must be a tuple of 6 int, "
                                         "carried () or a tuple of one int per carried name");
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = -1;
        if (PyTuple_GET_SIZE(plan) != 0) {
            i = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, k));
            if (i == -1 && PyErr_Occurred())
                return -1;
        }
        w->slots[first + k].at = i < 0 ? -1 : i;
    }
    return 0;
}

/* Read the plan tuples into the slots, unless they are the ones read last time. */
static int reader_plan(Reader *self, PyObject *plan, PyObject *carried)
{
    Want *w = &self->want;
    if (plan == self->plan && carried == self->carried)
        return 0;
    Py_CLEAR(self->plan);
    Py_CLEAR(self->carried);
    if (read_positions(w, plan, 0, NFIELDS, 0) < 0
        || read_positions(w, carried, NFIELDS, w->nslots - NFIELDS, 1) < 0)
        return -1;
    w->planned = 0;
    w->nabsent = 0;
    for (Py_ssize_t k = 0; k < w->nslots; k++) {
        if (w->slots[k].at >= 0 && w->slots[k].at < MASK_BITS)
            w->planned |= (uint64_t)1 << w->slots[k].at;
        if (k >= NFIELDS && w->slots[k].at < 0)
            w->nabsent++;
    }
    self->plan = Py_NewRef(plan);
    self->carried = Py_NewRef(carried);
    return 0;
}

/* The plans (and the column count they are for) row(payload, wal_start) reads by. */
static int reader_set_plan(Reader *self, PyObject *plan, PyObject *carried, PyObject *ncols)
{
    if (self->texts == NULL || self->want.nslots == 0 || self->outbox.type == NULL) {
        PyErr_SetString(PyExc_TypeError, "Reader: the Reader is not initialised");
        return -1;
    }
    Py_ssize_t count = PyLong_AsSsize_t(ncols);
    if (count == -1 && PyErr_Occurred())
        return -1;
    if (reader_plan(self, plan, carried) < 0)
        return -1;
    self->ncols = count;
    return 0;
}

static PyObject *reader_row(Reader *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Py_ssize_t ncols = 0;
    Want *w = &self->want;
    if (nargs != 5 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "Reader.row() takes payload, wal_start[, plan, carried, ncols]");
        return NULL;
    }
    if (self->texts == NULL || w->nslots == 0 || self->outbox.type == NULL) {
        PyErr_SetString(PyExc_TypeError, "Reader.row(): the Reader is not initialised");
        return NULL;
    }
    if (nargs == 5 && reader_set_plan(self, args[2], args[3], args[4]) < 0)
        return NULL;
    if (self->plan == NULL) /* row(payload, wal_start) before any plan: the pure path */
        Py_RETURN_NONE;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not a contiguous buffer: the pure path decides */
        Py_RETURN_NONE;
    }
    for (Py_ssize_t k = 0; k < w->nslots; k++)
        w->slots[k].found = 0;
    Scan sc = {view.buf, (const unsigned char *)view.buf + view.len, 0};
    PyObject *result;
    if (scan_document(&sc, w, &ncols) < 0)
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    else if (ncols != self->ncols) /* another shape than the plans' (-1: none yet) */
        result = Py_NewRef(Py_None);
    else
        result = build(self, args[1]);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *reader_set_plan_method(Reader *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "Reader.set_plan() takes plan, carried and ncols");
        return NULL;
    }
    if (reader_set_plan(self, args[0], args[1], args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static void reader_dealloc(Reader *self)
{
    Py_CLEAR(self->texts);
    Py_CLEAR(self->plan);
    Py_CLEAR(self->carried);
    outbox_clear(&self->outbox);
    PyMem_Free(self->want.slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"row", (PyCFunction)(void (*)(void))reader_row, METH_FASTCALL,
     "row(payload, wal_start, plan, carried, ncols)\n--\n\n"
     "The OutboxEvent of one wal2json v2 message that is a common outbox insert of\n"
     "``ncols`` columns (lsn ``wal_start``), or None to leave the message to the\n"
     "pure-Python decoder. ``plan``: the positions of the six names in \"columns\";\n"
     "``carried``: those of the extras and trace names (-1: absent), or () for none;\n"
     "``ncols``: the column count both plans are for (-1: none yet). Without the\n"
     "three, the ones last given (here or to set_plan), or None before any."},
    {"set_plan", (PyCFunction)(void (*)(void))reader_set_plan_method, METH_FASTCALL,
     "set_plan(plan, carried, ncols)\n--\n\n"
     "The plans row(payload, wal_start) reads by, as row's last three arguments."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdc_relay.decoding._cwal2json.Reader",
    .tp_doc = PyDoc_STR("Reader(schema, table, names, timestamped, extras, trace, "
                        "event_class): reads one outbox table's common inserts into "
                        "event_class (OutboxEvent) instances (docs/design.md, \"The "
                        "compiled decoders\")."),
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cwal2json",
    "The compiled fast path of the wal2json decoder (docs/design.md).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cwal2json(void)
{
    return outbox_module(&module, &ReaderType, sizeof(Reader), (initproc)reader_init,
                         (destructor)reader_dealloc, reader_methods);
}
